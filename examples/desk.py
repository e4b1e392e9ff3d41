"""The trading desk: its agents, its saga kind, its broker, and its operator.

Agents reason through the LLM port (:mod:`examples.llm`) and only propose.
The broker is the shipped :class:`~kernel.testing.SimulatedSystem` behind a
thin adapter that knows the live market (quotes, halts); the kernel alone
calls it. The operator is a scripted policy standing in for a human.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any, ClassVar, Protocol

import anyio
import msgspec

from agents_sdk import Agent, Manifest, Proposal, WorkingContext
from examples.llm import LanguageModel, ModelError, answer_of, conversation
from examples.market import SYMBOLS, Market
from kernel.adapters import AdapterError, ExecutionIntent, Quote, Receipt, SagaStep
from kernel.policy import DecimalStr, Monitor, OneOf, PolicyKind, PolicyPack, Range
from kernel.testing import SimulatedSystem
from policies.trading import INSTRUMENTS

MANDATE_NOTIONAL = "80000.00"
"""The strategist's mandate: the desk's cash pool, in dollars."""


class Rebalance(PolicyKind, tag="desk.rebalance"):
    """Sell ``sell_quantity`` of one symbol to fund a buy of another: a two-step saga.

    If the buy fails after the sell took effect, the sell is undone (bought back).
    """

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "broker"

    sell_symbol: str
    sell_quantity: int
    sell_limit: DecimalStr
    buy_symbol: str
    buy_quantity: int
    buy_limit: DecimalStr

    def steps(self) -> list[SagaStep]:
        sell = {"symbol": self.sell_symbol, "quantity": self.sell_quantity}
        buy = {"symbol": self.buy_symbol, "quantity": self.buy_quantity}
        return [
            SagaStep(
                action="sell",
                params={**sell, "side": "sell", "limit_price": self.sell_limit},
                compensation={**sell, "side": "buy", "limit_price": self.sell_limit},
            ),
            SagaStep(
                action="buy",
                params={**buy, "side": "buy", "limit_price": self.buy_limit},
                compensation={**buy, "side": "sell", "limit_price": self.buy_limit},
            ),
        ]


REFUSALS = Monitor(
    name="refusals",
    metric="refusal_rate",
    reasons=("SCHEMA_INVALID",),
    window_s=20 * 60,
    bound=0.4,
    min_samples=8,
    action="demote",
)
"""The desk's drift monitor: an agent more than 40% of whose verdicts over the last 20
minutes (eight at least) refuse a malformed proposal (SCHEMA_INVALID) is demoted to
PASSIVE until an operator restores it. Only malformed proposals count: refusals for
cash that waiting escalations hold (what ``--operator none`` piles up) are not the
agent's drift. A position agent's one scripted slip stays far under it; the hedger's
bad model update does not (examples.trading)."""

DESK = PolicyPack(
    name="desk",
    version="0.3.0",
    kinds=(Rebalance,),
    escalate_below_confidence=0.6,
    invariants=(
        OneOf(Rebalance, "sell_symbol", INSTRUMENTS),
        OneOf(Rebalance, "buy_symbol", INSTRUMENTS),
        Range(Rebalance, "sell_quantity", min=1, max=10_000),
        Range(Rebalance, "buy_quantity", min=1, max=10_000),
    ),
    monitors=(REFUSALS,),
)
"""The example's own pack: the rotation saga and the desk's drift monitor, beside the
shipped trading pack.

0.3.0 adds the monitor; :mod:`examples.desk_0_2` keeps 0.2.0 (limits typed as
DecimalStr) and :mod:`examples.desk_0_1` 0.1.0, for old journals.
"""


class LiveMarket(Protocol):
    """What the broker sees of a market: live prices and halts."""

    @property
    def live(self) -> Mapping[str, Decimal]: ...

    def is_halted(self, symbol: str) -> bool: ...


class Broker:
    """The broker adapter: the simulated system's ledger, plus the live market's view.

    Quotes come from the live price (ahead of the feed in a gap); a halted symbol is
    refused for good (a 4xx, no effect), which is what fails a saga's second leg.
    """

    def __init__(self, system: SimulatedSystem, market: Market | LiveMarket) -> None:
        self.system = system
        self.market = market
        self.retry_policy = system.retry_policy

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        symbol = str(intent.params.get("symbol", ""))
        if not intent.compensation and self.market.is_halted(symbol):
            raise AdapterError(f"400 trading in {symbol} is halted", transient=False)
        return await self.system.execute(intent)

    async def quote(self, intent: ExecutionIntent) -> Quote:
        symbol = str(intent.params.get("symbol", ""))
        price = self.market.live.get(symbol)
        state = "halted" if self.market.is_halted(symbol) else "open"
        return Quote(price=str(price) if price is not None else None, market_state=state)

    def positions(self) -> dict[str, int]:
        """Net units per symbol from the broker's own ledger of fills."""
        held = dict.fromkeys(SYMBOLS, 0)
        for _key, _kind, params in self.system.ledger():
            sign = 1 if params.get("side") == "buy" else -1
            symbol = str(params.get("symbol", ""))
            if symbol in held:
                held[symbol] += sign * int(params.get("quantity", 0))
        return held


