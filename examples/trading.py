"""A seeded trading desk run through the kernel, end to end.

A strategist reads the news and sets a mandate (the parent DecisionFlow);
position agents trade their symbols inside it (child flows) as signals
arrive; a risk agent trims exposure; a scripted operator answers escalations.
Agents reason through the LLM port (a seeded scripted model by default) and
make the mistakes models make; the kernel validates every proposal, reserves
the desk's cash for open buys, escalates, and executes accepted orders exactly
once on a simulated broker that is slow, flaky, loses answers and delivers
twice. The summary at the end is read from the journal.

    python -m examples.trading --seed 7 --db trading.db
"""

from __future__ import annotations

import argparse
import base64
import sys
from collections.abc import Awaitable, Callable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

import anyio

from examples.clock import MARKET_OPEN_NS, SimClock
from examples.desk import (
    DESK,
    MANDATE_NOTIONAL,
    Broker,
    DeskAgent,
    Hedger,
    OperatorPolicy,
    PositionAgent,
    RiskAgent,
    Stall,
    Strategist,
)
from examples.desk_mesh import (
    KERNEL_KEY,
    OWN_SERVER,
    BusUnusable,
    HostFailed,
    desk_server_config,
    hosted_desk,
    open_bus,
)
from examples.desk_model import playbooks
from examples.llm import ModelError, draw, open_model
from examples.market import MIN_MINUTES, OPERATOR_EVERY, Market, Plan, headline, plan_day
from examples.serving import RecordedMarket, Served
from examples.summary import (
    checkpoint_signing,
    journal_and_files,
    public_key_of,
    show,
    summarize,
)
from kernel import (
    AgentStatus,
    EscalationBudget,
    EscalationPolicy,
    FlowStatus,
    Kernel,
    KernelConfig,
    Outcome,
    Ports,
    Principal,
    Proposal,
    Session,
    Signing,
    Supervision,
    credential_verifier,
    keyring_problem,
    open_kernel,
)
from kernel.adapters import RetryPolicy
from kernel.audit import NoShadow, events, live_report, open_journal, redact, report_lines
from kernel.testing import Faults, SeededIds, SimulatedSystem
from policies.trading import TRADING
from policies.trading_0_5 import TRADING_0_5

BROKER_FAULTS = Faults(latency_s=(0.05, 0.4), transient=0.12, lost_answer=0.08, duplicate=0.15)
BROKER_RETRY = RetryPolicy(base_s=0.5, max_s=4.0, max_attempts=6)
OWNERS = {"pm-1": ("ACME", "GLOBEX"), "pm-2": ("INITECH",)}
AGENTS = ("strategist", *OWNERS, "risk", "hedger")
"""The desk's agents, in the order their sessions are made."""
DESK_OPERATORS = (("dana", ["risk"]), ("ed", ["desk-head"]))
"""The desk's humans and their roles: the two-person rule takes one of each."""
HEDGER = "hedger"
"""The agent whose model update degrades it mid-day (examples.market.drift_of)."""


