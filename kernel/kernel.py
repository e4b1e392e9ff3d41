"""The Kernel: wiring, the supervision tree, and the API an agent process embeds.

::

    async with open_kernel("dir.db", packs=[TRADING], adapters={"broker": broker},
                           allow=["trader"]) as kernel:
        await kernel.register(Trader())
        dfids = await kernel.trigger("market.ACME", {"market.ACME.price": "101.25"})
        flow = await kernel.wait_flow(dfids[0])

Data flows one way: trigger -> context compiler -> agent (user space) -> DIM
-> (escalation) -> execution -> journal, and every arrow is a message between
supervised actors. The kernel itself only routes calls from the embedding
code into mailboxes and waits for their durable answers.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import random
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from decimal import Decimal
from os import PathLike
from typing import Any, Protocol, TypeVar

import anyio
from anyio.abc import TaskGroup

from kernel import events
from kernel.actors import (
    ChildSpec,
    Mailbox,
    MailboxClosed,
    Outbox,
    Reply,
    RestartIntensityExceeded,
    Supervisor,
)
from kernel.adapters import RetryPolicy
from kernel.amendments import AmendLimit, AmendmentInvalid
from kernel.context import ContextCompiler, FireTrigger
from kernel.contracts import (
    HandshakeRefused,
    Outcome,
    Proposal,
    ProposalInvalid,
    Session,
    Verdict,
    WorkingContext,
    to_record,
)
from kernel.escalation import Decide, Decision, EscalationManager, EscalationPolicy
from kernel.events import (
    Draft,
    Event,
    Feedback,
    FlowAborted,
    KernelStarted,
    LimitAmended,
    Manifest,
    PackRef,
    ProposalRecord,
)
from kernel.execution import Adapter, ExecutionEngine, Recover
from kernel.flow import FLOW_EVENTS, TERMINAL, FlowState, FlowStatus
from kernel.guard_runner import GUARD_TIMEOUT_S, GuardRunner
from kernel.inbox import poll as poll_inbox
from kernel.integrity import IntegrityModule, Validate, Withdraw
from kernel.journal import (
    Journal,
    JournalClosed,
    JournalError,
    JournalFaults,
    JournalWriteFailed,
    open_journal,
)
from kernel.memory import MEMORY_ADAPTER
from kernel.memory_pack import MemoryExecutor
from kernel.pack_loading import LoadPack
from kernel.packs import PackError, PolicyCatalog, PolicyPack
from kernel.ports import Clock, IdSource, RandomIds, SystemClock
from kernel.projection import AgentStatus, Projections, visible
from kernel.reasoning import UsageMeter, metered
from kernel.reasons import ReasonCode
from kernel.registry import KERNEL_VERSION, Register, Registry, SetStatus
from kernel.replay import CHECKPOINT_EVERY, Checkpointer, restore
from kernel.rulebook import Promoter, RuleSearch
from kernel.telemetry import Telemetry

log = logging.getLogger("kernel")

T = TypeVar("T")


class AgentLike(Protocol):
    """What the kernel needs of an agent it hosts (agents_sdk.Agent provides it)."""

    manifest: Manifest

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        """Reason over ``ctx`` and propose (or return None to decline)."""
        ...


class KernelShutdown(Exception):
    """The kernel stopped (closed, restart intensity exceeded, or the journal failed)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class KernelFault(Exception):
    """A request the kernel could not carry out because an actor failed on it twice."""


_STOPPED = object()


