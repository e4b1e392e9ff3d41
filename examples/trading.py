"""A seeded trading desk run through the kernel, end to end.

A strategist sets a mandate (the parent DecisionFlow); position agents trade
inside it (child flows) as market ticks arrive. The agents' "model" is
scripted from the seed and makes the mistakes real models make: quantities
in the wrong units, overconfident guesses, hesitation. The kernel validates
every proposal, sends low-confidence ones to a scripted operator, and
executes accepted orders exactly once on a simulated broker.

    python -m examples.trading --seed 7 --db trading.db
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from agents_sdk import Agent, Manifest, Proposal, WorkingContext
from kernel import (
    EscalationBudget,
    EscalationPolicy,
    ExecutionIntent,
    FlowStatus,
    Kernel,
    Receipt,
    SeededIds,
    open_kernel,
    verify_journal,
)
from policies.trading import TRADING, PlaceOrder, SetMandate

SYMBOLS = ("ACME", "GLOBEX", "INITECH")


def draw(seed: int, *parts: object) -> random.Random:
    """A random stream that depends only on the seed and the names given, never on scheduling."""
    digest = hashlib.sha256("/".join(map(str, (seed, *parts))).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


class Strategist(Agent):
    """Reads the news and sets the desk's mandate."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.manifest = Manifest(
            agent_id="strategist",
            version="1.0.0",
            capabilities=["trading.set_mandate"],
            subscriptions=["news"],
        )

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        headline = ctx.state.get("news.headline", "")
        return ctx.propose(
            SetMandate(symbols=list(SYMBOLS), max_notional="250000.00", horizon_minutes=60),
            explain=f"Headline {headline!r}: keep exposure moderate across the desk's symbols.",
            confidence=0.9,
        )


class PositionAgent(Agent):
    """Trades one market tick at a time, with a scripted model's habits and mistakes."""

    def __init__(self, agent_id: str, seed: int) -> None:
        self.seed = seed
        self.manifest = Manifest(
            agent_id=agent_id,
            version="1.0.0",
            capabilities=["trading.place_order"],
            subscriptions=["market"],
        )

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        rng = draw(self.seed, self.manifest.agent_id, ctx.dfid, ctx.attempt)
        symbol = ctx.topic.rsplit(".", 1)[-1]
        price = Decimal(ctx.state[f"market.{symbol}.price"])
        mood = rng.random()
        if mood < 0.1:
            return None  # nothing worth doing on this tick
        quantity = rng.randrange(5, 200)
        side = "buy" if rng.random() < 0.55 else "sell"
        limit = price * (Decimal("1.002") if side == "buy" else Decimal("0.998"))
        params: dict[str, Any] = {
            "kind": "trading.place_order",
            "symbol": symbol,
            "side": side,
            "quantity": quantity,
            "limit_price": str(limit.quantize(Decimal("0.01"))),
        }
        if mood < 0.2 and ctx.feedback is None:
            # The model's classic slip: quantity in words and units, not an integer.
            params["quantity"] = f"{quantity} shares"
        confidence = 0.35 if mood > 0.88 else round(0.6 + rng.random() * 0.39, 2)
        explain = f"{symbol} at {price}: {side} {quantity} with a limit of {params['limit_price']}."
        if ctx.feedback is not None:
            explain += f" Revised after {ctx.feedback.reason_code}."
        return ctx.propose(params, explain=explain, confidence=confidence, valid_for_s=30)


