"""The context compiler: triggers in, one immutable WorkingContext per attempt out.

Agents never query anything. When a trigger fires, the compiler records it
(its facts update the state layer), opens a DecisionFlow for every hosted,
ACTIVE agent subscribed to its topic, and compiles each agent's context: the
state it is entitled to see (need-to-know, from its manifest subscriptions)
and the hash of that snapshot, the reference the DIM later checks for
staleness.

A flow whose proposal its caller brings (``Kernel.propose``, an :class:`Open`)
is opened the same way, for one agent and without a trigger: its context is
recorded, for the DIM to judge the proposal against, and sent to no agent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from kernel.context._layers import LayerBody, compile_layers, layer_body
from kernel.context._subscribers import Subscribers
from kernel.core.events import (
    ContextCompiled,
    Feedback,
    FlowCreated,
    Manifest,
    OnBehalf,
    Principal,
    Tier,
    TriggerFired,
)
from kernel.core.flow import FlowStatus
from kernel.core.ports import Clock, IdSource
from kernel.core.reasons import ReasonCode
from kernel.policy.contracts import WorkingContext
from kernel.runtime.actors import Mailbox, Outbox
from kernel.runtime.messages import (
    AgentMessage,
    Compile,
    CompilerMessage,
    DimMessage,
    FireTrigger,
    Judge,
    Open,
)
from kernel.state.principals import tenant_of
from kernel.state.projections import AgentStatus, Projections, context_ref
from kernel.state.rulebook import RuleSearch

_NOT_ACTIVE = {
    AgentStatus.PASSIVE: ReasonCode.AGENT_PASSIVE,
    AgentStatus.SUSPENDED: ReasonCode.AGENT_SUSPENDED,
    AgentStatus.RETIRED: ReasonCode.AGENT_RETIRED,
}


class ContextCompiler:
    """The context compiler actor.

    ``subscribers`` is the index of whom a topic wakes, shared with the kernel (which
    counts a trigger's flows by it) and kept across the compiler's restarts; one of its
    own over ``hosts`` when none is given. ``dim``: where the proposal an :class:`Open`
    brings is judged (without it, an Open's proposal is not sent: its caller's is).
    """

    def __init__(
        self,
        projections: Projections,
        clock: Clock,
        ids: IdSource,
        hosts: Mapping[str, Mailbox[AgentMessage]],
        schemas: Mapping[str, Any] | None = None,
        rule_search: RuleSearch | None = None,
        principal: Principal | None = None,
        subscribers: Subscribers | None = None,
        dim: Mailbox[DimMessage] | None = None,
    ) -> None:
        self._dim = dim
        # A trigger's flows act for the principal the host vouches for (None: nobody,
        # and the DIM refuses their proposals PRINCIPAL_MISSING).
        self._on_behalf = (
            OnBehalf(principal=principal, tier=Tier.BACKGROUND) if principal is not None else None
        )
        self._rule_search = rule_search
        self._schemas = schemas or {}
        self._projections = projections
        self._clock = clock
        self._ids = ids
        self._hosts = hosts
        self._subscribers = subscribers or Subscribers(hosts, projections)

    async def handle(self, msg: CompilerMessage, out: Outbox) -> None:
        match msg:
            case FireTrigger():
                self._fire(msg, out)
            case Compile():
                self._compile(msg, out)
            case Open():
                self._open(msg, out)

    def _open(self, msg: Open, out: Outbox) -> None:
        agent = self._projections.agents.get(msg.agent_id)
        refused = _unopened(msg, agent, out)
        if refused is not None:
            out.reply(msg.reply, refused)
            return
        assert agent is not None
        out.emit(
            FlowCreated(
                root_dfid=msg.root_dfid or msg.dfid,
                topic=msg.topic,
                traceparent=msg.traceparent,
                conversation_id=msg.conversation_id,
                tool_call_id=msg.tool_call_id,
                on_behalf=msg.on_behalf,
                agent_version=agent.manifest.agent_version,
            ),
            dfid=msg.dfid,
            parent_dfid=msg.parent_dfid,
            agent_id=msg.agent_id,
        )
        self._compile(Compile(dfid=msg.dfid, attempt=1), out, route=False, behalf=msg.on_behalf)
        opened = out.flow(msg.dfid)
        assert opened is not None
        out.reply(msg.reply, opened.context_ref)
        if msg.judge is not None and self._dim is not None:
            out.send_early(self._dim, _judge_on(msg.judge, opened.context_ref))

    def _fire(self, msg: FireTrigger, out: Outbox) -> None:
        root = self._projections.flows.get(msg.parent_dfid) if msg.parent_dfid else None
        root_dfid = root.root_dfid if root else None
        trigger = out.emit(TriggerFired(topic=msg.topic, facts=msg.facts, source=msg.source))
        # Facts of triggers staged in this batch are not in the projections yet, but
        # they are what the agents woken now must see.
        staged: dict[str, Any] = out.scratch.setdefault("facts", {})
        if msg.facts:
            staged.update(msg.facts)
            out.scratch.pop("refs", None)  # the state changed: references seen so far are stale
            out.scratch.pop("bodies", None)  # and so are the layers compiled so far
        dfids = []
        for agent_id in self._subscribers.of(msg.topic):
            agent = self._projections.agents[agent_id]
            dfid = self._ids.new_dfid()
            out.emit(
                FlowCreated(
                    root_dfid=root_dfid or dfid,
                    topic=msg.topic,
                    traceparent=msg.traceparent,
                    on_behalf=self._on_behalf,
                    agent_version=agent.manifest.agent_version,
                ),
                dfid=dfid,
                parent_dfid=msg.parent_dfid,
                agent_id=agent_id,
                after=trigger,
            )
            self._compile(Compile(dfid=dfid, attempt=1), out, behalf=self._on_behalf)
            dfids.append(dfid)
        out.reply(msg.reply, dfids)

    def _ref(self, subscriptions: list[str], staged: dict[str, Any] | None, out: Outbox) -> str:
        """Return the reference of what these subscriptions see, once per state per batch."""
        refs: dict[tuple[str, ...], str] = out.scratch.setdefault("refs", {})
        key = tuple(subscriptions)
        ref = refs.get(key)
        if ref is None:
            ref = refs[key] = context_ref(self._projections.visible_state(key, staged))
        return ref

    def _body(
        self,
        manifest: Manifest,
        topic: str,
        staged: dict[str, Any] | None,
        as_of: int,
        out: Outbox,
        tenant: str,
    ) -> LayerBody:
        """Return what the flows of ``topic`` for ``tenant`` show this agent, once per batch."""
        bodies: dict[tuple[str, str, int, str], LayerBody] = out.scratch.setdefault("bodies", {})
        key = (manifest.agent_id, topic, as_of, tenant)
        body = bodies.get(key)
        if body is None or body.manifest is not manifest:
            body = bodies[key] = layer_body(
                self._projections,
                manifest,
                self._schemas,
                topic,
                staged=staged,
                as_of_ns=as_of,
                search=self._rule_search,
                tenant=tenant,
            )
        return body

    def _compile(
        self, msg: Compile, out: Outbox, *, route: bool = True, behalf: OnBehalf | None = None
    ) -> None:
        """Compile attempt ``msg.attempt`` of a flow (``behalf``: whom one opened now acts for)."""
        flow = out.flow(msg.dfid)
        if flow is None or flow.status not in (FlowStatus.CREATED, FlowStatus.ACTIVE):
            return
        if flow.compiled != msg.attempt - 1 or flow.attempts != msg.attempt - 1:
            return  # a compile request overtaken by events
        agent = self._projections.agents[flow.agent_id]
        staged = out.scratch.get("facts")
        # A flow opened in this batch is not folded yet: whom it acts for comes with it.
        tenant = (
            behalf.principal.tenant
            if behalf is not None
            else tenant_of(self._projections, msg.dfid)
        )
        # The reference covers everything the agent is entitled to see, whatever the
        # limits show it: the DIM recomputes it the same way to detect a stale context.
        ref = self._ref(agent.manifest.subscriptions, staged, out)
        # One recorded time per batch: the time window's "now" and the memory's
        # generated_at (a flow's layers are a function of it, so it is recorded).
        as_of = out.scratch.setdefault("as_of", self._clock.now_ns())
        layers = compile_layers(
            self._projections,
            flow,
            agent.manifest,
            self._schemas,
            staged=staged,
            as_of_ns=as_of,
            search=self._rule_search,
            body=self._body(agent.manifest, flow.topic, staged, as_of, out, tenant),
            tenant=tenant,
        )
        context = ContextCompiled(
            attempt=msg.attempt,
            context_ref=ref,
            state=layers.state,
            feedback=msg.feedback,
            tokens=layers.tokens,
            dropped=layers.dropped,
            as_of_ns=as_of,
            rules=layers.rules,
            artifacts=layers.artifacts,
            memory_hash=layers.memory_hash,
            reactivated=layers.reactivated,
        )
        _stage_context(out, msg.dfid, context)
        host = self._hosts.get(flow.agent_id) if route else None
        if host is None:
            return
        ctx = WorkingContext(
            dfid=msg.dfid,
            agent_id=flow.agent_id,
            attempt=msg.attempt,
            topic=flow.topic,
            state=layers.state,
            context_ref=ref,
            now_ns=self._clock.now_ns(),
            root_dfid=flow.root_dfid,
            parent_dfid=flow.parent_dfid,
            feedback=msg.feedback,
            session=layers.session,
            memory=layers.memory,
            artifacts=layers.artifacts,
            artifact_info=layers.artifact_info,
            schemas=layers.schemas,
            tokens=layers.tokens,
            dropped=layers.dropped,
            knowledge=layers.knowledge,
        )
        if host.direct is not None:
            # A synchronous agent may reason on it before it is durable: its answer is
            # then recorded in the same append as this context (kernel.api, lever 4).
            out.send_early(host, ctx)
        else:
            out.send(host, ctx)


def _judge_on(judge: Judge, context_ref: str) -> Judge:
    """``judge`` as the DIM takes it: an admitted proposal citing no context cites this one."""
    if judge.invalid is not None or judge.proposal.context_ref:
        return judge
    proposal = msgspec.structs.replace(judge.proposal, context_ref=context_ref)
    return msgspec.structs.replace(judge, proposal=proposal)


def _unopened(msg: Open, agent: Any, out: Outbox) -> Feedback | None:
    """Why ``msg``'s flow is not opened (None: it is)."""
    if agent is None or agent.status is not AgentStatus.ACTIVE:
        # As for a trigger, no flow is opened for an agent that may not act.
        code = _NOT_ACTIVE.get(agent.status) if agent else ReasonCode.UNKNOWN_AGENT
        status = agent.status if agent else "unknown"
        detail = f"agent {msg.agent_id} is {status}: no flow was opened"
        return Feedback(reason_code=code or ReasonCode.UNKNOWN_AGENT, detail=detail)
    if out.flow(msg.dfid) is not None:
        # The caller looks its keys up first; a DFID is never opened twice.
        detail = f"flow {msg.dfid} exists already"
        return Feedback(reason_code=ReasonCode.FLOW_NOT_ACTIVE, detail=detail)
    return None


def _stage_context(out: Outbox, dfid: str, context: ContextCompiled) -> None:
    """Stage a flow's context: with its FlowCreated when that is the last event staged."""
    # A flow's first context travels with its FlowCreated: one row, two events.
    if out.travel_with(dfid, context) is None:
        out.emit(context, dfid=dfid)