class Stall:
    """A model endpoint's latency that the simulation controls: one slow answer on cue.

    When armed, the next reasoning step signals ``stalled`` and waits for
    ``resume``; meanwhile the driver publishes new prices, so the step's context
    is stale by the time it proposes.
    """

    def __init__(self) -> None:
        self.armed = False
        self.stalled = anyio.Event()
        self.resume = anyio.Event()

    async def wait_if_armed(self) -> None:
        if self.armed:
            self.armed = False
            self.stalled.set()
            await self.resume.wait()
            self.stalled, self.resume = anyio.Event(), anyio.Event()


class DeskAgent(Agent):
    """An agent of the desk: builds a task, asks the model, turns the answer into a proposal."""

    role: ClassVar[str] = ""
    system_prompt: ClassVar[str] = ""

    def __init__(
        self, manifest: Manifest, model: LanguageModel, task: Callable[[WorkingContext], Any]
    ) -> None:
        self.manifest = manifest
        self.model = model
        self.task = task
        self.stall = Stall()
        self.sent: dict[str, Proposal] = {}

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        task = {"task": self.role, "id": ctx.dfid, "attempt": ctx.attempt, **self.task(ctx)}
        if ctx.feedback is not None:
            task["feedback"] = {
                "reason_code": str(ctx.feedback.reason_code),
                "detail": ctx.feedback.detail,
                "field": ctx.feedback.field,
            }
        await self.stall.wait_if_armed()
        try:
            completion = await self.model.complete(conversation(self.system_prompt, task))
            answer = answer_of(completion)
        except ModelError:
            return None  # a model that cannot answer proposes nothing
        ctx.report_usage(tokens=completion.tokens)
        proposal = self.propose(ctx, answer)
        if proposal is not None:
            self.sent[ctx.dfid] = proposal
        return proposal

    def propose(self, ctx: WorkingContext, answer: dict[str, Any]) -> Proposal | None:
        """Turn the model's answer into a proposal (or None when it chose to do nothing)."""
        policy = answer.get("proposal")
        if not isinstance(policy, dict):
            return None
        confidence = answer.get("confidence", 0.5)
        minutes = answer.get("good_for_minutes", 2)
        return ctx.propose(
            policy,
            explain=str(answer.get("explain", "")),
            confidence=float(confidence) if isinstance(confidence, int | float) else 0.0,
            valid_for_s=float(minutes) * 60 if isinstance(minutes, int | float) else 0.0,
        )


def prices_of(ctx: WorkingContext) -> dict[str, str]:
    """The market prices the context shows, by symbol."""
    return {
        key.split(".")[1]: str(value)
        for key, value in ctx.state.items()
        if key.startswith("market.") and key.endswith(".price")
    }


def positions_of(ctx: WorkingContext) -> dict[str, int]:
    """The positions the context shows, by symbol."""
    return {
        key.split(".", 1)[1]: int(value)
        for key, value in ctx.state.items()
        if key.startswith("position.")
    }


class Strategist(DeskAgent):
    """Reads the news; sets the mandate and rotates the book between symbols."""

    role = "strategy"
    system_prompt = (
        "You are the strategist of a trading desk. Read the headline and answer JSON:"
        ' {"proposal": {"kind": "trading.set_mandate", ...} | {"kind": "desk.rebalance", ...}'
        ' | null, "confidence": 0..1, "explain": "..."}. Never place orders yourself.'
    )

    def __init__(self, model: LanguageModel) -> None:
        manifest = Manifest(
            agent_id="strategist",
            version="1.0.0",
            capabilities=["trading.set_mandate", "desk.rebalance"],
            subscriptions=["news", "market", "position"],
        )
        super().__init__(manifest, model, self._task)

    @staticmethod
    def _task(ctx: WorkingContext) -> dict[str, Any]:
        return {
            "headline": ctx.state.get("news.headline", ""),
            "prices": prices_of(ctx),
            "positions": positions_of(ctx),
            "mandate_notional": MANDATE_NOTIONAL,
            "symbols": list(SYMBOLS),
        }


