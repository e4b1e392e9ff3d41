"""The Kernel: the API an agent process embeds.

::

    async with open_kernel("dir.db", packs=[TRADING], adapters={"broker": broker},
                           allow=["trader"]) as kernel:
        await kernel.register(Trader())
        dfids = await kernel.trigger("market.ACME", {"market.ACME.price": "101.25"})
        flow = await kernel.wait_flow(dfids[0])

Data flows one way: trigger -> context compiler -> agent (user space) -> DIM
-> (escalation) -> execution -> journal, and every arrow is a message between
supervised actors. The kernel itself only routes calls from the embedding
code into mailboxes and waits for their durable answers. The actors are wired
in :mod:`kernel.wiring`; the operator's acts (decide, amend, load a pack, ...)
are in :mod:`kernel.acts`, the Kernel's base. Opening, running and stopping
one is :func:`kernel.boot.open_kernel`; hosting agents, :mod:`kernel.hosting`.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeVar

import anyio
import msgspec
from anyio.abc import TaskGroup
from opentelemetry.context import Context

from kernel.acts import STOPPED, OperatorActs
from kernel.adapters.contract import Adapter
from kernel.artifacts import ArtifactStore, artifacts_beside, checked
from kernel.config import KernelConfig
from kernel.core import wall
from kernel.core.errors import KernelFault, KernelShutdown
from kernel.core.events import (
    ArtifactStored,
    Draft,
    Event,
    Feedback,
    FlowAborted,
    InputRefused,
    Manifest,
    MeaningScored,
    ProposalRecord,
)
from kernel.core.fetching import ArtifactSlice, FetchRefused
from kernel.core.flow import FLOW_EVENTS, TERMINAL, FlowState, FlowStatus
from kernel.core.ports import Clock, IdSource
from kernel.core.reasons import ReasonCode, StopReason
from kernel.core.text import utf8_problem
from kernel.core.wall import InputInvalid, clip
from kernel.hosting import AgentLike
from kernel.inbox import InboxAgents
from kernel.journal.store import Journal
from kernel.policy.contracts import (
    HandshakeRefused,
    Outcome,
    Proposal,
    ProposalInvalid,
    Session,
    Verdict,
    to_record,
)
from kernel.policy.packs import PolicyCatalog
from kernel.proofs.erasure import Sealer
from kernel.runtime.actors import Mailbox, Outbox, Reply
from kernel.runtime.messages import (
    AgentMessage,
    CredentialProof,
    FireTrigger,
    Judge,
    Register,
)
from kernel.state.artifacts import fetch as fetch_artifact_for
from kernel.state.constraints import about_of, scorable
from kernel.state.meaning import text_hash
from kernel.state.projections import Projections, visible
from kernel.state.snapshots import Checkpointer
from kernel.telemetry import caller_context, traceparent_of
from kernel.wiring import Actors

M = TypeVar("M")
T = TypeVar("T")
log = logging.getLogger("kernel")


class Kernel(OperatorActs):
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
    ) -> None:
        limits = config.limits
        max_in_flight = limits.max_in_flight
        self.journal = journal
        self.projections = projections
        self.catalog = catalog
        self.clock = clock
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
        # Seals personal fields of proposals (kernel.proofs.erasure); set by open_kernel.
        self._sealer: Sealer | None = None
        self.actors = Actors(
            projections=projections,
            catalog=catalog,
            adapters=adapters,
            allow=allow,
            config=config,
            clock=clock,
            ids=ids,
            hosts=self._hosts,
            submit=self.submit,
            spawn_effect=self._spawn_effect,
        )
        self._adapter_names = frozenset(self.actors.adapters)
        self._meaning = config.ports.meaning
        self._artifact_location = config.artifacts or artifacts_beside(journal.path)
        self._artifact_store: ArtifactStore | None = None
        self._artifact_lock = anyio.Lock()
        self.actors.agents.fetch = self.fetch_artifact
        self.actors.agents.judge_now = self._judge_now
        self.inbox_agents = InboxAgents(
            self.register,
            lambda topic: self.trigger(topic, source="inbox"),
            lambda: self.catalog.kinds,
            projections,
            self._hosts,
        )

    # --- the embedding API -------------------------------------------------

    async def register(self, agent: AgentLike, *, credential: str | None = None) -> Session:
        """Hand the agent's manifest to the registry and host the agent in this kernel.

        ``credential`` is the secret the operator provisioned for the agent, if any
        (kernel.registry): once one is provisioned, every handshake must show it.

        Raises:
            HandshakeRefused: with VERSION_MISMATCH, UNKNOWN_AGENT, AGENT_SUSPENDED,
                CREDENTIAL_INVALID, ...
        """
        session = await self._handshake(agent.manifest, credential, False)
        agent_id = session.agent_id
        hosts = self.actors.agents
        if agent_id not in self._hosts:
            mailbox: Mailbox[AgentMessage] = Mailbox(f"agent:{agent_id}", self.actors.capacity)
            self._hosts[agent_id] = mailbox
            hosts.host(agent, mailbox)
        elif hosts.hosting(agent_id):
            # Registered again: the new agent gets a crew and a mailbox of its own; the
            # flows the old one held ended with its session (kernel.registry).
            mailbox = Mailbox(f"agent:{agent_id}", self.actors.capacity)
            hosts.retire(agent_id, self._hosts[agent_id], session.token)
            self._hosts[agent_id] = mailbox
            hosts.host(agent, mailbox)
        hosts.sessions[agent_id] = session
        return session

    def route(self, agent_id: str) -> Mailbox[AgentMessage]:
        """Return the mailbox ``agent_id``'s contexts arrive in when it is hosted elsewhere.

        kernel.mesh drains it onto the bus; the agent's flows open as for a hosted one.
        """
        mailbox = self._hosts.get(agent_id)
        if mailbox is None:
            mailbox = Mailbox(f"agent:{agent_id}", self.actors.capacity)
            self._hosts[agent_id] = mailbox
        return mailbox

    async def handshake(
        self,
        manifest: Manifest,
        *,
        credential: str | CredentialProof | None = None,
        require_credential: bool = False,
    ) -> Session:
        """Register a manifest without hosting the agent (it submits on its own).

        ``credential``: the agent's provisioned secret, or a proof of holding it (kernel.mesh
        builds one from a signed challenge); ``require_credential`` refuses
        the handshake unless one is provisioned and shown (the bus asks for it).

        An agent id hosted in this process is displaced by such a handshake: its crew
        stops, no new flow is opened for it here, and the flows it was thinking about
        end (INVALID_SESSION, recorded), never left ACTIVE.

        Raises:
            HandshakeRefused: when the registry refuses the manifest.
        """
        session = await self._handshake(manifest, credential, require_credential)
        agent_id = session.agent_id
        if self.actors.agents.hosting(agent_id):
            self.actors.agents.retire(agent_id, self._hosts.pop(agent_id), session.token)
        return session

    async def _handshake(
        self,
        manifest: Manifest,
        credential: str | CredentialProof | None,
        require_credential: bool,
    ) -> Session:
        invalid: str | None = None
        if credential is not None and not (
            isinstance(credential, CredentialProof)
            or (isinstance(credential, str) and utf8_problem(credential) is None)
        ):
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
            hosted=self.actors.agents.hosting(manifest.agent_id),
        )
        answer = await self._call(self.actors.registry, msg, reply)
        assert isinstance(answer, Session)  # _call raised a refusal
        return answer

    async def trigger(
        self,
        topic: str,
        facts: Mapping[str, Any] | None = None,
        *,
        source: str = "",
        parent: str | None = None,
        trace_context: Context | str | None = None,
    ) -> list[str]:
        """Record that something happened; return the DFIDs of the flows it opened.

        ``trace_context`` joins the flows to the caller's trace: an OpenTelemetry
        ``Context`` (``opentelemetry.context.get_current()`` inside a request) or a W3C
        ``traceparent`` string. Each flow keeps its own trace (trace id = DFID) and its
        root span links to the caller's span (docs/traces.md says why).

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
                # A string is a traceparent already; the wall checks its form (and type).
                traceparent=trace_context
                if trace_context is not None and not isinstance(trace_context, Context)
                else traceparent_of(trace_context),
            ),
            wall.TriggerSpec,
        )
        topic, facts, source, parent = checked.topic, checked.facts, checked.source, checked.parent
        if checked.traceparent and caller_context(checked.traceparent) is None:
            raise InputInvalid("traceparent", "a trace context names a span: non-zero ids")
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
            topic=topic,
            facts=dict(facts or {}),
            source=source,
            parent_dfid=parent,
            reply=reply,
            traceparent=checked.traceparent,
        )
        self._admitting += fan_out
        try:
            return await self._call(self.actors.compiler, msg, reply)
        finally:
            self._admitting -= fan_out

    async def submit(
        self,
        token: str,
        dfid: str,
        proposal: Proposal | Mapping[str, Any] | bytes | str,
        *,
        usage: Mapping[str, int] | None = None,
    ) -> Verdict:
        """Submit a proposal for flow ``dfid``; return the verdict once it is durable.

        ``usage``: the tokens the reasoning behind it spent, by model (the DIM prices
        them with ``KernelConfig.prices`` and records ReasoningCharged).
        """
        try:
            wall.admit(wall.fields(token=token, dfid=dfid), wall.SubmissionSpec)
        except InputInvalid as exc:
            # Nothing to name: no flow could have such an id, and the token is unchecked.
            feedback = Feedback(
                reason_code=ReasonCode.SCHEMA_INVALID,
                detail=f"the token and the DFID are ids (text, at most {wall.MAX_ID}"
                f" characters, no control character): {exc.detail}"[:500],
                layer="schema",
                field=exc.field,
            )
            return Verdict(outcome=Outcome.REFUSED, dfid=clip(dfid), feedback=feedback)
        record, invalid = self._admitted(proposal)
        await self._recall(dfid)
        if self._meaning is not None and invalid is None:
            await self._score_meaning(dfid, record)
        reply: Reply[Verdict] = Reply()
        msg = Judge(
            dfid=dfid,
            proposal=record,
            token=token,
            invalid=invalid,
            reply=reply,
            usage=_usage(usage),
        )
        return await self._call(self.actors.dim, msg, reply)

    def _judge_now(
        self, token: str, dfid: str, proposal: Proposal, usage: Mapping[str, int]
    ) -> bool:
        """Hand a hosted agent's proposal to the DIM without waiting for its verdict.

        The run-to-completion path of a synchronous agent (kernel.hosting): the same
        judgement as :meth:`submit`, when nothing in it waits (the flow is in memory, no
        meaning scorer, room in the DIM's mailbox). False leaves it to :meth:`submit`.
        """
        if (
            self._stop_reason is not None
            or self._meaning is not None
            or dfid not in self.projections.flows
        ):
            return False
        # No id check of token and dfid: both are the kernel's own (the session, the flow).
        record, invalid = self._admitted(proposal)
        msg = Judge(dfid=dfid, proposal=record, token=token, invalid=invalid, usage=_usage(usage))
        try:
            self.actors.dim.send_nowait(msg)
        except anyio.WouldBlock:
            return False
        return True

    def _admitted(
        self, proposal: Proposal | Mapping[str, Any] | bytes | str
    ) -> tuple[ProposalRecord, Feedback | None]:
        """Return the proposal as the wall admits it (sealed), or its kind and why not."""
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
        if invalid is None and self._sealer is not None:
            # Personal fields become tokens before anything judges or records them.
            record = self._sealer.seal(record)
        return record, invalid

    async def _score_meaning(self, dfid: str, record: ProposalRecord) -> None:
        """Record how close the proposal comes to the constraints its words did not match.

        The embedding model runs here, at the edge; the DIM reads the recorded scores
        (``MeaningScored``), so its verdict stays a function of the journal. A model that
        fails scores nothing: the words still match as they always do.
        """
        matcher = self._meaning
        flow = self.projections.flows.get(dfid)
        if matcher is None or flow is None or flow.terminal:
            return
        memory = self.projections.memory
        wanted = scorable(memory, record)
        about = about_of(record)
        hashed = text_hash(about)
        if not wanted or hashed in memory.scores.get(dfid, {}):
            return
        seqs = sorted(wanted)
        try:
            scores = await matcher.scores(about, [wanted[seq] for seq in seqs])
        except Exception as exc:  # the model is the outside world: it never stops a verdict
            log.warning("the embedding matcher failed on flow %s: %r", dfid, exc)
            return
        scored = MeaningScored(
            model=clip(matcher.embedder.model),
            version=clip(matcher.embedder.version),
            threshold=matcher.threshold,
            text=hashed,
            scores={str(seq): score for seq, score in zip(seqs, scores, strict=True)},
        )
        await self.journal.append([Draft(payload=scored, dfid=dfid, agent_id=flow.agent_id)])

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

    async def put_artifact(
        self,
        data: bytes,
        *,
        media_type: str = "application/octet-stream",
        summary: str = "",
        by: str = "",
        name: str = "",
    ) -> str:
        """Keep a document in the artifact store and record its reference; return it.

        The bytes go to the store first, then ``ArtifactStored`` (reference, size, media
        type, ``summary``, ``by`` whom) is recorded: a recorded reference never names
        nothing. A trigger fact holding the reference puts it in the artifacts layer of
        the contexts that see the fact, and their agents may then fetch it. Putting the
        same bytes again records nothing new.

        Raises:
            ArtifactTooLarge: not bytes, or over the store's limit.
            InputInvalid: a media type, summary, ``by`` or name the wall refuses.
            ArtifactStoreError: the store cannot be used.
        """
        self._raise_if_stopped()
        info = wall.admit(
            wall.fields(media_type=media_type, summary=summary, by=by, name=name),
            wall.ArtifactSpec,
        )
        raw = checked(data)
        store = await self.artifact_store()
        ref = await store.put(raw)
        known = self.projections.artifacts.stored.get(ref)
        if known is None or (known.media_type, known.summary) != (info.media_type, info.summary):
            stored = ArtifactStored(
                ref=ref,
                size=len(raw),
                media_type=info.media_type,
                summary=info.summary,
                by=info.by,
                name=info.name,
            )
            await self.journal.append([Draft(payload=stored, agent_id=info.by or None)])
        return ref

    async def fetch_artifact(
        self,
        agent_id: str,
        dfid: str,
        ref: str,
        start: int = 0,
        length: int | None = None,
    ) -> ArtifactSlice:
        """Return a range of an artifact for ``agent_id``, if a context of its flow ``dfid``
        referenced it (kernel.state.artifacts); a refusal is recorded (``InputRefused``).

        Agents call ``ctx.fetch_artifact``, which reaches this in the kernel's process and
        through the mesh; the MCP server calls it for its agent principals.

        Raises:
            FetchRefused: UNAUTHORIZED, ARTIFACT_MISSING or SCHEMA_INVALID, recorded.
        """
        self._raise_if_stopped()
        projections = self.projections
        try:
            store = await self.artifact_store() if projections.artifacts.stored else None
            return await fetch_artifact_for(
                projections.artifacts,
                projections.flows,
                projections.state,
                self.journal,
                store,
                agent_id=agent_id,
                dfid=dfid,
                ref=ref,
                start=start,
                length=length,
            )
        except FetchRefused as exc:
            refused = InputRefused(
                reason_code=exc.reason_code,
                entry="artifact",
                field=exc.field,
                detail=clip(exc.detail, wall.MAX_DETAIL),
                target=clip(ref) if isinstance(ref, str) else "",
            )
            flow = projections.flows.get(dfid) if isinstance(dfid, str) else None
            await self.journal.append(
                [
                    Draft(
                        payload=refused,
                        dfid=flow.dfid if flow is not None and not flow.terminal else None,
                        agent_id=clip(agent_id) if isinstance(agent_id, str) else None,
                    )
                ]
            )
            raise

    @property
    def stopped(self) -> KernelShutdown | None:
        """Why the kernel stopped, or None while it runs."""
        return self._stop_reason

    # --- internals ---------------------------------------------------------

    def _stop(self, reason: StopReason, detail: str = "") -> None:
        """Stop accepting work and release everyone waiting on the kernel."""
        if self._stop_reason is not None:
            return
        self._stop_reason = KernelShutdown(reason, detail)
        for reply in list(self._pending):
            reply.set(STOPPED)
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
        # Twice crashed on, or its events could not be sealed (kernel.runtime.actors).
        detail = clip(
            f"actor {actor} could not handle this flow's message: {type(exc).__name__}: {exc}", 500
        )
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


def _usage(usage: Mapping[str, int] | None) -> dict[str, int]:
    """Reported tokens by model, as the wall admits them (anything else counts as nothing)."""
    admitted: dict[str, int] = {}
    for model, tokens in (usage or {}).items():
        try:
            checked = wall.admit({"tokens": tokens, "model": model}, wall.UsageSpec)
        except InputInvalid:
            continue
        admitted[checked.model] = admitted.get(checked.model, 0) + checked.tokens
    return admitted