class SimBroker:
    """A simulated broker: fills limit orders and deduplicates on the idempotency key."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.fills: dict[str, Receipt] = {}
        self.calls = 0

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        self.calls += 1
        await anyio.lowlevel.checkpoint()  # the network
        if intent.key not in self.fills:
            order = PlaceOrder(**intent.params)
            self.fills[intent.key] = Receipt(
                external_id=f"fill-{len(self.fills) + 1:05d}",
                detail={
                    "symbol": order.symbol,
                    "quantity": order.quantity,
                    "price": order.limit_price,
                },
            )
        return self.fills[intent.key]


class Ledger:
    """Where mandates are filed."""

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        return Receipt(external_id=f"mandate-{intent.key[:8]}")


def operator_policy(flow_notional: Decimal) -> tuple[str, str]:
    """The scripted operator: approves modest orders, refuses large uncertain ones."""
    if flow_notional <= Decimal("10000"):
        return "override", "small and in mandate"
    return "abort", "too large for an uncertain call"


async def run(seed: int, db: Path, flows: int, progress: bool = True) -> dict[str, Any]:
    broker = SimBroker(seed)
    async with open_kernel(
        db,
        packs=[TRADING],
        adapters={"broker": broker, "ledger": Ledger()},
        allow=["strategist", "pm-1", "pm-2"],
        ids=SeededIds(seed),
        # The simulation compresses a trading day into seconds: a budget sized for
        # real hours (3 an hour) would demote the whole desk in the first minute.
        escalation=EscalationPolicy(budget=EscalationBudget(capacity=100, period_s=3600)),
    ) as kernel:
        await kernel.register(Strategist(seed))
        for name in ("pm-1", "pm-2"):
            await kernel.register(PositionAgent(name, seed))

        [mandate] = await kernel.trigger(
            "news.macro", {"news.headline": "Rates on hold"}, source="wire"
        )
        await kernel.wait_flow(mandate)
        market = draw(seed, "market")
        prices = {s: Decimal(market.randrange(50, 300)) for s in SYMBOLS}
        for tick in range(flows):
            # Mostly a calm market that waits for the desk; now and then a burst of
            # ticks lands while agents are still thinking (and their contexts go stale).
            if market.random() < 0.8:
                await kernel.wait_quiet()
            symbol = market.choice(SYMBOLS)
            move = Decimal(str(round(market.gauss(0, 0.01), 4)))
            prices[symbol] = (prices[symbol] * (1 + move)).quantize(Decimal("0.01"))
            await kernel.trigger(
                f"market.{symbol}",
                {f"market.{symbol}.price": str(prices[symbol])},
                source="feed",
                parent=mandate,
            )
            if tick % 10 == 9:
                await kernel.wait_quiet()
                await answer_escalations(kernel)
                if progress:
                    print(
                        f"  tick {tick + 1}/{flows}: {len(kernel.flows())} flows", file=sys.stderr
                    )
        await kernel.wait_quiet()
        await answer_escalations(kernel)
        await kernel.wait_quiet()
        return await summarize(kernel, broker, db)


async def answer_escalations(kernel: Kernel) -> None:
    for flow in kernel.flows(FlowStatus.ESCALATED):
        assert flow.proposal is not None
        params = flow.proposal.params
        notional = Decimal(params.get("limit_price", "0")) * int(params.get("quantity", 0))
        decision, reason = operator_policy(notional)
        await kernel.decide(flow.dfid, decision, operator="desk-operator", reason=reason)


async def summarize(kernel: Kernel, broker: SimBroker, db: Path) -> dict[str, Any]:
    events = await kernel.journal.read()
    reasons = Counter(
        str(e.payload.feedback.reason_code) for e in events if e.type == "ProposalRejected"
    )
    reasons.update(str(e.payload.reason_code) for e in events if e.type == "FlowAborted")
    decisions = Counter(e.payload.decision for e in events if e.type == "HumanDecided")
    closed = [
        f
        for f in kernel.flows(FlowStatus.CLOSED)
        if f.proposal and f.proposal.kind == "trading.place_order"
    ]
    return {
        "flows": dict(sorted(Counter(str(f.status) for f in kernel.flows()).items())),
        "reason_codes": dict(sorted(reasons.items())),
        "effects_executed": len(broker.fills),
        "adapter_calls": broker.calls,
        "duplicates_prevented": sum(1 for e in events if e.type == "DuplicateSuppressed"),
        "escalations": sum(1 for e in events if e.type == "FlowEscalated"),
        "human_decisions": dict(sorted(decisions.items())),
        "events": len(events),
        "example_flow": closed[0].dfid if closed else "",
        "db": str(db),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.trading", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--db", type=Path, help="journal file (default: a fresh temporary file)")
    parser.add_argument("--flows", type=int, default=200, help="market ticks to trade on")
    parser.add_argument(
        "--json", action="store_true", help="print the summary as JSON on the last line"
    )
    args = parser.parse_args(argv)
    db = args.db or Path(tempfile.mkdtemp(prefix="dirk-")) / "trading.db"
    if db.exists():
        print(f"error: {db} exists; pick a new --db path", file=sys.stderr)
        return 2
    summary = anyio.run(run, args.seed, db, args.flows, not args.json)
    report = anyio.run(verify_journal, db)
    summary["verified"] = report.ok
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"trading simulation, seed {args.seed}: {summary['events']} events in {db}")
    print(f"  flows by final state   {summary['flows']}")
    print(f"  reason codes           {summary['reason_codes']}")
    calls = summary["adapter_calls"]
    print(f"  effects executed       {summary['effects_executed']} ({calls} broker calls)")
    print(f"  duplicates prevented   {summary['duplicates_prevented']}")
    print(
        f"  escalations            {summary['escalations']}, decided {summary['human_decisions']}"
    )
    print(f"  journal verified       {report.ok} (head {report.head[:16]})")
    if summary["example_flow"]:
        print(f"inspect a flow:  dirk show {summary['example_flow']} --db {db}")
    print(f"verify the log:  dirk verify --db {db}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