def shadow_window(minutes: int) -> range:
    """The minutes the next pack version judges as a shadow: the day's middle half."""
    return range(max(1, minutes // 4), max(2, (3 * minutes) // 4))


def desk_credential(seed: int, agent_id: str) -> str:
    """The credential the example provisions for ``agent_id``: drawn from the seed.

    Only a simulation may do this: the run (its journal and projection hash) is then a
    function of the seed. A real operator issues credentials from the OS's randomness
    (``dirk agent AGENT --issue-credential``).
    """
    raw = draw(seed, "credential", agent_id).randbytes(32)
    return "dirk_" + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def sidecar(db: Path, name: str) -> Path:
    """Where a simulated system keeps its own ledger, beside the journal."""
    return db.with_name(f"{db.stem}.{name}.db")


class Thinker(Protocol):
    """What the driver reaches of an agent: its model's stall, and what it last proposed."""

    @property
    def stall(self) -> Stall: ...

    @property
    def sent(self) -> Mapping[str, Proposal]: ...


class Desk:
    """The simulation's driver: the market's minutes, the news, and the operator.

    One flow moves at a time (the driver waits for quiet after each trigger),
    so the run, and the journal, are a function of the seed.
    """

    def __init__(
        self,
        kernel: Kernel,
        clock: SimClock,
        market: Market,
        plan: Plan,
        broker: Broker,
        agents: Mapping[str, Thinker],
        sessions: dict[str, Session],
        operator: OperatorPolicy | None,
        progress: bool,
    ) -> None:
        self.kernel, self.clock, self.market, self.plan = kernel, clock, market, plan
        self.broker, self.agents, self.sessions = broker, agents, sessions
        self.operator = operator
        self.progress = progress
        self.mandate: str | None = None
        self.positions: dict[str, int] = {}
        self.resender: Callable[[str, str], Awaitable[None]] | None = None
        """How a resend goes out when the agents are hosted elsewhere (``--bus``)."""
        self.breach_told = False

    async def run(self) -> None:
        await self.kernel.trigger("feed", self.market.facts(), source="feed")
        opening = headline(self.market.seed, "macro", self.plan)
        [self.mandate] = await self.news(opening)
        mandate = self.kernel.flow(self.mandate)
        if mandate is not None and mandate.status is FlowStatus.CLOSED:
            # The mandate sizes the desk's cash pool (in cents) that open buys reserve.
            cents = int(Decimal(MANDATE_NOTIONAL) * 100)
            await self.kernel.trigger("book", {"capacity.cash:desk": cents}, source="mandate")
        shadowed = shadow_window(self.plan.minutes)
        for minute in range(1, self.plan.minutes):
            await self.shadow(minute, shadowed)
            await self.minute(minute)
            await self.hedge(minute)
            if minute % OPERATOR_EVERY == OPERATOR_EVERY - 1:
                await self.answer_escalations()
            if minute % 10 == 9:
                self.report(minute)
        await self.answer_escalations()
        await self.settle()

    async def shadow(self, minute: int, window: range) -> None:
        """Run the pack's next version as a shadow for part of the day (its report at the end).

        The shadow judges every order beside 0.4.0 and records only where it differs;
        it never reserves, escalates or executes: the day goes exactly as without it.
        """
        if minute == window.start:
            await self.kernel.load_shadow(
                TRADING_0_5, operator="dana", reason="risk committee's candidate: shadow first"
            )
        elif minute == window.stop:
            await self.kernel.retire_shadow(
                "trading", operator="dana", reason="enough evidence for the committee"
            )

    async def hedge(self, minute: int) -> None:
        """The hedger's minute: one small order; on its model's rollback, its restoration.

        Its model's update (``Plan.drift``) writes quantities as words: refused, one by one,
        until the desk's refusal monitor (``examples.desk.REFUSALS``) demotes it to
        PASSIVE and its hedges open no flow. When the update is rolled back, Ed reads the
        breach and restores the agent, by the same operator act as ``dirk agent hedger
        --set ACTIVE``; the monitor never restores an agent itself.
        """
        starts, _, rolled_back = self.plan.drift
        if minute < starts:
            return
        if minute == rolled_back and self._demoted():
            await self.kernel.set_agent_status(
                HEDGER,
                "ACTIVE",
                operator="ed",
                reason="drift breach read; hedge-model 2.0 rolled back to 1.0",
            )
            if self.progress:
                print(f"  minute {minute + 1}: ed restores {HEDGER}", file=sys.stderr)
        await self.kernel.trigger("hedge", {"hedge.minute": minute}, source="hedge")
        await self.settle()
        if self.progress and self._demoted() and not self.breach_told:
            self.breach_told = True
            print(f"  minute {minute + 1}: {await drift_line(self.kernel)}", file=sys.stderr)

    def _demoted(self) -> bool:
        agent = self.kernel.projections.agents.get(HEDGER)
        return agent is not None and agent.status is AgentStatus.PASSIVE

    async def minute(self, minute: int) -> None:
        self.clock.at_minute(minute)
        await self.kernel.trigger("feed", self.market.step(minute), source="feed")
        beat = self.plan.beats.get(minute)
        if beat == "rotation":
            # The broker halts the bought symbol; the feed (and the desk) learn it too late.
            self.market.halt(self.plan.rotation[1], minutes=3)
        if beat in ("injection", "rotation"):
            await self.news(headline(self.market.seed, beat, self.plan))
        symbol = self.plan.symbol_at(minute, self.market.mover(minute))
        owner = next(a for a, symbols in OWNERS.items() if symbol in symbols)
        if beat == "gap":
            self.market.gap(symbol)
        if beat == "stall":
            self.agents[owner].stall.armed = True
        facts = {
            f"signal.{symbol}.history": self.market.history[symbol],
            f"signal.{symbol}.minute": minute,
        }
        dfids = await self.kernel.trigger(
            f"signal.{symbol}", facts, source="signals", parent=self.mandate
        )
        await self.settle(self.agents[owner])
        if beat == "resend":
            await self.resend(owner, dfids)
        if minute % 15 == 14:
            await self.kernel.trigger("risk.review", source="risk", parent=self.mandate)
            await self.settle()
        await self.publish_positions()

    async def news(self, text: str) -> list[str]:
        dfids = await self.kernel.trigger(
            "news.wire", {"news.headline": text}, source="wire", parent=self.mandate
        )
        await self.settle()
        return dfids

    async def settle(self, thinker: Thinker | None = None) -> None:
        """Wait until nothing moves; if the thinker's model stalls, move the market meanwhile."""
        if thinker is not None and await self._stalls_before_quiet(thinker):
            # The model is slow; the feed publishes once more before it answers. (Once:
            # the stall's events are the agent's to renew, so asking again here would race it.)
            facts = self.market.step(self.market.minute, part=1)
            await self.kernel.trigger("feed", facts, source="feed")
            thinker.stall.resume.set()
        await self.kernel.wait_quiet()

    async def _stalls_before_quiet(self, thinker: Thinker) -> bool:
        stalled = False
        stall = thinker.stall.stalled
        async with anyio.create_task_group() as tg:

            async def quiet() -> None:
                await self.kernel.wait_quiet()
                tg.cancel_scope.cancel()

            async def slow() -> None:
                nonlocal stalled
                await stall.wait()
                stalled = True
                tg.cancel_scope.cancel()

            tg.start_soon(quiet)
            tg.start_soon(slow)
        return stalled

    async def resend(self, owner: str, dfids: list[str]) -> None:
        """The agent's client timed out and sends its last proposal again."""
        for dfid in dfids:
            if self.resender is not None:
                await self.resender(owner, dfid)
                continue
            proposal = self.agents[owner].sent.get(dfid)
            if proposal is not None:
                await self.kernel.submit(self.sessions[owner].token, dfid, proposal)
        await self.settle()

    async def publish_positions(self) -> None:
        positions = self.broker.positions()
        if positions != self.positions:
            self.positions = positions
            facts = {f"position.{s}": q for s, q in positions.items()}
            await self.kernel.trigger("book", facts, source="broker")

    async def answer_escalations(self) -> None:
        if self.operator is None:
            return
        for flow in self.kernel.flows(FlowStatus.ESCALATED):
            if flow.proposal is None:
                continue
            decision, reason = self.operator.decide(dict(flow.proposal.params))
            # The operator decides on the action they reviewed, named by its hash (as
            # `dirk decide --confirm` does): approving a HIGH_IMPACT action requires it.
            action = self.kernel.projections.approvals[flow.dfid].action_hash
            # Dana (risk) decides first; above the two-person size her approval is one of
            # two, and Ed (the desk head) gives the second. Their roles would come from the
            # kernel's keyring; the embedding API takes them as given.
            for operator, roles in DESK_OPERATORS:
                verdict = await self.kernel.decide(
                    flow.dfid,
                    decision,
                    operator=operator,
                    reason=reason,
                    action_hash=action,
                    roles=roles,
                )
                await self.settle()
                if verdict.outcome is not Outcome.ESCALATED or decision != "approve":
                    break

    def report(self, minute: int) -> None:
        if not self.progress:
            return
        flows = self.kernel.flows()
        closed = sum(f.status is FlowStatus.CLOSED for f in flows)
        waiting = sum(f.status is FlowStatus.ESCALATED for f in flows)
        print(
            f"  minute {minute + 1}/{self.plan.minutes}: {len(flows)} flows,"
            f" {closed} closed, {waiting} waiting for a human",
            file=sys.stderr,
            flush=True,
        )


async def simulate(
    seed: int,
    db: Path | str,
    minutes: int,
    llm: str,
    operator: str,
    progress: bool = True,
    files: Path | None = None,
    bus: str | None = None,
    bus_dir: Path | None = None,
    signing: Signing | None = None,
) -> None:
    """Run the desk for ``minutes`` simulated minutes, journaling into ``db``.

    With ``bus`` (a NATS URL, or ``"start"`` for a nats-server started here) the agents
    run in host processes of their own, started here, and reach the kernel only over the
    bus: the same day, the same decisions. The bus's principals' keys are in ``bus_dir``
    (default: beside the journal, ``<name>.bus``); a named server must have been started
    from the configuration ``--bus-config`` writes for this seed and directory.
    """
    files = files or Path(db)
    folder = bus_dir or bus_folder(files)
    # On the bus each agent's NATS user is the key its credential seeds.
    credentials = {name: desk_credential(seed, name) for name in AGENTS}
    async with open_bus(bus, folder, credentials) as url:
        await _simulate(seed, db, minutes, llm, operator, progress, files, url, folder, signing)


async def _simulate(
    seed: int,
    db: Path | str,
    minutes: int,
    llm: str,
    operator: str,
    progress: bool,
    files: Path,
    bus: str | None,
    folder: Path,
    signing: Signing | None,
) -> None:
    plan = plan_day(seed, minutes)
    model = open_model(llm, seed, playbooks(plan))
    clock = SimClock()
    market = Market(seed)
    broker_system = SimulatedSystem(
        sidecar(files, "broker"),
        seed=seed,
        faults=BROKER_FAULTS,
        sleep=clock.sleep,
        retry=BROKER_RETRY,
    )
    ledger = SimulatedSystem(sidecar(files, "ledger"), seed=seed, sleep=clock.sleep)
    broker = Broker(broker_system, market)
    agents: dict[str, DeskAgent] = {
        "strategist": Strategist(model),
        **{name: PositionAgent(name, symbols, model) for name, symbols in OWNERS.items()},
        "risk": RiskAgent(model),
        HEDGER: Hedger(model),
    }
    try:
        async with open_kernel(
            db,
            packs=[TRADING, DESK],
            adapters={"broker": broker, "ledger": ledger},
            allow=list(agents),
            config=KernelConfig(
                # This host vouches for one local user: every flow acts on its behalf
                # (KernelConfig.principal; docs/identity.md).
                principal=Principal(tenant="local", user="local"),
                ports=Ports(clock=clock, ids=SeededIds(seed), jitter_seed=seed),
                supervision=Supervision(inbox_poll_s=None),
                escalation=EscalationPolicy(budget=EscalationBudget(capacity=100, period_s=3600)),
                bus=bus,
                bus_key=str(folder / KERNEL_KEY) if bus else None,
                signing=signing,
            ),
            # A simulated day in seconds: a budget sized for real hours would demote the desk.
        ) as kernel:
            # The operator provisions each agent's credential (recorded); every handshake shows it.
            credentials = {name: desk_credential(seed, name) for name in agents}
            for name, secret in credentials.items():
                verifier = credential_verifier(secret)
                await kernel.issue_credential(name, verifier, operator="dana", reason="desk")
            operator_policy = OperatorPolicy() if operator == "scripted" else None
            if bus is None:
                sessions = {
                    name: await kernel.register(agent, credential=credentials[name])
                    for name, agent in agents.items()
                }
                desk = Desk(
                    kernel, clock, market, plan, broker, agents, sessions, operator_policy, progress
                )
                await desk.run()
                return
            hosted = hosted_desk(
                bus,
                kernel.journal.journal_id,
                credentials,
                folder=folder,
                seed=seed,
                minutes=minutes,
                llm=llm,
            )
            async with hosted as (remote, resend):
                desk = Desk(
                    kernel, clock, market, plan, broker, remote, {}, operator_policy, progress
                )
                desk.resender = resend
                await desk.run()
    finally:
        broker_system.close()
        ledger.close()


def bus_folder(files: Path) -> Path:
    """Where a run keeps its bus principals' keys by default: beside the journal."""
    return files.with_name(f"{files.stem}.bus")


def serving(files: Path) -> Served:
    """The desk's parts for ``dirk serve --example trading``: its packs, agents and systems.

    The broker and the ledger reopen their ledgers beside ``files`` (as the run left
    them); the broker quotes the last prices the journal recorded.
    """
    broker_system = SimulatedSystem(sidecar(files, "broker"), retry=BROKER_RETRY)
    ledger = SimulatedSystem(sidecar(files, "ledger"))
    market = RecordedMarket()

    def close() -> None:
        broker_system.close()
        ledger.close()

    return Served(
        packs=[TRADING, DESK],
        adapters={"broker": Broker(broker_system, market), "ledger": ledger},
        allow=list(AGENTS),
        bind=market.bind,
        close=close,
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m examples.trading", description=__doc__.split("\n")[0]
    )
    p.add_argument("--seed", type=int, default=7, help="the seed of the whole run (default 7)")
    p.add_argument(
        "--db", help="journal file or postgresql:// URL (default: a fresh temporary file)"
    )
    p.add_argument(
        "--minutes",
        "--flows",
        dest="minutes",
        type=int,
        default=60,
        help=f"simulated market minutes, one signal each (at least {MIN_MINUTES}; default 60)",
    )
    p.add_argument("--llm", choices=("scripted", "openai"), default="scripted")
    p.add_argument("--operator", choices=("scripted", "none"), default="scripted")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on the last line")
    p.add_argument(
        "--bus",
        nargs="?",
        const=OWN_SERVER,
        metavar="URL",
        help="run each agent in a host process of its own, over NATS: at URL (a server started"
        " from the configuration --bus-config wrote for this seed), or, without URL, on a"
        " nats-server the example starts from that configuration",
    )
    p.add_argument(
        "--bus-dir",
        type=Path,
        help="the run's bus keys (the kernel's, the driver's, each host's), made here if missing"
        " (default: beside the journal, <name>.bus)",
    )
    p.add_argument(
        "--bus-config",
        metavar="HOST:PORT",
        help="make the run's bus keys, print the nats-server configuration for this seed"
        " (listening on HOST:PORT, its store in the bus directory) and exit",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    db, files = journal_and_files(args.db, "trading.db")
    if args.bus_config:
        return bus_config(args.seed, args.bus_dir or bus_folder(files), args.bus_config)
    taken = [p for p in (files, sidecar(files, "broker"), sidecar(files, "ledger")) if p.exists()]
    if taken:
        print(f"error: {taken[0]} exists; pick a new --db path", file=sys.stderr)
        return 2
    if args.minutes < MIN_MINUTES:
        print(f"error: --minutes must be at least {MIN_MINUTES}", file=sys.stderr)
        return 2
    unusable = keyring_problem()  # before any file is made: none is left half made
    if unusable is not None:
        print(f"error: BAD_ARGUMENT: {unusable}", file=sys.stderr)
        return 2
    where = ""
    if args.bus:
        named = "a nats-server of its own" if args.bus == OWN_SERVER else args.bus
        where = f" (agents in host processes over {named})"
    shown = redact(str(db))  # a postgresql:// URL without its password
    print(
        f"trading desk, seed {args.seed}, {args.minutes} minutes -> {shown}{where}", file=sys.stderr
    )
    try:
        signing = checkpoint_signing(files)
        anyio.run(
            simulate,
            args.seed,
            db,
            args.minutes,
            args.llm,
            args.operator,
            True,
            files,
            args.bus,
            args.bus_dir,
            signing,
        )
    except (ModelError, HostFailed, BusUnusable, BaseExceptionGroup) as exc:
        cause = failure(exc)
        if cause is None:
            raise
        print(f"error: {cause}", file=sys.stderr)
        return 2
    summary: dict[str, Any] = anyio.run(
        summarize, db, ("trading.place_order",), public_key_of(files)
    )
    show(f"trading desk, seed {args.seed}", summary, args.json)
    if not args.json:
        print("\n".join(anyio.run(shadow_lines, db)))
        print("\n".join(anyio.run(drift_lines, db)))
    return 0 if summary["verified"] else 1


async def drift_line(kernel: Kernel) -> str:
    """The hedger's last breach, as the journal holds it (the run's progress line)."""
    found = await kernel.journal.read(types=["DriftBreached"])
    breaches = [e for e in found if isinstance(e.payload, events.DriftBreached)]
    if not breaches:
        return f"{HEDGER} is PASSIVE"
    breach = breaches[-1].payload
    assert isinstance(breach, events.DriftBreached)
    return (
        f"drift monitor {breach.monitor} demotes {breach.subject} to PASSIVE:"
        f" {breach.metric} {breach.value:.2f} crossed {breach.bound:g} (seq {breaches[-1].seq})"
    )


def _minute(ts_ns: int) -> int:
    return (ts_ns - MARKET_OPEN_NS) // 60_000_000_000


async def drift_lines(db: Path | str) -> list[str]:
    """The day's drift breaches and the status changes around them, read from the journal."""
    async with open_journal(db, readonly=True) as journal:
        recorded = await journal.read(types=["DriftBreached", "AgentStatusChanged"])
    lines: list[str] = []
    for event in recorded:
        if isinstance(event.payload, events.DriftBreached):
            breach = event.payload
            lines.append(
                f"drift breach (seq {event.seq}): monitor {breach.monitor} of {breach.pack},"
                f" {breach.by} {breach.subject}: {breach.metric} {breach.value:.2f} crossed"
                f" {breach.bound:g} over {breach.samples} verdicts, seq"
                f" {breach.first_seq}..{breach.last_seq} in the"
                f" {(breach.window_end_ns - breach.window_start_ns) // 60_000_000_000} minutes"
                f" to minute {_minute(breach.window_end_ns) + 1}; action: {breach.action}"
            )
        elif isinstance(event.payload, events.AgentStatusChanged) and event.agent_id == HEDGER:
            change = event.payload
            lines.append(
                f"  {event.agent_id} {change.status} at minute {_minute(event.ts) + 1}"
                f" by {change.operator} (seq {event.seq}): {change.reason}"
            )
    return lines


async def shadow_lines(db: Path | str) -> list[str]:
    """The shadow report of the day (``dirk shadow report --db DB`` prints the same)."""
    async with open_journal(db, readonly=True) as journal:
        try:
            report = await live_report(journal)
        except NoShadow:
            return []
    return report_lines(report)


def failure(exc: BaseException) -> BaseException | None:
    """The failure the run reports in one line (a task group may wrap it), or None."""
    if isinstance(exc, ModelError | HostFailed | BusUnusable):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        return next((f for e in exc.exceptions if (f := failure(e)) is not None), None)
    return None


def bus_config(seed: int, folder: Path, listen: str) -> int:
    """Make the run's bus keys in ``folder`` and print the nats-server configuration."""
    credentials = {name: desk_credential(seed, name) for name in AGENTS}
    try:
        store = str(folder.resolve() / "js")
        text = desk_server_config(folder, credentials, listen=listen, store_dir=store)
    except (ValueError, OSError) as exc:  # KeyUnusable is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    print(f"keys in {folder}; start the server with this configuration", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
