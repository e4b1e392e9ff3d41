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
stopping one is :func:`kernel.boot.open_kernel`; hosting agents, kernel.hosting._host.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeVar

import anyio
import msgspec
from anyio.abc import TaskGroup

from kernel import inbox
from kernel.adapters.contract import Adapter, CallPool
from kernel.config import KernelConfig
from kernel.context import ContextCompiler
from kernel.core import events, wall
from kernel.core.errors import KernelFault, KernelShutdown
from kernel.core.events import (
    DecisionRefused,
    Draft,
    Event,
    Feedback,
    FlowAborted,
    InputRefused,
    LimitAmended,
    Manifest,
    PackRef,
    ProposalRecord,
)
from kernel.core.flow import FLOW_EVENTS, TERMINAL, FlowState, FlowStatus
from kernel.core.ports import Clock, IdSource
from kernel.core.reasons import ReasonCode, StopReason
from kernel.core.wall import InputInvalid, clip
from kernel.dim import IntegrityModule
from kernel.escalation import EscalationManager
from kernel.execution import ExecutionEngine
from kernel.guards import GuardRunner
from kernel.hosting import AgentHost, AgentLike
from kernel.inbox import InboxRow
from kernel.journal.store import Journal, JournalError
from kernel.policy.contracts import (
    HandshakeRefused,
    Outcome,
    Proposal,
    ProposalInvalid,
    Session,
    Verdict,
    to_record,
)
from kernel.policy.packs import Impact, PackError, PolicyCatalog, PolicyPack
from kernel.registry import Registry
from kernel.runtime.actors import ChildSpec, Mailbox, MailboxClosed, Outbox, Reply
from kernel.runtime.messages import (
    AgentMessage,
    AmendLimit,
    CompilerMessage,
    Decide,
    Decision,
    DimMessage,
    EscalationMessage,
    ExecutionMessage,
    FireTrigger,
    GuardMessage,
    IssueCredential,
    LoadPack,
    Register,
    RegistryMessage,
    SetStatus,
    Validate,
)
from kernel.state.amendments import AmendmentInvalid
from kernel.state.approvals import APPROVE_WORDS
from kernel.state.projections import AgentStatus, Projections, fold, visible
from kernel.state.rulebook import Promoter, RuleNotPending
from kernel.state.snapshots import Checkpointer