class Kernel:
    """A running kernel; obtain one with :func:`open_kernel`."""

    def __init__(
        self,
        journal: Journal,
        projections: Projections,
        catalog: PolicyCatalog,
        adapters: Mapping[str, Adapter],
        clock: Clock,
        ids: IdSource,
        allow: Collection[str],
        agent_concurrency: int,
        max_in_flight: int,
        retry: RetryPolicy | None = None,
        jitter_seed: int | None = None,
        escalation: EscalationPolicy | None = None,
        token_budget: int | None = None,
        reasoning_timeout_s: float | None = None,
        guard_timeout_s: float = GUARD_TIMEOUT_S,
        rule_search: RuleSearch | None = None,
    ) -> None:
        self.journal = journal
        self.projections = projections
        self.catalog = catalog
        self.clock = clock
        self._adapter_names = frozenset(adapters)
        self._agent_concurrency = agent_concurrency
        self._max_in_flight = max_in_flight
        self._admitting = 0
        self._room: anyio.Event | None = None
        self._hosts: dict[str, Mailbox[WorkingContext]] = {}
        self._sessions: dict[str, Session] = {}
        self._pending: set[Reply[Any]] = set()
        self._waiters: dict[str, list[tuple[frozenset[FlowStatus], anyio.Event]]] = {}
        self._stop_reason: KernelShutdown | None = None
        self._quiet: anyio.Event | None = None
        self._agents_tg: TaskGroup | None = None
        self._effects_tg: TaskGroup | None = None
        self._token_budget = token_budget
        self._reasoning_timeout_s = reasoning_timeout_s
        # Tokens each flow's reasoning spent in earlier attempts (dropped when it stops reasoning).
        self._usage: dict[str, int] = {}
        self._checkpointer: Checkpointer | None = None
        self.promoter = Promoter(lambda: projections.memory.rulebook, journal.append)
        """Records rule proposals and decisions (shared with the memory executor)."""

        # A flow has at most one message on its way between actors at any time, so
        # mailboxes larger than the flows admitted at once can never fill up in a
        # cycle (compiler -> agent -> DIM -> compiler) and deadlock.
        capacity = 2 * max_in_flight + 64
        # One jitter source for every instance of the engine, so a restart does not
        # replay the same draws.
        jitter = random.Random(jitter_seed)
        self._capacity = capacity
        self.registry_mailbox: Mailbox[Any] = Mailbox("registry", capacity)
        self.compiler_mailbox: Mailbox[Any] = Mailbox("context", capacity)
        self.integrity_mailbox: Mailbox[Any] = Mailbox("integrity", capacity)
        self.escalation_mailbox: Mailbox[Any] = Mailbox("escalation", capacity)
        self.execution_mailbox: Mailbox[Any] = Mailbox("execution", capacity)
        self.guards_mailbox: Mailbox[Any] = Mailbox("guards", capacity)
        self.specs = [
            ChildSpec(
                "registry",
                lambda: Registry(projections, catalog, ids, allow),
                self.registry_mailbox,
            ),
            ChildSpec(
                "context",
                lambda: ContextCompiler(
                    projections, clock, ids, self._hosts, catalog.schemas, rule_search
                ),
                self.compiler_mailbox,
            ),
            ChildSpec(
                "integrity",
                lambda: IntegrityModule(
                    projections,
                    catalog,
                    clock,
                    self.compiler_mailbox,
                    self.escalation_mailbox,
                    self.execution_mailbox,
                    guards=self.guards_mailbox,
                ),
                self.integrity_mailbox,
            ),
            ChildSpec(
                "guards",
                lambda: GuardRunner(
                    catalog.guards_of,
                    catalog.kinds,
                    self.guards_mailbox,
                    self._spawn_effect,
                    guard_timeout_s,
                ),
                self.guards_mailbox,
            ),
            ChildSpec(
                "escalation",
                lambda: EscalationManager(
                    projections,
                    catalog,
                    clock,
                    self.integrity_mailbox,
                    self.execution_mailbox,
                    escalation,
                ),
                self.escalation_mailbox,
            ),
            ChildSpec(
                "execution",
                lambda: ExecutionEngine(
                    catalog,
                    adapters,
                    self.execution_mailbox,
                    self._spawn_effect,
                    projections=projections,
                    clock=clock,
                    rng=jitter,
                    retry=retry,
                    escalation=self.escalation_mailbox,
                ),
                self.execution_mailbox,
            ),
        ]

    # --- the embedding API -------------------------------------------------

    async def register(self, agent: AgentLike) -> Session:
        """Hand the agent's manifest to the registry and host the agent in this kernel.

        Raises:
            HandshakeRefused: with VERSION_MISMATCH, UNKNOWN_AGENT, AGENT_SUSPENDED, ...
        """
        session = await self.handshake(agent.manifest)
        agent_id = session.agent_id
        if agent_id not in self._hosts:
            mailbox: Mailbox[WorkingContext] = Mailbox(f"agent:{agent_id}", self._capacity)
            self._hosts[agent_id] = mailbox
            assert self._agents_tg is not None
            self._agents_tg.start_soon(self._host, agent, mailbox, name=f"agent:{agent_id}")
        self._sessions[agent_id] = session
        return session

    async def handshake(self, manifest: Manifest) -> Session:
        """Register a manifest without hosting the agent (it submits on its own).

        Raises:
            HandshakeRefused: when the registry refuses the manifest.
        """
        reply: Reply[Session | HandshakeRefused] = Reply()
        msg = Register(manifest=manifest, reply=reply)
        answer = await self._call(self.registry_mailbox, msg, reply)
        assert isinstance(answer, Session)  # _call raised a refusal
        return answer

    async def trigger(
        self,
        topic: str,
        facts: Mapping[str, Any] | None = None,
        *,
        source: str = "",
        parent: str | None = None,
    ) -> list[str]:
        """Record that something happened; return the DFIDs of the flows it opened.

        ``facts`` update the state layer; every hosted ACTIVE agent subscribed to
        ``topic`` gets a new DecisionFlow (a child of ``parent`` when given). When
        ``max_in_flight`` flows are already moving, it waits for room first: the
        backpressure starts at the kernel's edge.
        """
        fan_out = sum(
            1
            for agent_id in self._hosts
            if (agent := self.projections.agents.get(agent_id)) is not None
            and visible(agent.manifest.subscriptions, topic)
        )
        while self._admitting + len(self.projections.moving) + fan_out > self._max_in_flight:
            if self._admitting + len(self.projections.moving) == 0:
                break  # a single trigger wider than the limit still goes through, alone
            self._raise_if_stopped()
            self._room = self._room or anyio.Event()
            await self._room.wait()
        reply: Reply[list[str]] = Reply()
        msg = FireTrigger(
            topic=topic, facts=dict(facts or {}), source=source, parent_dfid=parent, reply=reply
        )
        self._admitting += fan_out
        try:
            return await self._call(self.compiler_mailbox, msg, reply)
        finally:
            self._admitting -= fan_out

    async def submit(
        self, token: str, dfid: str, proposal: Proposal | Mapping[str, Any] | bytes | str
    ) -> Verdict:
        """Submit a proposal for flow ``dfid``; return the verdict once it is durable."""
        invalid: Feedback | None = None
        try:
            record = to_record(proposal)
        except ProposalInvalid as exc:
            kind = proposal.get("kind") if isinstance(proposal, Mapping) else None
            record = ProposalRecord(kind=kind if isinstance(kind, str) else "")
            invalid = Feedback(
                reason_code=ReasonCode.SCHEMA_INVALID,
                detail=exc.detail[:500],
                layer="schema",
                field=exc.field,
            )
        reply: Reply[Verdict] = Reply()
        msg = Validate(dfid=dfid, proposal=record, token=token, invalid=invalid, reply=reply)
        return await self._call(self.integrity_mailbox, msg, reply)

    async def decide(
        self,
        dfid: str,
        decision: Decision | str,
        *,
        operator: str,
        reason: str,
        params: Mapping[str, Any] | None = None,
        action_hash: str | None = None,
    ) -> Verdict:
        """Give a human decision on an escalated flow: approve, modify or reject.

        ``override`` and ``abort`` are accepted for approve and reject. With
        ``action_hash`` (whole, or a prefix of 8 characters or more) the decision
        applies only if the flow still waits on that very action; otherwise it
        is refused with ACTION_MISMATCH. A late decision finds the approval
        expired (EXPIRED), and a flow not waiting for a human refuses it
        (FLOW_NOT_ACTIVE); every refusal is recorded.
        """
        reply: Reply[Verdict] = Reply()
        msg = Decide(
            dfid=dfid,
            decision=Decision(decision),
            operator=operator,
            reason=reason,
            params=dict(params) if params is not None else None,
            action_hash=action_hash,
            reply=reply,
        )
        return await self._call(self.escalation_mailbox, msg, reply)

    async def set_agent_status(
        self, agent_id: str, status: AgentStatus | str, *, operator: str, reason: str
    ) -> None:
        """Change an agent's status (an operator's act, recorded with who and why)."""
        reply: Reply[ReasonCode | None] = Reply()
        msg = SetStatus(
            agent_id=agent_id,
            status=AgentStatus(status),
            operator=operator,
            reason=reason,
            reply=reply,
        )
        code = await self._call(self.registry_mailbox, msg, reply)
        if code is not None:
            raise HandshakeRefused(code, f"no agent {agent_id!r}")

    async def amend_limit(
        self,
        agent_id: str,
        limit: str,
        value: int | str | Decimal,
        *,
        ttl_s: float,
        operator: str,
        reason: str,
    ) -> LimitAmended:
        """Set one of an agent's pack limits, within the pack's floor and ceiling, for ``ttl_s``.

        The DIM judges that agent with the amended value until it expires on the
        kernel's clock (see kernel.amendments). A refusal is recorded too.

        Raises:
            AmendmentInvalid: UNKNOWN_AGENT, UNKNOWN_LIMIT, LIMIT_OUT_OF_BOUNDS, SCHEMA_INVALID.
        """
        reply: Reply[Any] = Reply()
        msg = AmendLimit(
            agent_id=agent_id,
            limit=limit,
            value=value,
            ttl_s=ttl_s,
            operator=operator,
            reason=reason,
            reply=reply,
        )
        event = await self._call(self.integrity_mailbox, msg, reply)
        if not isinstance(event, LimitAmended):
            raise AmendmentInvalid(event.reason_code, event.detail)
        return event

    async def load_pack(self, pack: PolicyPack, *, operator: str = "", reason: str = "") -> PackRef:
        """Load a new version of a pack (or a new pack); record PackLoaded and judge with it.

        Flows already judged keep their verdicts. Loading the version in force records nothing.

        Raises:
            PackError: the pack is invalid (nothing changes), with the same message as at start.
        """
        reply: Reply[Any] = Reply()
        msg = LoadPack(
            pack=pack, adapters=self._adapter_names, operator=operator, reason=reason, reply=reply
        )
        answer = await self._call(self.integrity_mailbox, msg, reply)
        if isinstance(answer, PackError):
            raise answer
        return answer if answer is not None else pack.ref

    async def propose_rule(
        self,
        rule: str,
        *,
        title: str,
        content: str,
        operator: str,
        reason: str,
        labels: Sequence[str] = (),
        source: events.RuleSource | None = None,
        base_version: int = 0,
        override: bool = False,
    ) -> Event:
        """Propose a rule version as an operator; return the audited decision (RuleDecided).

        The proposal passes the promoter gate like an agent's (kernel.rulebook);
        with ``override`` the operator puts it in force at once, recorded as an
        override with their name and reason.
        """
        self._raise_if_stopped()
        proposal = events.RuleProposed(
            rule=rule,
            title=title,
            content=content,
            labels=list(labels),
            source=source or events.RuleSource(),
            base_version=base_version,
            proposer=operator,
            by_operator=True,
            reason=reason,
        )
        if override:
            return await self.promoter.override(proposal, operator=operator, reason=reason)
        _, decided = await self.promoter.propose(proposal)
        return decided

    async def decide_rule(
        self, proposal_seq: int, decision: str, *, operator: str, reason: str
    ) -> Event:
        """Override or skip a deferred rule proposal; return the audit record (RuleDecided).

        Raises:
            RuleNotPending: the proposal is not waiting for an operator.
            ValueError: another decision than override or skip, or no operator or reason.
        """
        self._raise_if_stopped()
        return await self.promoter.decide(proposal_seq, decision, operator=operator, reason=reason)

    def flow(self, dfid: str) -> FlowState | None:
        """Return the current state of a flow."""
        return self.projections.flows.get(dfid)

    def flows(self, status: FlowStatus | str | None = None) -> list[FlowState]:
        """Return every flow, or those in ``status``, oldest first."""
        flows = self.projections.flows.values()
        if status is not None:
            flows = [f for f in flows if f.status == status]  # type: ignore[assignment]
        return sorted(flows, key=lambda f: f.created_ts)

    async def wait_flow(
        self, dfid: str, until: Collection[FlowStatus] = TERMINAL | {FlowStatus.ESCALATED}
    ) -> FlowState:
        """Wait until flow ``dfid`` is in one of the ``until`` statuses, and return it."""
        targets = frozenset(until)
        while True:
            current = self.projections.flows.get(dfid)
            if current is not None and current.status in targets:
                return current
            self._raise_if_stopped()
            wake = anyio.Event()
            self._waiters.setdefault(dfid, []).append((targets, wake))
            await wake.wait()

    async def wait_quiet(self) -> None:
        """Wait until no flow moves on its own (every flow ended or waits for a human)."""
        while self.projections.moving:
            self._raise_if_stopped()
            self._quiet = self._quiet or anyio.Event()
            await self._quiet.wait()

    @property
    def stopped(self) -> KernelShutdown | None:
        """Why the kernel stopped, or None while it runs."""
        return self._stop_reason

    # --- internals ---------------------------------------------------------

    async def _call(self, mailbox: Mailbox[Any], msg: Any, reply: Reply[T]) -> T:
        self._raise_if_stopped()
        self._pending.add(reply)
        try:
            await mailbox.send(msg)
            answer = await reply.wait()
        finally:
            self._pending.discard(reply)
        if answer is _STOPPED:
            self._raise_if_stopped()
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _raise_if_stopped(self) -> None:
        if self._stop_reason is not None:
            raise self._stop_reason

    def _stop(self, reason: str, detail: str = "") -> None:
        """Stop accepting work and release everyone waiting on the kernel."""
        if self._stop_reason is not None:
            return
        self._stop_reason = KernelShutdown(reason, detail)
        for reply in list(self._pending):
            reply.set(_STOPPED)
        for waiters in self._waiters.values():
            for _, wake in waiters:
                wake.set()
        self._waiters.clear()
        for event in (self._quiet, self._room):
            if event is not None:
                event.set()

    def _on_commit(self, events: Sequence[Event]) -> None:
        self.projections.apply(events)
        if self._checkpointer is not None:
            self._checkpointer.observe(self.projections)
        if self._waiters:
            for event in events:
                if event.dfid is None or type(event.payload) not in FLOW_EVENTS:
                    continue
                waiters = self._waiters.get(event.dfid)
                if not waiters:
                    continue
                status = self.projections.flows[event.dfid].status
                keep = []
                for targets, wake in waiters:
                    if status in targets:
                        wake.set()
                    else:
                        keep.append((targets, wake))
                if keep:
                    self._waiters[event.dfid] = keep
                else:
                    del self._waiters[event.dfid]
        moving = len(self.projections.moving)
        if self._quiet is not None and not moving:
            self._quiet.set()
            self._quiet = None
        if self._room is not None and moving + self._admitting < self._max_in_flight:
            self._room.set()
            self._room = None

    def _spawn_effect(self, fn: Any) -> None:
        assert self._effects_tg is not None
        self._effects_tg.start_soon(fn)

    def _on_dead_letter(self, actor: str, msg: Any, exc: BaseException, out: Outbox) -> None:
        dfid = getattr(msg, "dfid", None)
        flow = out.flow(dfid) if isinstance(dfid, str) else None
        detail = f"actor {actor} failed twice on this flow: {type(exc).__name__}: {exc}"[:500]
        if flow is not None and not flow.terminal and flow.status is not FlowStatus.DIRTY:
            out.emit(
                FlowAborted(reason_code=ReasonCode.KERNEL_FAULT, detail=detail), dfid=flow.dfid
            )
        reply = getattr(msg, "reply", None)
        if isinstance(reply, Reply):
            if isinstance(dfid, str):
                feedback = Feedback(reason_code=ReasonCode.KERNEL_FAULT, detail=detail, layer=actor)
                out.reply(reply, Verdict(outcome=Outcome.ABORTED, dfid=dfid, feedback=feedback))
            else:
                out.reply(reply, KernelFault(detail))

    async def _host(self, agent: AgentLike, mailbox: Mailbox[WorkingContext]) -> None:
        # A fixed crew of reasoning tasks per agent: no task is spawned per flow.
        async with anyio.create_task_group() as tg:
            for n in range(self._agent_concurrency):
                tg.start_soon(self._reasoner, agent, mailbox, name=f"agent:{n}")

    async def _reasoner(self, agent: AgentLike, mailbox: Mailbox[WorkingContext]) -> None:
        while True:
            await self._reason(agent, await mailbox.receive())

    async def _reason(self, agent: AgentLike, ctx: WorkingContext) -> None:
        """Run one step of an agent's reasoning in user space and submit what it proposes."""
        token = self._sessions[ctx.agent_id].token

        async def withdraw(code: ReasonCode, detail: str) -> None:
            msg = Withdraw(
                dfid=ctx.dfid, token=token, attempt=ctx.attempt, reason_code=code, detail=detail
            )
            await self.integrity_mailbox.send(msg)

        meter = UsageMeter(ctx.dfid, self._token_budget, self._usage.pop(ctx.dfid, 0))
        try:
            try:
                proposal = await metered(
                    lambda: agent.decide(ctx),
                    meter,
                    self.clock,
                    self._reasoning_timeout_s,
                    self._spawn_beside_agents,
                )
            except Exception as exc:
                log.warning("agent %s failed on flow %s: %r", ctx.agent_id, ctx.dfid, exc)
                await withdraw(ReasonCode.AGENT_ERROR, f"{type(exc).__name__}: {exc}"[:500])
                return
            if meter.stopped is not None:
                # The computation budget cancelled the thought; the flow ends with the reason.
                await withdraw(*meter.stopped)
                return
            if proposal is None:
                await withdraw(ReasonCode.AGENT_DECLINED, "no action")
                return
            verdict = await self.submit(token, ctx.dfid, proposal)
            if verdict.outcome is Outcome.REJECTED and meter.tokens:
                self._usage[ctx.dfid] = meter.tokens  # the next attempt spends from the rest
        except KernelShutdown:
            return

    def _spawn_beside_agents(self, fn: Any) -> None:
        assert self._agents_tg is not None
        self._agents_tg.start_soon(fn)

    async def _poll_inbox(self, interval_s: float) -> None:
        """Run the operator inbox poller until the kernel stops."""
        try:
            await poll_inbox(
                self.journal.path,
                self.clock,
                interval_s,
                self.escalation_mailbox,
                self.projections,
                self._call,
                self.integrity_mailbox,
            )
        except (KernelShutdown, MailboxClosed):
            return