class PositionAgent(DeskAgent):
    """Trades its symbols one signal at a time, within the mandate."""

    role = "trade"
    system_prompt = (
        "You trade within the desk's mandate. Given a symbol, its recent prices and your"
        ' position, answer JSON: {"proposal": {"kind": "trading.place_order", "symbol": ...,'
        ' "side": "buy"|"sell", "quantity": <int>, "limit_price": "<decimal>",'
        ' "max_slippage_bps": <int>} | null, "confidence": 0..1, "good_for_minutes": <n>,'
        ' "explain": "..."}. Revise if given feedback.'
    )

    def __init__(self, agent_id: str, symbols: Sequence[str], model: LanguageModel) -> None:
        manifest = Manifest(
            agent_id=agent_id,
            version="1.0.0",
            capabilities=["trading.place_order"],
            subscriptions=[*(f"signal.{s}" for s in symbols), "market", "position"],
            limits={"symbol": list(symbols)},
        )
        super().__init__(manifest, model, self._task)

    @staticmethod
    def _task(ctx: WorkingContext) -> dict[str, Any]:
        symbol = ctx.topic.rsplit(".", 1)[-1]
        return {
            "symbol": symbol,
            "price": str(ctx.state.get(f"market.{symbol}.price", "")),
            "history": list(ctx.state.get(f"signal.{symbol}.history", [])),
            "minute": ctx.state.get(f"signal.{symbol}.minute", 0),
            "position": int(ctx.state.get(f"position.{symbol}", 0)),
        }


class RiskAgent(DeskAgent):
    """Reviews exposure now and then and trims the largest position."""

    role = "risk"
    system_prompt = (
        "You are the desk's risk manager. Given prices and positions, answer JSON with an"
        " order that trims the largest exposure if it exceeds 20000 dollars, else"
        ' {"proposal": null}.'
    )

    def __init__(self, model: LanguageModel) -> None:
        manifest = Manifest(
            agent_id="risk",
            version="1.0.0",
            capabilities=["trading.place_order"],
            subscriptions=["risk", "market", "position"],
        )
        super().__init__(manifest, model, self._task)

    @staticmethod
    def _task(ctx: WorkingContext) -> dict[str, Any]:
        return {"prices": prices_of(ctx), "positions": positions_of(ctx)}


class Hedger(DeskAgent):
    """Leans against the minute's move with a small order, one a minute, one attempt each.

    One attempt: a hedge that is refused is stale by the next minute, so it is not
    revised (``max_attempts=1``); the next minute brings the next hedge.
    """

    role = "hedge"
    system_prompt = (
        "You hedge the desk. Given the minute's symbol, its prices and the desk's"
        ' position, answer JSON: {"proposal": {"kind": "trading.place_order", ...},'
        ' "confidence": 0..1, "good_for_minutes": <n>, "explain": "..."}: a small order'
        " against the last move."
    )

    def __init__(self, model: LanguageModel) -> None:
        manifest = Manifest(
            agent_id="hedger",
            version="1.0.0",
            capabilities=["trading.place_order"],
            subscriptions=["hedge", "market", "position"],
            max_attempts=1,
        )
        super().__init__(manifest, model, self._task)

    @staticmethod
    def _task(ctx: WorkingContext) -> dict[str, Any]:
        minute = int(ctx.state.get("hedge.minute", 0))
        symbol = SYMBOLS[minute % len(SYMBOLS)]
        return {
            "symbol": symbol,
            "minute": minute,
            "price": str(ctx.state.get(f"market.{symbol}.price", "")),
            "position": int(ctx.state.get(f"position.{symbol}", 0)),
        }


class OperatorPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """The scripted human: approves modest orders, rejects large ones."""

    approve_up_to: Decimal = Decimal("35000")

    def decide(self, params: dict[str, Any]) -> tuple[str, str]:
        """Return (decision, reason) for an escalated order's parameters."""
        try:
            notional = Decimal(str(params.get("limit_price"))) * int(params.get("quantity", 0))
        except (ArithmeticError, ValueError, TypeError):
            return "reject", "cannot tell what this order is worth"
        if notional <= self.approve_up_to:
            return "approve", f"notional {notional:.2f} is within what I sign off"
        return "reject", f"notional {notional:.2f} is too large without the head of desk"