M = TypeVar("M")
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
        allow: Collection[str],
        config: KernelConfig,
        *,
        clock: Clock,
        ids: IdSource,
        promoter: Promoter,
    ) -> None:
        limits = config.limits
        max_in_flight = limits.max_in_flight
        self.journal = journal
        self.projections = projections
        self.catalog = catalog
        self.clock = clock
        self._adapter_names = frozenset(adapters)
        self._max_in_flight = max_in_flight
        self._admitting = 0
        self._room: anyio.Event | None = None
        self._hosts: dict[str, Mailbox[AgentMessage]] = {}
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
        jitter = random.Random(config.ports.jitter_seed)
        unsure: set[str] = set()  # keys of unknown outcome, kept across engine restarts
        self._capacity = capacity
        self.registry_mailbox: Mailbox[RegistryMessage] = Mailbox("registry", capacity)
        self.compiler_mailbox: Mailbox[CompilerMessage] = Mailbox("context", capacity)
        self.integrity_mailbox: Mailbox[DimMessage] = Mailbox("integrity", capacity)
        self.escalation_mailbox: Mailbox[EscalationMessage] = Mailbox("escalation", capacity)
        self.execution_mailbox: Mailbox[ExecutionMessage] = Mailbox("execution", capacity)
        self.guards_mailbox: Mailbox[GuardMessage] = Mailbox("guards", capacity)
        self.agents = AgentHost(
            submit=self.submit,
            integrity=self.integrity_mailbox,
            clock=clock,
            concurrency=limits.agent_concurrency,
            token_budget=limits.token_budget,
            reasoning_timeout_s=limits.reasoning_timeout_s,
        )
        # Adapter calls run on kept worker tasks (shared by every engine instance); a
        # flow has at most one call at a time, so this many never makes one wait.
        adapter_calls = CallPool(self._spawn_effect, size=max_in_flight)
        self.specs: list[ChildSpec[Any]] = [
            ChildSpec[RegistryMessage](
                "registry",
                lambda: Registry(projections, catalog, ids, allow),
                self.registry_mailbox,
            ),
            ChildSpec[CompilerMessage](
                "context",
                lambda: ContextCompiler(
                    projections, clock, ids, self._hosts, catalog.schemas, config.ports.rule_search
                ),
                self.compiler_mailbox,
            ),
            ChildSpec[DimMessage](
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
            ChildSpec[GuardMessage](
                "guards",
                lambda: GuardRunner(
                    catalog.guards_of,
                    catalog.kinds,
                    self.guards_mailbox,
                    self._spawn_effect,
                    limits.guard_timeout_s,
                ),
                self.guards_mailbox,
            ),
            ChildSpec[EscalationMessage](
                "escalation",
                lambda: EscalationManager(
                    projections,
                    catalog,
                    clock,
                    self.integrity_mailbox,
                    self.execution_mailbox,
                    config.escalation,
                ),
                self.escalation_mailbox,
            ),
            ChildSpec[ExecutionMessage](
                "execution",
                lambda: ExecutionEngine(
                    catalog,
                    adapters,
                    self.execution_mailbox,
                    adapter_calls,
                    projections=projections,
                    clock=clock,
                    rng=jitter,
                    retry=config.retry,
                    escalation=self.escalation_mailbox,
                    unsure=unsure,
                ),
                self.execution_mailbox,
            ),
        ]

    # --- the embedding API -------------------------------------------------

    async def register(self, agent: AgentLike, *, credential: str | None = None) -> Session:
        """Hand the agent's manifest to the registry and host the agent in this kernel.

        ``credential`` is the secret the operator provisioned for the agent, if any
        (kernel.registry): once one is provisioned, every handshake must show it.

        Raises:
            HandshakeRefused: with VERSION_MISMATCH, UNKNOWN_AGENT, AGENT_SUSPENDED,
                CREDENTIAL_INVALID, ...
        """
        session = await self.handshake(agent.manifest, credential=credential)
        agent_id = session.agent_id
        if agent_id not in self._hosts:
            mailbox: Mailbox[AgentMessage] = Mailbox(f"agent:{agent_id}", self._capacity)
            self._hosts[agent_id] = mailbox
            self.agents.host(agent, mailbox)
        self.agents.sessions[agent_id] = session
        return session

    async def handshake(
        self, manifest: Manifest, *, credential: str | None = None, require_credential: bool = False
    ) -> Session:
        """Register a manifest without hosting the agent (it submits on its own).

        ``credential``: the agent's provisioned secret; ``require_credential`` refuses
        the handshake unless one is provisioned and shown (the bus asks for it).

        Raises:
            HandshakeRefused: when the registry refuses the manifest.
        """
        invalid: str | None = None
        if credential is not None and not isinstance(credential, str):
            credential = ""  # shown but unusable: refused as not the agent's own
        try:
            checked = wall.admit(manifest, wall.ManifestSpec)
            manifest = msgspec.convert(msgspec.to_builtins(checked), Manifest)
        except InputInvalid as exc:
            # Refused, and recorded under ids clipped to what the journal takes.
            agent_id = getattr(manifest, "agent_id", "")
            invalid = f"{exc.field}: {exc.detail}"
            if not isinstance(agent_id, str) or len(agent_id) > wall.MAX_ID:
                invalid += f" (the refusal records the agent id cut to {wall.MAX_ID} characters)"
            version = getattr(manifest, "version", "")
            manifest = Manifest(agent_id=clip(agent_id), version=clip(version, 64))
        reply: Reply[Session | HandshakeRefused] = Reply()
        msg = Register(
            manifest=manifest,
            reply=reply,
            invalid=invalid,
            credential=credential,
            require_credential=require_credential,
        )
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

        Raises:
            InputInvalid: a topic, fact or id of the wrong type, out of range or too long.
        """
        checked = wall.admit(
            wall.fields(
                topic=topic,
                facts=dict(facts) if isinstance(facts, Mapping) else facts or {},
                source=source,
                parent=parent,
            ),
            wall.TriggerSpec,
        )
        topic, facts, source, parent = checked.topic, checked.facts, checked.source, checked.parent
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
        if not isinstance(token, str) or not isinstance(dfid, str) or len(dfid) > wall.MAX_ID:
            # Nothing to name: no flow could have such an id, and the token is unchecked.
            feedback = Feedback(
                reason_code=ReasonCode.SCHEMA_INVALID,
                detail="the token and the DFID are strings, the DFID at most 256 characters",
                layer="schema",
                field="token" if not isinstance(token, str) else "dfid",
            )
            return Verdict(outcome=Outcome.REFUSED, dfid=clip(dfid), feedback=feedback)
        invalid: Feedback | None = None
        try:
            try:
                record = to_record(proposal)
            except RecursionError:
                raise InputInvalid("$", f"nested deeper than {wall.MAX_DEPTH} levels") from None
            wall.admit(record, wall.ProposalSpec)
        except (ProposalInvalid, InputInvalid) as exc:
            kind = proposal.get("kind") if isinstance(proposal, Mapping) else None
            record = ProposalRecord(kind=clip(kind) if isinstance(kind, str) else "")
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

        Every field is checked at the wall first: an operator and a reason are
        required (non-blank, bounded), and approving a HIGH_IMPACT action takes
        its ``action_hash``, as ``dirk decide --confirm`` does; a refusal there is
        SCHEMA_INVALID, recorded as DecisionRefused.

        A flow escalated with OUTCOME_UNKNOWN (its effect may have happened)
        takes only ``reconcile`` (``params={"outcome": "done", "external_id":
        ...}`` or ``{"outcome": "not_done"}``: what the external system shows)
        or ``retry`` (call again with the same key); any other decision there
        is refused with OUTCOME_UNKNOWN.
        """
        if isinstance(dfid, str) and len(dfid) <= wall.MAX_ID:
            await self._recall(dfid)
        try:
            checked = self._check_decision(dfid, decision, operator, reason, params, action_hash)
        except InputInvalid as exc:
            return await self._refuse_decision(dfid, decision, operator, exc)
        reply: Reply[Verdict] = Reply()
        msg = Decide(
            dfid=checked.dfid,
            decision=Decision(checked.decision),
            operator=checked.operator,
            reason=checked.reason,
            params=checked.params,
            action_hash=checked.action_hash,
            reply=reply,
        )
        return await self._call(self.escalation_mailbox, msg, reply)

    async def set_agent_status(
        self, agent_id: str, status: AgentStatus | str, *, operator: str, reason: str
    ) -> None:
        """Change an agent's status (an operator's act, recorded with who and why).

        Raises:
            InputInvalid: no operator or reason, or a field of the wrong type (recorded).
            HandshakeRefused: UNKNOWN_AGENT.
        """
        try:
            checked = self._check_status(
                wall.fields(agent_id=agent_id, status=status, operator=operator, reason=reason)
            )
        except InputInvalid as exc:
            await self._record_refusal("agent_status", exc, operator, target=agent_id)
            raise
        reply: Reply[ReasonCode | None] = Reply()
        msg = SetStatus(
            agent_id=checked.agent_id,
            status=AgentStatus(checked.status),
            operator=checked.operator,
            reason=checked.reason,
            reply=reply,
        )
        code = await self._call(self.registry_mailbox, msg, reply)
        if code is not None:
            raise HandshakeRefused(code, f"no agent {agent_id!r}")

    async def issue_credential(
        self, agent_id: str, verifier: str, *, operator: str, reason: str
    ) -> None:
        """Provision or rotate ``agent_id``'s credential from its verifier (recorded).

        Make the pair with :func:`kernel.registry.new_credential` and
        :func:`kernel.registry.credential_verifier`; give the secret to whoever runs the
        agent, and only the verifier to the kernel. Live sessions stay valid.

        Raises:
            InputInvalid: a field of the wrong type or too long.
            HandshakeRefused: UNKNOWN_AGENT (not allowed here) or SCHEMA_INVALID (no verifier).
        """
        fields = {"agent_id": agent_id, "verifier": verifier, "operator": operator}
        await self._issue_credential(inbox.check_credential(fields | {"reason": reason}))

    async def _issue_credential(
        self, fields: inbox.CredentialFields, inbox_id: int | None = None
    ) -> None:
        reply: Reply[ReasonCode | None] = Reply()
        msg = IssueCredential(
            agent_id=fields.agent_id,
            verifier=fields.verifier,
            operator=fields.operator,
            reason=fields.reason,
            inbox_id=inbox_id,
            reply=reply,
        )
        code = await self._call(self.registry_mailbox, msg, reply)
        if code is not None:
            raise HandshakeRefused(code, f"no credential issued for {fields.agent_id!r}")

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
        kernel's clock (see kernel.state.amendments). A refusal is recorded too.

        Raises:
            AmendmentInvalid: UNKNOWN_AGENT, UNKNOWN_LIMIT, LIMIT_OUT_OF_BOUNDS, SCHEMA_INVALID.
        """
        try:
            # The agent names the event's envelope; kernel.state.amendments checks the rest.
            agent_id = wall.admit({"agent_id": agent_id}, wall.AgentSpec).agent_id
        except InputInvalid as exc:
            await self._record_refusal("amend", exc, operator, target=agent_id)
            raise AmendmentInvalid(exc.reason_code, f"{exc.field}: {exc.detail}") from None
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

    async def load_pack(self, pack: PolicyPack, *, operator: str, reason: str) -> PackRef:
        """Load a new version of a pack (or a new pack); record PackLoaded and judge with it.

        An operator's act: it names who and why. Flows already judged keep their
        verdicts. Loading the version in force records nothing.

        Raises:
            InputInvalid: no operator or reason, or one too long (recorded).
            PackError: the pack is invalid (nothing changes), with the same message as at start.
        """
        act = await self._admit_act(
            wall.fields(operator=operator, reason=reason),
            wall.HumanActSpec,
            "load_pack",
            operator,
            target=pack.name,
        )
        reply: Reply[Any] = Reply()
        msg = LoadPack(
            pack=pack,
            adapters=self._adapter_names,
            operator=act.operator,
            reason=act.reason,
            reply=reply,
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

        The proposal passes the promoter gate like an agent's (kernel.state.rulebook);
        with ``override`` the operator puts it in force at once, recorded as an
        override with their name and reason.
        """
        self._raise_if_stopped()
        await self._admit_act(
            wall.fields(
                rule=rule,
                title=title,
                content=content,
                labels=list(labels),
                operator=operator,
                reason=reason,
                base_version=base_version,
            ),
            wall.RuleProposalSpec,
            "rule",
            operator,
            target=rule,
        )
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
            ValueError: another decision than override or skip, or no operator or reason
                (InputInvalid, recorded, for a field of the wrong type or size).
        """
        self._raise_if_stopped()
        await self._admit_act(
            wall.fields(
                proposal_seq=proposal_seq, decision=decision, operator=operator, reason=reason
            ),
            wall.RuleDecisionSpec,
            "rule",
            operator,
            target=f"#{proposal_seq}",
        )
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

    def _check_decision(
        self,
        dfid: Any,
        decision: Any,
        operator: Any,
        reason: Any,
        params: Any,
        action_hash: Any,
    ) -> wall.DecisionSpec:
        """Return a human decision checked at the wall, or raise InputInvalid."""
        checked = wall.admit(
            wall.fields(
                dfid=dfid,
                decision=decision,
                operator=operator,
                reason=reason,
                params=dict(params) if isinstance(params, Mapping) else params,
                action_hash=action_hash,
            ),
            wall.DecisionSpec,
        )
        try:
            word = Decision(checked.decision)
        except ValueError:
            words = ", ".join(d.value for d in Decision)
            raise InputInvalid("decision", f"a decision is one of {words}") from None
        approval = self.projections.approvals.get(checked.dfid)
        flow = self.projections.flows.get(checked.dfid)
        if (
            word in APPROVE_WORDS
            and not checked.action_hash
            # A flow whose effect may have happened refuses approval anyway, and says why.
            and (flow is None or flow.pending is None)
            and approval is not None
            and approval.action_hash  # else there is nothing to approve (escalation says so)
            and approval.impact is Impact.HIGH_IMPACT
        ):
            raise InputInvalid(
                "action_hash",
                "approving a HIGH_IMPACT action takes its action hash (as dirk decide --confirm)",
            )
        return checked

    async def _admit_act(
        self, value: Mapping[str, Any], spec: type[T], entry: str, operator: Any, *, target: Any
    ) -> T:
        """Return a human act checked at the wall; record the refusal and raise if it fails."""
        try:
            return wall.admit(value, spec)
        except InputInvalid as exc:
            await self._record_refusal(entry, exc, operator, target=target)
            raise

    def _check_status(self, request: Mapping[str, Any]) -> wall.AgentStatusSpec:
        """Return an agent status change checked at the wall, or raise InputInvalid."""
        checked = wall.admit(request, wall.AgentStatusSpec)
        try:
            AgentStatus(checked.status)
        except ValueError:
            words = ", ".join(s.value for s in AgentStatus)
            raise InputInvalid("status", f"a status is one of {words}") from None
        return checked

    async def _refuse_decision(
        self, dfid: Any, decision: Any, operator: Any, exc: InputInvalid
    ) -> Verdict:
        """Record a decision the wall refused (on its flow when it names one) and answer it."""
        known = isinstance(dfid, str) and dfid in self.projections.flows
        detail = clip(f"{exc.field}: {exc.detail}", wall.MAX_DETAIL)
        refused = DecisionRefused(
            reason_code=exc.reason_code,
            decision=clip(decision, 32),
            operator=clip(operator) if operator is not None else "",
            detail=detail,
            target="" if known else clip(dfid),
        )
        self._raise_if_stopped()
        await self.journal.append([Draft(payload=refused, dfid=dfid if known else None)])
        feedback = Feedback(
            reason_code=exc.reason_code, detail=detail, layer="schema", field=exc.field
        )
        return Verdict(outcome=Outcome.REFUSED, dfid=clip(dfid), feedback=feedback)

    async def _record_refusal(
        self,
        entry: str,
        exc: Exception,
        operator: Any = "",
        *,
        target: Any = "",
        inbox_id: int | None = None,
    ) -> Event:
        """Record an act or an inbox row refused at the wall (every string clipped)."""
        refused = InputRefused(
            reason_code=getattr(exc, "reason_code", ReasonCode.SCHEMA_INVALID),
            entry=clip(entry, 32),
            field=clip(getattr(exc, "field", "$"), 64),
            detail=clip(getattr(exc, "detail", str(exc)), wall.MAX_DETAIL),
            operator=clip(operator) if operator is not None else "",
            target=clip(target) if target is not None else "",
            inbox_id=inbox_id,
        )
        self._raise_if_stopped()
        [event] = await self.journal.append([Draft(payload=refused)])
        return event

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

    async def _call(self, mailbox: Mailbox[M], msg: M, reply: Reply[T]) -> T:
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

    def _stop(self, reason: StopReason, detail: str = "") -> None:
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
            checked = self._check_status(inbox.row_fields(row, inbox.AGENT_STATUS_FIELDS))
            reply: Reply[ReasonCode | None] = Reply()
            msg = SetStatus(
                agent_id=checked.agent_id,
                status=AgentStatus(checked.status),
                operator=checked.operator,
                reason=checked.reason,
                inbox_id=row.id,
                reply=reply,
            )
            code = await self._call(self.registry_mailbox, msg, reply)
            if code is not None:
                raise HandshakeRefused(code, f"no agent {checked.agent_id!r}")

        async def credential(row: InboxRow) -> None:
            await self._issue_credential(inbox.to_credential(row), inbox_id=row.id)

        async def rule(row: InboxRow) -> None:
            body = inbox.row_fields(row, inbox.RULE_FIELDS)
            checked = wall.admit(body, wall.RuleDecisionSpec)
            try:
                await self.promoter.decide(
                    checked.proposal_seq,
                    checked.decision,
                    operator=checked.operator,
                    reason=checked.reason,
                    inbox_id=row.id,
                )
            except RuleNotPending as exc:
                raise InputInvalid("proposal_seq", str(exc)) from exc

        async def refuse(row: InboxRow, exc: Exception) -> int:
            operator = row.decision.get("operator", "")
            event = await self._record_refusal(
                f"inbox:{inbox.row_type(row)}",
                exc,
                operator if isinstance(operator, str) else "",
                target=row.dfid,
                inbox_id=row.id,
            )
            return event.seq

        handlers = {
            inbox.DECIDE: decide,
            inbox.AMEND: amend,
            inbox.AGENT_STATUS: agent_status,
            inbox.RULE: rule,
            inbox.CREDENTIAL: credential,
        }
        try:
            await inbox.poll(
                self.journal.path,
                self.clock,
                interval_s,
                self.escalation_mailbox,
                self.projections,
                handlers,
                refuse,
            )
        except (KernelShutdown, MailboxClosed):
            return