@asynccontextmanager
async def open_kernel(
    path: str | PathLike[str],
    *,
    packs: Sequence[PolicyPack],
    adapters: Mapping[str, Adapter],
    allow: Collection[str],
    clock: Clock | None = None,
    ids: IdSource | None = None,
    telemetry: Telemetry | None = None,
    synchronous: str = "FULL",
    agent_concurrency: int = 64,
    max_in_flight: int = 2048,
    max_restarts: int = 3,
    restart_period_s: float = 5.0,
    faults: JournalFaults | None = None,
    retry: RetryPolicy | None = None,
    jitter_seed: int | None = None,
    escalation: EscalationPolicy | None = None,
    inbox_poll_s: float | None = 1.0,
    token_budget: int | None = None,
    reasoning_timeout_s: float | None = None,
    checkpoint_every: int = CHECKPOINT_EVERY,
    guard_timeout_s: float = GUARD_TIMEOUT_S,
    rule_search: RuleSearch | None = None,
) -> AsyncIterator[Kernel]:
    """Open a kernel on the journal at ``path`` and run it for the body of the block.

    Args:
        path: the SQLite journal (created if missing).
        packs: the policy packs; the kernel refuses to start on an invalid one.
        adapters: the adapters by name; every policy kind's adapter must be present.
        allow: the agent ids allowed to register.
        clock: the time port (default: the system clock).
        ids: the DFID and token port (default: OS randomness).
        telemetry: span export (default: configured from the ``OTEL_*`` environment).
        synchronous: SQLite's synchronous setting; FULL is the durable default.
        agent_concurrency: flows one hosted agent reasons about at once.
        max_in_flight: flows moving at once; triggers wait for room beyond it.
        max_restarts: actor restarts allowed within ``restart_period_s``.
        restart_period_s: the window of the restart intensity.
        faults: fault injection for tests.
        retry: the retry policy of adapters without a ``retry_policy`` of their own.
        jitter_seed: seeds the backoff jitter (default: OS randomness).
        escalation: approval expiry, the escalation budget per agent and the silence
            watchdog (default: approvals expire after an hour, 3 escalations per agent
            per hour, no watchdog).
        inbox_poll_s: how often (on ``clock``) to read the operator inbox and tick the
            escalation manager; None: neither (decisions only through :meth:`Kernel.decide`).
        token_budget: the most tokens one flow's reasoning may report spending in all
            attempts together (None: no cap).
        reasoning_timeout_s: the longest one reasoning step may take on ``clock`` (None: no cap).
        checkpoint_every: events between projection checkpoints and snapshots (0: none).
        guard_timeout_s: how long a soft guard may take before its flow is flagged anyway.
        rule_search: how rules relevant to a flow are found for its context (default:
            lexical search; a vector search plugs in through the same port).

    Raises:
        PackError: on an invalid policy pack or a missing adapter.
        JournalError: when the journal cannot be opened (corrupt, foreign, too new).
        KernelShutdown: when the kernel had to stop (restart intensity, journal failure).
    """
    catalog = PolicyCatalog(packs)
    # The memory executor is built in: it records memory events in this journal.
    missing = [
        name
        for name in catalog.adapters_needed()
        if name not in adapters and name != MEMORY_ADAPTER
    ]
    if missing:
        raise PackError(f"no adapter registered for {', '.join(missing)}")
    clock = clock or SystemClock()
    telemetry = telemetry if telemetry is not None else Telemetry.from_env()
    async with open_journal(path, clock=clock, synchronous=synchronous, faults=faults) as journal:
        # The latest snapshot that matches its checkpoint, then the events after it.
        projections = await restore(journal)
        # One promoter for agents' rule proposals (the memory executor) and operators'.
        promoter = Promoter(lambda: projections.memory.rulebook, journal.append)
        if MEMORY_ADAPTER in catalog.adapters_needed() and MEMORY_ADAPTER not in adapters:
            adapters = {
                **adapters,
                MEMORY_ADAPTER: MemoryExecutor(projections, journal.append, promoter),
            }
        # What replay built lives as long as the kernel: keep the collector off it.
        gc.freeze()
        kernel = Kernel(
            journal,
            projections,
            catalog,
            adapters,
            clock,
            ids or RandomIds(),
            allow,
            agent_concurrency,
            max_in_flight,
            retry,
            jitter_seed,
            escalation,
            token_budget,
            reasoning_timeout_s,
            guard_timeout_s,
            rule_search,
        )
        kernel.promoter = promoter
        if checkpoint_every > 0:
            kernel._checkpointer = Checkpointer(checkpoint_every, journal.head_seq)
        journal.set_guard(projections.guard)
        journal.add_listener(kernel._on_commit)
        await journal.append(
            [Draft(payload=KernelStarted(kernel_version=KERNEL_VERSION, packs=catalog.refs()))]
        )
        await _abort_interrupted(journal, projections)
        supervisor = Supervisor(
            kernel.specs,
            append=journal.append,
            projections=projections,
            clock=clock,
            on_dead_letter=kernel._on_dead_letter,
            max_restarts=max_restarts,
            period_s=restart_period_s,
            fatal=(JournalError,),
        )
        failure: KernelShutdown | None = None
        body_error: Exception | None = None
        exported = [journal.head_seq]
        if telemetry.enabled:
            # Flows an earlier run left open: their spans need their beginnings too.
            for flow in list(projections.flows.values()):
                if not flow.terminal:
                    telemetry.emit(await journal.read(stop=exported[0] + 1, dfid=flow.dfid))
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_supervise, kernel, supervisor, name="supervisor")
                if inbox_poll_s is not None:
                    tg.start_soon(kernel._poll_inbox, inbox_poll_s, name="operator-inbox")
                if kernel._checkpointer is not None:
                    tg.start_soon(kernel._checkpointer.run, journal, name="checkpoints")
                if telemetry.enabled:
                    tg.start_soon(_export, telemetry, journal, exported, name="telemetry")
                async with (
                    anyio.create_task_group() as agents_tg,
                    anyio.create_task_group() as effects_tg,
                ):
                    kernel._agents_tg = agents_tg
                    kernel._effects_tg = effects_tg
                    # What an earlier run left between acceptance and a recorded end.
                    kernel.execution_mailbox.send_nowait(Recover())
                    try:
                        yield kernel
                    except Exception as exc:
                        # Re-raised outside the task groups: the caller sees it, not a group.
                        body_error = exc
                    finally:
                        agents_tg.cancel_scope.cancel()
                        effects_tg.cancel_scope.cancel()
                kernel._stop("KERNEL_CLOSED")
                tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            stopped = [e for e in _leaves(group) if isinstance(e, KernelShutdown)]
            if not stopped:
                raise
            failure = stopped[0]
        finally:
            kernel._stop("KERNEL_CLOSED")
            for mailbox in [*(spec.mailbox for spec in kernel.specs), *kernel._hosts.values()]:
                mailbox.close()
            with anyio.CancelScope(shield=True):
                reason = failure.reason if failure else "KERNEL_CLOSED"
                detail = failure.detail if failure else ""
                with contextlib.suppress(JournalClosed, JournalWriteFailed):
                    # Not recordable when the journal failed or was closed under us.
                    await journal.append(
                        [Draft(payload=events.KernelStopped(reason=reason, detail=detail))]
                    )
                if telemetry.enabled:
                    # Spans of what committed after the exporter's last batch.
                    telemetry.emit(await journal.read(exported[0] + 1))
                    await anyio.to_thread.run_sync(telemetry.shutdown)
        if failure is not None:
            raise failure
        if body_error is not None:
            raise body_error


