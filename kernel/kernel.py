"""The Kernel: the actors' wiring and the API an agent process embeds.

::

    async with open_kernel("dir.db", packs=[TRADING], adapters={"broker": broker},
                           allow=["trader"]) as kernel:
        await kernel.register(Trader())
        dfids = await kernel.trigger("market.ACME", {"market.ACME.price": "101.25"})
        flow = await kernel.wait_flow(dfids[0])

Data flows one way: trigger -> context compiler -> agent (user space) -> DIM
-> (escalation) -> execution -> journal, and every arrow is a message between
supervised actors. The kernel itself only routes calls from the embedding
code into mailboxes and waits for their durable answers. Opening, running and
stopping one is :func:`kernel.boot.open_kernel`; hosting agents, kernel.hosting.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeVar

import anyio
from anyio.abc import TaskGroup

from kernel import events, inbox
from kernel.actors import ChildSpec, Mailbox, MailboxClosed, Outbox, Reply
from kernel.adapters import CallPool, RetryPolicy
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
from kernel.errors import KernelFault, KernelShutdown
from kernel.escalation import Decide, Decision, EscalationManager, EscalationPolicy
from kernel.events import (
    Event,
    Feedback,
    FlowAborted,
    LimitAmended,
    Manifest,
    PackRef,
    ProposalRecord,
)
from kernel.execution import Adapter, ExecutionEngine
from kernel.flow import FLOW_EVENTS, TERMINAL, FlowState, FlowStatus
from kernel.guard_runner import GUARD_TIMEOUT_S, GuardRunner
from kernel.hosting import AgentHost, AgentLike
from kernel.inbox import InboxRow
from kernel.integrity import IntegrityModule, Validate
from kernel.journal import Journal, JournalError
from kernel.pack_loading import LoadPack
from kernel.packs import PackError, PolicyCatalog, PolicyPack
from kernel.ports import Clock, IdSource
from kernel.projection import AgentStatus, Projections, fold, visible
from kernel.reasons import ReasonCode
from kernel.registry import Register, Registry, SetStatus
from kernel.replay import Checkpointer
from kernel.rulebook import Promoter, RuleNotPending, RuleSearch

T = TypeVar("T")


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
        *,
        promoter: Promoter,
    ) -> None:
        self.journal = journal
        self.projections = projections
        self.catalog = catalog
        self.clock = clock
        self._adapter_names = frozenset(adapters)
        self._max_in_flight = max_in_flight
        self._admitting = 0
        self._room: anyio.Event | None = None
        self._hosts: dict[str, Mailbox[WorkingContext]] = {}
        self._pending: set[Reply[Any]] = set()
        self._waiters: dict[str, list[tuple[frozenset[FlowStatus], anyio.Event]]] = {}
        self._stop_reason: KernelShutdown | None = None
        self._quiet: anyio.Event | None = None
        self._effects_tg: TaskGroup | None = None
        self._checkpointer: Checkpointer | None = None
        self.promoter = promoter
        """Records rule proposals and decisions (shared with the memory executor)."""

        # A flow has at most one message on its way between actors at any time, so
        # mailboxes larger than the flows admitted at once can never fill up in a
        # cycle (compiler -> agent -> DIM -> compiler) and deadlock.
        capacity = 2 * max_in_flight + 64
        # One jitter source for every instance of the engine, so a restart does not
        # replay the same draws.
        jitter = random.Random(jitter_seed)
        unsure: set[str] = set()  # keys of unknown outcome, kept across engine restarts
        self._capacity = capacity
        self.registry_mailbox: Mailbox[Any] = Mailbox("registry", capacity)
        self.compiler_mailbox: Mailbox[Any] = Mailbox("context", capacity)
        self.integrity_mailbox: Mailbox[Any] = Mailbox("integrity", capacity)
        self.escalation_mailbox: Mailbox[Any] = Mailbox("escalation", capacity)
        self.execution_mailbox: Mailbox[Any] = Mailbox("execution", capacity)
        self.guards_mailbox: Mailbox[Any] = Mailbox("guards", capacity)
        self.agents = AgentHost(
            submit=self.submit,
            integrity=self.integrity_mailbox,
            clock=clock,
            concurrency=agent_concurrency,
            token_budget=token_budget,
            reasoning_timeout_s=reasoning_timeout_s,
        )
        # Adapter calls run on kept worker tasks (shared by every engine instance); a
        # flow has at most one call at a time, so this many never makes one wait.
        adapter_calls = CallPool(self._spawn_effect, size=max_in_flight)
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
                    adapter_calls,
                    projections=projections,
                    clock=clock,
                    rng=jitter,
                    retry=retry,
                    escalation=self.escalation_mailbox,
                    unsure=unsure,
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
            self.agents.host(agent, mailbox)
        self.agents.sessions[agent_id] = session
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
        await self._recall(dfid)
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

        A flow escalated with OUTCOME_UNKNOWN (its effect may have happened)
        takes only ``reconcile`` (``params={"outcome": "done", "external_id":
        ...}`` or ``{"outcome": "not_done"}``: what the external system shows)
        or ``retry`` (call again with the same key); any other decision there
        is refused with OUTCOME_UNKNOWN.
        """
        await self._recall(dfid)
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
        """Return the current state of a flow: open, or among the ``keep_finished`` last ended.

        An older finished flow is not in memory: :meth:`wait_flow` reads it back
        from the journal.
        """
        return self.projections.flows.get(dfid)

    def flows(self, status: FlowStatus | str | None = None) -> list[FlowState]:
        """Return the open flows and the ``keep_finished`` last ended, oldest first.

        ``dirk flows`` lists every flow the journal holds.
        """
        flows = self.projections.flows.values()
        if status is not None:
            flows = [f for f in flows if f.status == status]  # type: ignore[assignment]
        return sorted(flows, key=lambda f: f.created_ts)

    def finished(self) -> dict[FlowStatus, int]:
        """Return how many flows ever ended, by final status (kept in memory or not)."""
        return {FlowStatus(status): n for status, n in self.projections.finished.items()}

    async def wait_flow(
        self, dfid: str, until: Collection[FlowStatus] = TERMINAL | {FlowStatus.ESCALATED}
    ) -> FlowState:
        """Wait until flow ``dfid`` is in one of the ``until`` statuses, and return it.

        A finished flow no longer in memory is read back from the journal.
        """
        targets = frozenset(until)
        while True:
            current = self.projections.flows.get(dfid)
            if current is None:
                current = await self._recall(dfid)
                if current is not None and current.status in targets:
                    return current
                current = self.projections.flows.get(dfid)  # it may have moved meanwhile
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

    async def _recall(self, dfid: str) -> FlowState | None:
        """Read a finished flow the projections forgot back from the journal, and keep it.

        Requests naming an old flow (a repeated submission, a late decision) are
        then answered from its record exactly as while it was kept. Returns the
        flow if it finished, else None (an open flow is always in memory).
        """
        self._raise_if_stopped()
        if dfid in self.projections.flows:
            return None
        try:
            folded = fold(await self.journal.flow_events(dfid))
        except JournalError:
            return None  # the request goes on, and is refused or finds the kernel stopped
        state = folded.flows.get(dfid)
        if state is None or not state.terminal:
            return None
        self.projections.recall(state, folded.approvals.get(dfid))
        return state

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
                current = self.projections.flows.get(event.dfid)
                if current is None:
                    continue  # a note on a finished flow the index forgot
                status = current.status
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
        if self._effects_tg.cancel_scope.cancel_called:
            # Stopping: what was not called yet is recorded as started, and the next
            # start resumes it (execution's Recover).
            return
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

    async def _poll_inbox(self, interval_s: float) -> None:
        """Run the operator inbox poller until the kernel stops."""

        async def decide(row: InboxRow) -> None:
            reply: Reply[Any] = Reply()
            await self._call(self.escalation_mailbox, inbox.to_decide(row, reply), reply)

        async def amend(row: InboxRow) -> None:
            reply: Reply[Any] = Reply()
            await self._call(self.integrity_mailbox, inbox.to_amend(row, reply), reply)

        async def agent_status(row: InboxRow) -> None:
            body = row.decision
            reply: Reply[ReasonCode | None] = Reply()
            msg = SetStatus(
                agent_id=str(body.get("agent_id", "")),
                status=AgentStatus(str(body.get("status", ""))),
                operator=str(body.get("operator", "")),
                reason=str(body.get("reason", "")),
                inbox_id=row.id,
                reply=reply,
            )
            await self._call(self.registry_mailbox, msg, reply)

        async def rule(row: InboxRow) -> None:
            body = row.decision
            try:
                await self.promoter.decide(
                    int(body.get("proposal_seq", 0)),
                    str(body.get("decision", "")),
                    operator=str(body.get("operator", "")),
                    reason=str(body.get("reason", "")),
                    inbox_id=row.id,
                )
            except RuleNotPending as exc:
                raise ValueError(str(exc)) from exc

        handlers = {
            inbox.DECIDE: decide,
            inbox.AMEND: amend,
            inbox.AGENT_STATUS: agent_status,
            inbox.RULE: rule,
        }
        try:
            await inbox.poll(
                self.journal.path,
                self.clock,
                interval_s,
                self.escalation_mailbox,
                self.projections,
                handlers,
            )
        except (KernelShutdown, MailboxClosed):
            return
