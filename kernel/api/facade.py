"""The Kernel: the API an agent process embeds.

::

    async with open_kernel("dir.db", packs=[TRADING], adapters={"broker": broker},
                           allow=["trader"]) as kernel:
        await kernel.register(Trader())
        dfids = await kernel.trigger("market.ACME", {"market.ACME.price": "101.25"})
        flow = await kernel.wait_flow(dfids[0])

        # Or, from a framework's tool call: one call, one Decision.
        decision = await kernel.propose("sdk-agent", "trading.place_order", {...},
                                        explain="...", confidence=0.9,
                                        conversation=run_id, tool_call_id=call_id)

Data flows one way: trigger -> context compiler -> agent (user space) -> DIM
-> (escalation) -> execution -> journal, and every arrow is a message between
supervised actors. The kernel itself only routes calls from the embedding
code into mailboxes and waits for their durable answers.

A Kernel is composed of parts, each named for what it does: the actors
(:mod:`kernel.api.wiring`), the calls into them and the flows waited on
(:mod:`kernel.api.calls`), what a proposal goes through before its verdict
(:mod:`kernel.api.edge`), the artifacts it keeps (:mod:`kernel.api.documents`), the
operator's acts (:mod:`kernel.api.acts`), the one entry for a given proposal and its
conversations (:mod:`kernel.api.proposals`), and its life (:mod:`kernel.api.lifetime`): a
Kernel is an async context manager that starts, recovers, runs and stops itself.
:func:`kernel.boot.open_kernel` reads the configuration, restores the projections,
constructs one and enters it.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, TypeVar

from opentelemetry.context import Context

from kernel.adapters.contract import Adapter
from kernel.api.acts import OperatorActs
from kernel.api.answers import Answers
from kernel.api.calls import Calls, Flows
from kernel.api.decisions import Decision
from kernel.api.documents import Artifacts
from kernel.api.edge import Edge
from kernel.api.lifetime import Checkpoints, Lifetime
from kernel.api.operating import Operating
from kernel.api.outage import Outage, spool_beside
from kernel.api.principals import Delegations
from kernel.api.proposals import Proposals
from kernel.api.sessions import Sessions
from kernel.api.wiring import Actors
from kernel.artifacts import ArtifactStore, artifacts_beside
from kernel.config import KernelConfig
from kernel.context import Hosted
from kernel.core import wall
from kernel.core.errors import KernelShutdown
from kernel.core.events import Manifest, Principal, Tier
from kernel.core.fetching import ArtifactSlice
from kernel.core.flow import TERMINAL, FlowState, FlowStatus
from kernel.core.ports import Clock, IdSource
from kernel.core.wall import InputInvalid
from kernel.hosting import AgentLike
from kernel.inbox import (
    InboxProposals,
    Keyring,
)
from kernel.journal.store import Journal
from kernel.policy.contracts import (
    Proposal,
    Session,
    Verdict,
)
from kernel.policy.packs import PolicyCatalog
from kernel.proofs.erasure import Sealer
from kernel.runtime.actors import Effects, Mailbox, Reply
from kernel.runtime.messages import (
    AgentMessage,
    CredentialProof,
    FireTrigger,
)
from kernel.state.projections import Projections
from kernel.state.snapshots import Checkpointer
from kernel.telemetry import Telemetry, caller_context, traceparent_of

log = logging.getLogger("kernel")
T = TypeVar("T")


class Kernel(Operating):
    """A running kernel; obtain one with :func:`open_kernel`.

    Entering it (``async with``) starts it: that is what :func:`open_kernel` does
    after restoring its projections, and a kernel runs once.

    ``sealer`` seals the personal fields of proposals before anything judges them
    (kernel.proofs.erasure; :func:`open_kernel` builds one when a kind has such
    fields), and ``checkpoints`` signs checkpoints of the journal while it runs and
    as it stops (``KernelConfig.signing``).
    """

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
        telemetry: Telemetry | None = None,
        keyring: Keyring | None = None,
        keyring_path: str | None = None,
        sealer: Sealer | None = None,
        checkpoints: Checkpoints | None = None,
    ) -> None:
        self.journal = journal
        self.projections = projections
        self.catalog = catalog
        self.clock = clock
        every = config.storage.checkpoint_every
        checkpointer = Checkpointer(every, journal.head_seq) if every > 0 else None
        self._calls = Calls()
        self._flows = Flows(
            journal, projections, self._calls, config.limits.max_in_flight, checkpointer
        )
        self._artifacts = Artifacts(
            journal,
            projections,
            config.artifacts or artifacts_beside(journal.path),
            self._calls.raise_if_stopped,
        )
        edge = Edge(journal, projections, sealer=sealer, meaning=config.ports.meaning)
        # Versioned: the subscribers' index tells a change by it (kernel.context.Subscribers).
        hosts: dict[str, Mailbox[AgentMessage]] = Hosted()
        self._hosts = hosts
        effects = Effects()
        self.actors = Actors(
            projections=projections,
            catalog=catalog,
            adapters=adapters,
            allow=allow,
            config=config,
            clock=clock,
            ids=ids,
            hosts=hosts,
            effects=effects,
            fetch=self._artifacts.fetch,
        )
        self._answers = Answers(projections, self.actors, self._calls, self._flows, edge)
        self.actors.answer_with(self._answers, self._answers.carry)
        self._sessions = Sessions(self.actors, self._calls, hosts)
        self._outage = Outage(
            journal,
            projections,
            catalog,
            clock=clock,
            ids=ids,
            spool=spool_beside(journal, config.storage.spool),
            spawn=effects,
        )
        self._proposals = Proposals(
            journal,
            projections,
            self.actors,
            self._calls,
            self._flows,
            clock=clock,
            ids=ids,
            token_of=self._sessions.token_of,
            edge=edge,
            principal=config.principal,
            outage=self._outage,
        )
        inbox = InboxProposals(
            self._sessions.handshake,
            self._proposals.open_flow,
            lambda: catalog.kinds,
            projections,
            hosts,
        )
        self._lifetime = Lifetime(
            journal=journal,
            projections=projections,
            catalog=catalog,
            allow=allow,
            config=config,
            clock=clock,
            telemetry=telemetry or Telemetry(),
            keyring=(keyring, keyring_path),
            actors=self.actors,
            calls=self._calls,
            flows=self._flows,
            hosts=hosts,
            effects=effects,
            artifacts=self._artifacts,
            sealer=sealer,
            checkpoints=checkpoints,
        )
        self._acts = OperatorActs(
            journal,
            projections,
            self.actors,
            self._calls,
            self._flows,
            inbox,
            artifacts=self._artifacts,
            keyring=self._lifetime.operator_keyring,
            clock=clock,
        )
        self._delegations = Delegations(self._acts.record_act, projections, ids)
        self._running: AsyncExitStack | None = None

    # --- its life --------------------------------------------------------------

    async def __aenter__(self) -> Kernel:
        """Start the kernel: record KernelStarted, recover, start the actors and tasks.

        Raises:
            RuntimeError: the kernel ran before.
            JournalError: KernelStarted could not be recorded.
        """
        running = AsyncExitStack()
        await running.enter_async_context(self._lifetime.running(self._acts.apply))
        self._running = running
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        """Stop the kernel: release every caller, record KernelStopped, flush the spans.

        Raises:
            KernelShutdown: the kernel had to stop before the block ended.
        """
        running, self._running = self._running, None
        assert running is not None, "the kernel was not entered"
        return bool(await running.__aexit__(exc_type, exc, tb))

    @property
    def stopped(self) -> KernelShutdown | None:
        """Why the kernel stopped, or None while it runs."""
        return self._calls.stopped

    # --- the embedding API -------------------------------------------------

    async def register(self, agent: AgentLike, *, credential: str | None = None) -> Session:
        """Hand the agent's manifest to the registry and host the agent in this kernel.

        ``credential`` is the secret the operator provisioned for the agent, if any
        (kernel.registry): once one is provisioned, every handshake must show it.

        Raises:
            HandshakeRefused: with VERSION_MISMATCH, UNKNOWN_AGENT, AGENT_SUSPENDED,
                CREDENTIAL_INVALID, ...
        """
        return await self._sessions.register(agent, credential=credential)

    def route(self, agent_id: str) -> Mailbox[AgentMessage]:
        """Return the mailbox ``agent_id``'s contexts arrive in when it is hosted elsewhere.

        kernel.mesh drains it onto the bus; the agent's flows open as for a hosted one.
        """
        return self._sessions.route(agent_id)

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
        return await self._sessions.handshake(
            manifest, credential=credential, require_credential=require_credential
        )

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
        fan_out = len(self.actors.subscribers.of(topic, active=False))
        reply: Reply[list[str]] = Reply()
        msg = FireTrigger(
            topic=topic,
            facts=dict(facts or {}),
            source=source,
            parent_dfid=parent,
            reply=reply,
            traceparent=checked.traceparent,
        )
        await self._flows.admit(fan_out)
        try:
            return await self._calls.call(self.actors.compiler, msg, reply)
        finally:
            self._flows.release(fan_out)

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
        return await self._answers.submit(token, dfid, proposal, usage=usage)

    async def propose(
        self,
        agent_id: str,
        kind: str,
        params: Mapping[str, Any],
        *,
        explain: str,
        confidence: float,
        conversation: str | None = None,
        trace_context: Context | str | None = None,
        tool_call_id: str | None = None,
        principal: Principal | None = None,
        tier: Tier | str = Tier.INTERACTIVE,
        delegation: str | None = None,
        usage: Mapping[str, int] | None = None,
    ) -> Decision:
        """Propose ``kind`` with ``params`` as ``agent_id`` in one call; return the Decision.

        The one entry for code that already holds a proposal (a framework's tool
        call): the kernel opens a flow for the agent with this proposal in it, the
        DIM judges it, an accepted one is executed, and the answer says what became
        of it (docs/embedding.md). The agent needs a session in this kernel first
        (:meth:`handshake`, or :meth:`register`); its manifest's ``max_attempts`` is
        its conversations' retry governor.

        Args:
            agent_id: the agent proposing.
            kind: the policy kind (``booking.reserve_room``).
            params: the kind's parameters.
            explain: the model's reasoning, for humans.
            confidence: the model's confidence in [0, 1]; low values go to a human.
            conversation: the framework's run or thread id: the conversation's calls are
                one DecisionFlow, with one retry governor and one view of the state.
            trace_context: the caller's span (an OpenTelemetry ``Context`` or a W3C
                ``traceparent``), which the flow's trace links to.
            tool_call_id: the framework's id of this tool call. With it the call is
                idempotent: proposed again (a saved run resumed twice, even after a
                restart), it is answered from its record, never executed twice.
            principal: whom the call is made for (default: the host's principal).
            tier: the agent's tier (interactive, subagent, api, background).
            delegation: the delegation the agent acts under (default: its latest).
            usage: the tokens the model spent on this call, by model name: priced and
                charged to the reasoning budgets before the verdict (docs/budgets.md).

        Returns:
            EXECUTED with the receipt, ESCALATED (follow it with :meth:`await_decision`),
            REFUSED or FAILED with a reason code and a detail: never an exception for
            what the caller passed.

        Raises:
            KernelShutdown: the kernel stopped.
        """
        return await self._proposals.propose(
            agent_id,
            kind,
            params,
            explain=explain,
            confidence=confidence,
            conversation=conversation,
            trace_context=trace_context,
            tool_call_id=tool_call_id,
            principal=principal,
            tier=tier,
            delegation=delegation,
            usage=usage,
        )

    async def delegate(
        self,
        principal: Principal,
        *,
        from_agent: str,
        to_agent: str,
        task: str = "",
        scopes: Iterable[str] = (),
        parent: str | None = None,
    ) -> str:
        """Record that ``from_agent`` hands a task to ``to_agent`` for ``principal`` (Delegated).

        A later call by ``to_agent`` for the same tenant and user acts under the latest
        such delegation unless it names one (``propose(delegation=...)``); its scopes are
        the principal's intersected with every hop's, never wider (docs/identity.md).
        ``parent`` None: the delegation ``from_agent`` itself acts under, if any.

        Returns:
            The delegation's id.

        Raises:
            InputInvalid: a field of the wrong type.
            DelegationInvalid: DELEGATION_INVALID or CROSS_TENANT (the parent is unknown,
                another principal's, or not handed to ``from_agent``).
            KernelShutdown: the kernel stopped.
        """
        self._calls.raise_if_stopped()
        return await self._delegations.delegate(
            principal,
            from_agent=from_agent,
            to_agent=to_agent,
            task=task,
            scopes=scopes,
            parent=parent,
        )

    # A timeout here is an answer (the decision as it stands), not a failure: a
    # cancel scope around the call could not say which decision it had reached.
    async def await_decision(
        self,
        dfid: str,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Decision:
        """Wait until flow ``dfid`` ended, at most ``timeout`` seconds; return its Decision.

        What a caller does after an ESCALATED decision: it returns once a human
        decided and the execution ended, or, past ``timeout``, the decision as it
        stands (still ESCALATED or PENDING). An unknown DFID is refused at once.

        Raises:
            KernelShutdown: the kernel stopped.
        """
        return await self._proposals.await_decision(dfid, timeout)

    async def withdraw(self, dfid: str, *, agent_id: str, reason: str) -> Verdict:
        """Withdraw flow ``dfid`` as its agent while it waits for a human (a cancelled task)."""
        return await self._sessions.withdraw(dfid, agent_id=agent_id, reason=reason)

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
        return await self._flows.wait_flow(dfid, until)

    async def wait_quiet(self) -> None:
        """Wait until no flow moves on its own (every flow ended or waits for a human).

        Calls decided while the journal's store was away count as moving until they are
        on record: this waits for the store to be back (kernel.api.outage). Drift
        monitors have judged every committed batch when it returns (kernel.api.drift).
        """
        await self._outage.settle()
        await self._flows.wait_quiet()
        await self._lifetime.wait_watched()  # and a breach's demotion is on record

    # --- artifacts (kernel.api.documents.Artifacts says what each checks) -------------------

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
        return await self._artifacts.put(
            data, media_type=media_type, summary=summary, by=by, name=name
        )

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
        return await self._artifacts.fetch(agent_id, dfid, ref, start, length)

    async def artifact_store(self) -> ArtifactStore:
        """Return the kernel's artifact store, opened on first use (closed with the kernel).

        Raises:
            ArtifactStoreError: the store cannot be opened.
        """
        return await self._artifacts.store()