async def _abort_interrupted(journal: Journal, projections: Projections) -> None:
    """End the flows an earlier run left in memory (an agent thinking), saying so.

    Their reasoning died with that process; nothing was accepted, so there is
    nothing to resume, and a flow never just disappears.
    """
    interrupted = [
        projections.flows[dfid]
        for dfid in sorted(projections.moving)
        if projections.flows[dfid].status
        in (FlowStatus.CREATED, FlowStatus.ACTIVE, FlowStatus.VALIDATING)
    ]
    detail = "the kernel stopped while this flow was being reasoned about; it was not resumed"
    await journal.append(
        [
            Draft(
                payload=FlowAborted(reason_code=ReasonCode.INTERRUPTED, detail=detail),
                dfid=flow.dfid,
                parent_dfid=flow.parent_dfid,
                agent_id=flow.agent_id,
                caused_by=flow.last_seq,
            )
            for flow in interrupted
        ]
    )


async def _export(telemetry: Telemetry, journal: Journal, exported: list[int]) -> None:
    """Feed committed events to telemetry as they commit."""
    async with journal.subscribe(exported[0] + 1) as batches:
        async for batch in batches:
            telemetry.emit(batch)
            exported[0] = batch[-1].seq


async def _supervise(kernel: Kernel, supervisor: Supervisor) -> None:
    try:
        await supervisor.run()
    except RestartIntensityExceeded as exc:
        kernel._stop("RESTART_INTENSITY_EXCEEDED", str(exc))
        raise kernel._stop_reason from exc  # type: ignore[misc]
    except JournalError as exc:
        kernel._stop("JOURNAL_FAILED", str(exc))
        raise kernel._stop_reason from exc  # type: ignore[misc]


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            leaves.extend(_leaves(exc))
        else:
            leaves.append(exc)
    return leaves
