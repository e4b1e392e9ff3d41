"""One call: a proposal in, a Decision out; a conversation is one DecisionFlow.

:meth:`Proposals.propose` (``Kernel.propose``) is how code that already holds a
proposal (a framework's tool call, an MCP tool, an inbox row) puts it before the
kernel. It opens a flow for the agent with that proposal (the compiler records the
context the proposal is judged against, and wakes no agent), has the DIM judge it
as any other, waits for the execution when it is accepted, and answers a
:class:`Decision` the model can act on.

A ``conversation`` (a framework's run or thread id) is one DecisionFlow, with one retry
governor and one view of the state across its calls (kernel.api.conversations).

A call keyed by (conversation, tool-call id) is idempotent: its DFID is derived
from the key, so the same key proposed again (a framework resuming a saved run
twice, even after a restart) is answered from the recorded flow, never with a
second effect (recorded as DuplicateSuppressed).

The governor's count lives in memory: a restarted kernel counts again from zero,
while a stop is recorded and survives.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import msgspec
from opentelemetry.context import Context

from kernel.api.calls import Calls, Flows
from kernel.api.conversations import (
    Ask,
    CallSpec,
    Conversation,
    Keys,
    admitted_call,
    admitted_usage,
    load_conversation,
)
from kernel.api.decisions import (
    Decision,
    DecisionVerdict,
    Judged,
    call_dfid,
    conversation_dfid,
    decision_of,
    keyed_dfid,
    unopened,
    verdict_decision,
)
from kernel.api.edge import Edge, admitted
from kernel.api.outage import Outage
from kernel.api.principals import on_behalf_of
from kernel.api.wiring import Actors
from kernel.core import wall
from kernel.core.events import (
    Draft,
    DuplicateSuppressed,
    Event,
    Feedback,
    InputRefused,
    Principal,
    ProposalRecord,
    SubmissionRefused,
    Tier,
)
from kernel.core.flow import TERMINAL, FlowState, FlowStatus, IllegalTransition
from kernel.core.ports import Clock, IdSource
from kernel.core.reasons import ReasonCode
from kernel.core.wall import InputInvalid, clip
from kernel.journal.store import Journal
from kernel.policy.contracts import Outcome, Proposal, Verdict
from kernel.runtime.actors import Reply
from kernel.runtime.messages import Judge, Open, Streak
from kernel.state.projections import Projections, context_ref


class Proposals:
    """The kernel's one entry for a given proposal, and the conversations it groups.

    Args:
        journal: the record (flows read back, refusals recorded).
        projections: the kernel's projections.
        actors: the compiler opens the flow, the DIM judges it.
        calls: calls into the actors.
        flows: waits for a flow's end and reads forgotten ones back.
        clock: the proposal's validity window starts now.
        ids: DFIDs of calls that name no key.
        token_of: the session token the kernel holds for an agent, or None.
        edge: what a proposal goes through before its verdict (kernel.api.edge: personal
            fields sealed, meaning scored once its flow is open); None: nothing.
        validity_s: how long a proposal stays valid (it is judged at once).
        kept: conversations kept in memory between calls (the least recent go first;
            one that goes forgets its governor's count, not its stop).
        principal: the principal the host vouches for (``KernelConfig.principal``): a
            call that names none acts for it (None: for nobody, refused by the DIM).
        outage: answers calls while the journal's store is away (kernel.api.outage).
    """

    def __init__(
        self,
        journal: Journal,
        projections: Projections,
        actors: Actors,
        calls: Calls,
        flows: Flows,
        *,
        clock: Clock,
        ids: IdSource,
        token_of: Callable[[str], str | None],
        edge: Edge | None = None,
        validity_s: float = 600.0,
        kept: int = 4096,
        principal: Principal | None = None,
        outage: Outage | None = None,
    ) -> None:
        self._journal = journal
        self._projections = projections
        self._actors = actors
        self._calls = calls
        self._flows = flows
        self._clock = clock
        self._ids = ids
        self._token_of = token_of
        # No edge given: nothing to seal or score (the same calls, doing nothing).
        self._edge = edge or Edge(journal, projections)
        self._validity_ns = int(validity_s * 1e9)
        self._kept = kept
        self._principal = principal
        self._conversations: OrderedDict[str, Conversation] = OrderedDict()
        self._keys = Keys()
        self._outage = outage

    # --- the entries ---------------------------------------------------------------

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
        """Propose ``kind`` with ``params`` as ``agent_id``; return the decision once known.

        Answered once its execution ended (EXECUTED, FAILED), at once if escalated or
        refused (a reason code, never an exception). Acts for ``principal``, else the
        host's (kernel.api.principals.on_behalf_of); ``usage`` (tokens by model) is
        charged to the reasoning budgets before the verdict, as a hosted agent's is.

        Raises:
            KernelShutdown: the kernel stopped.
        """
        self._calls.raise_if_stopped()
        try:
            call = admitted_call(agent_id, kind, conversation, tool_call_id, trace_context)
            behalf = on_behalf_of(
                self._projections, self._principal, call.agent_id, principal, tier, delegation
            )
        except InputInvalid as exc:
            return await self._refuse_input(exc, agent_id)
        token = self._token_of(call.agent_id)
        outage = self._outage
        away = await outage.answer(call, params, bool(token), behalf) if outage else None
        if away is not None:
            return msgspec.structs.replace(away, tool_call_id=call.tool_call_id or "")
        if token is None:
            return await self._no_session(call)
        ask = Ask(
            call=call,
            token=token,
            policy={**params, "kind": call.kind} if isinstance(params, Mapping) else params,
            explain=explain,
            confidence=confidence,
            usage=admitted_usage(usage),
            behalf=behalf,
        )
        if call.conversation is None:
            return await self._alone(ask)
        return await self._in_conversation(ask, call.conversation)

    async def _alone(self, ask: Ask) -> Decision:
        """One call of no conversation: keyed by its tool-call id, if it has one."""
        call, tool_call_id = ask.call, ask.call.tool_call_id or ""
        key = call_dfid(call.agent_id, None, tool_call_id) if tool_call_id else None
        async with self._keys.held(key):
            known = await self._known(key) if key is not None else None
            if known is None:
                judged = await self._judge(ask, key or self._ids.new_dfid(), None)
        if known is not None:
            return await self._replay(known, tool_call_id, "")
        return await self._settle(judged)

    async def _in_conversation(self, ask: Ask, conversation: str) -> Decision:
        """One call of a conversation: its flow, its governor, its view of the state."""
        call, tool_call_id = ask.call, ask.call.tool_call_id or ""
        conv = self._conversation(call.agent_id, conversation)
        conv.users += 1
        try:
            async with conv.lock:
                if not conv.loaded:
                    await load_conversation(self._journal, conv)
                known = await self._known_call(conv, tool_call_id)
                if known is None:
                    if conv.stopped:
                        return await self._refuse_stopped(conv, tool_call_id)
                    judged = await self._judge(ask, self._next_dfid(conv, call), conv)
            # The lock covers the verdict only: a conversation's next call (a parallel
            # tool call) need not wait for this one's execution.
            if known is not None:
                return await self._replay(known, tool_call_id, conv.dfid)
            decision = await self._settle(judged)
            # What the model knows now: its next call is judged against this state.
            conv.context_ref = self._visible_ref(call.agent_id)
            return decision
        finally:
            conv.users -= 1
            self._forget_idle()

    def _next_dfid(self, conv: Conversation, call: CallSpec) -> str:
        """The flow of a conversation's next call: the conversation's own first, then keyed."""
        if not conv.opened:
            return conv.dfid
        if call.tool_call_id:
            return call_dfid(call.agent_id, conv.id, call.tool_call_id)
        return self._ids.new_dfid()

    async def _no_session(self, call: CallSpec) -> Decision:
        """Refuse, on record, a call of an agent that has no session."""
        detail = (
            f"agent {call.agent_id} has no session in this kernel:"
            " register it or open one with Kernel.handshake first"
        )
        refused = SubmissionRefused(
            reason_code=ReasonCode.INVALID_SESSION, detail=detail, claimed_agent=call.agent_id
        )
        await self._record(refused)
        return Decision(
            verdict=DecisionVerdict.REFUSED,
            reason_code=ReasonCode.INVALID_SESSION,
            detail=detail,
            tool_call_id=call.tool_call_id or "",
        )

    # A timeout here is an answer (the decision as it stands), not a failure: a
    # cancel scope around the call could not say which decision it had reached.
    async def await_decision(
        self,
        dfid: str,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Decision:
        """Wait until flow ``dfid`` ended, at most ``timeout`` seconds; return its decision.

        Past the timeout the answer is the flow as it stands (ESCALATED, PENDING);
        ``None`` waits until it ended. An unknown DFID is answered at once: REFUSED,
        FLOW_NOT_ACTIVE.

        Raises:
            KernelShutdown: the kernel stopped.
        """
        try:
            dfid = wall.admit({"agent_id": dfid}, wall.AgentSpec).agent_id
        except InputInvalid as exc:
            return Decision(
                verdict=DecisionVerdict.REFUSED,
                reason_code=exc.reason_code,
                detail=f"a DFID is an id: {exc.detail}",
                field="dfid",
            )
        flow = self._projections.flows.get(dfid) or await self._flows.recall(dfid)
        if flow is None:
            return Decision(
                verdict=DecisionVerdict.REFUSED,
                dfid=dfid,
                reason_code=ReasonCode.FLOW_NOT_ACTIVE,
                detail=f"no flow {dfid}",
            )
        if not flow.terminal:
            with anyio.move_on_after(timeout):
                flow = await self._flows.wait_flow(dfid, TERMINAL)
            flow = self._projections.flows.get(dfid) or flow
        return await decision_of(self._journal, flow)

    async def open_flow(
        self,
        agent_id: str,
        token: str,
        policy: Mapping[str, Any],
        *,
        explain: str,
        confidence: float,
        key: str,
        topic: str,
    ) -> Feedback | None:
        """Open the flow keyed ``key`` for ``agent_id`` with ``policy`` in it, and judge it.

        The inbox's entry (``propose`` rows): it returns once the verdict is recorded,
        never waiting for a human or an adapter. Returns why no flow was opened, or
        None: the flow is open now, or was opened under ``key`` before.
        """
        dfid = keyed_dfid("open", agent_id, key)
        async with self._keys.held(dfid):
            if await self._known(dfid) is not None:
                return None
            record, invalid = self._proposal(policy, explain, confidence, "")
            behalf = on_behalf_of(self._projections, self._principal, agent_id)
            reply: Reply[Verdict] = Reply()
            judge = Judge(
                dfid=dfid, proposal=record, token=token, invalid=invalid, reply=reply, single=True
            )
            msg = Open(dfid=dfid, agent_id=agent_id, topic=topic, reply=Reply(), on_behalf=behalf)
            opened = await self._open_judged(msg, judge)
            if isinstance(opened, Feedback):
                return opened
        return None

    # --- one call ----------------------------------------------------------------

    async def _judge(self, ask: Ask, dfid: str, conv: Conversation | None) -> Judged:
        """Open the call's flow as ``dfid``, judge its proposal, count it in its conversation.

        The flow's opening, the verdict and the intent are one append when nothing the
        proposal goes through waits on the open flow (no meaning to score, no outage to
        watch the opening for): the compiler hands the proposal to the DIM with its
        batch (:class:`Open` ``judge``). Otherwise the flow is opened first.
        """
        call = ask.call
        tool_call_id = call.tool_call_id or ""
        conversation = conv.dfid if conv is not None else ""
        # "": judged against the context its opening compiles (the compiler fills it in).
        seen = conv.context_ref if conv is not None and conv.context_ref is not None else ""
        record, invalid = self._proposal(ask.policy, ask.explain, ask.confidence, seen)
        reply: Reply[Verdict] = Reply()
        judge = Judge(
            dfid=dfid,
            proposal=record,
            token=ask.token,
            invalid=invalid,
            reply=reply,
            single=True,
            streak=None if conv is None else self._streak(conv, call.agent_id),
            usage=ask.usage,
        )
        # Its answer is built from what commits (no read back): watched from before it opens.
        events = self._flows.watch(dfid)
        try:
            opened = await self._open_call(ask, dfid, conv, judge)
            if not isinstance(opened, str):
                self._flows.unwatch(dfid)
                return unopened(opened, conversation, tool_call_id)
            if conv is not None:
                self._opened_in(conv, dfid, tool_call_id)
            verdict = await self._calls.wait(reply)
        except BaseException:
            self._flows.unwatch(dfid)
            raise
        if conv is not None:
            conv.count(verdict)
        return Judged(
            dfid=dfid,
            verdict=verdict,
            conversation_dfid=conversation,
            tool_call_id=tool_call_id,
            events=events,
        )

    async def _open_call(
        self, ask: Ask, dfid: str, conv: Conversation | None, judge: Judge
    ) -> str | Feedback | Decision:
        """Open the call's flow (in its conversation's) and have ``judge`` judged in it.

        Returns the flow's context, a refusal (``judge`` was not sent), or an answer.
        """
        call, policy, behalf = ask.call, ask.policy, ask.behalf
        root = conv.dfid if conv is not None and conv.opened else None
        if root is not None:
            await self._flows.recall(root)  # the governor may record the stop on it
        msg = Open(
            dfid=dfid,
            agent_id=call.agent_id,
            topic=call.kind,
            parent_dfid=root,
            root_dfid=root,
            traceparent=call.traceparent,
            conversation_id=conv.id if conv is not None else "",
            tool_call_id=call.tool_call_id or "",
            reply=Reply(),
            on_behalf=behalf,
        )
        outage = self._outage
        if outage is None:
            return await self._open_judged(msg, judge)
        return await outage.opened(
            lambda: self._open_judged(msg, judge), dfid, call, policy, behalf
        )

    async def _open_judged(self, msg: Open, judge: Judge) -> str | Feedback:
        """Open ``msg``'s flow and have ``judge`` judged in it; its context or the refusal."""
        edge = self._edge
        if not edge.scores and (self._outage is None or not self._outage.watches_opening):
            # Nothing waits between opening and verdict: one append (issue 45).
            if judge.invalid is None:
                judge = msgspec.structs.replace(judge, proposal=edge.seal(judge.proposal))
            return await self._open(msgspec.structs.replace(msg, judge=judge))
        opened = await self._open(msg)
        if isinstance(opened, Feedback):
            return opened
        record = judge.proposal
        if judge.invalid is None:
            cited = record.context_ref or opened
            record = await edge.prepare(
                msg.dfid, msgspec.structs.replace(record, context_ref=cited)
            )
        await self._actors.dim.send(msgspec.structs.replace(judge, proposal=record))
        return opened

    def _streak(self, conv: Conversation, agent_id: str) -> Streak:
        """Return the refusals in a row the conversation's next call is counted in."""
        agent = self._projections.agents.get(agent_id)
        limit = agent.manifest.max_attempts if agent is not None else 1
        return Streak(
            conversation_id=conv.id, root_dfid=conv.dfid, refused=conv.refused, limit=limit
        )

    @staticmethod
    def _opened_in(conv: Conversation, dfid: str, tool_call_id: str) -> None:
        """Note in its conversation that the call's flow ``dfid`` is open."""
        conv.opened = True
        if dfid == conv.dfid:
            conv.first_call = tool_call_id

    async def _open(self, msg: Open) -> str | Feedback:
        """Open a flow (room for it first); return its context's reference or the refusal."""
        await self._flows.admit(1)
        try:
            answer = await self._calls.call(self._actors.compiler, msg, msg.reply)
        finally:
            self._flows.release(1)
        if isinstance(answer, Verdict):
            # The compiler could not handle it (dead-lettered): a fault, answered as such.
            return answer.feedback or Feedback(reason_code=ReasonCode.KERNEL_FAULT)
        return answer

    def _proposal(
        self, policy: Any, explain: Any, confidence: Any, seen: str
    ) -> tuple[ProposalRecord, Feedback | None]:
        """Return the proposal's record and, when the wall refuses it, why (judged as such)."""
        proposal = Proposal(
            policy=policy,
            explain=explain,
            confidence=confidence,
            valid_until_ns=self._clock.now_ns() + self._validity_ns,
            context_ref=seen,
        )
        return admitted(proposal, policy=policy)

    async def _settle(self, judged: Judged) -> Decision:
        """Return the decision of a judged call, waiting for its execution if it was accepted."""
        try:
            return await self._settled(judged)
        finally:
            if judged.events is not None:
                self._flows.unwatch(judged.dfid)

    async def _settled(self, judged: Judged) -> Decision:
        if judged.decision is not None:
            return judged.decision
        verdict = judged.verdict
        assert verdict is not None
        if verdict.outcome in (Outcome.ACCEPTED, Outcome.DUPLICATE):
            flow = await self._flows.wait_flow(judged.dfid, TERMINAL | {FlowStatus.ESCALATED})
            return await decision_of(
                self._journal,
                flow,
                conversation_dfid=judged.conversation_dfid,
                tool_call_id=judged.tool_call_id,
                events=judged.events,
            )
        return verdict_decision(judged, verdict)

    # --- keys and conversations ----------------------------------------------------

    async def _known(self, dfid: str) -> FlowState | None:
        """Return the flow ``dfid`` if any kernel opened it (read back if forgotten)."""
        return self._projections.flows.get(dfid) or await self._flows.recall(dfid)

    async def _known_call(self, conv: Conversation, tool_call_id: str | None) -> FlowState | None:
        """Return the flow of a keyed call of ``conv`` proposed before, if any."""
        if not tool_call_id or not conv.opened:
            return None
        if tool_call_id == conv.first_call:
            return await self._known(conv.dfid)
        return await self._known(call_dfid(conv.agent_id, conv.id, tool_call_id))

    async def _replay(self, flow: FlowState, tool_call_id: str, conversation: str) -> Decision:
        """Answer a call proposed before from its flow's record: no second effect."""
        suppressed = DuplicateSuppressed(key=flow.intent_key, source="tool_call")
        await self._record(suppressed, flow.dfid)
        if not flow.terminal and flow.status is not FlowStatus.ESCALATED:
            flow = await self._flows.wait_flow(flow.dfid, TERMINAL | {FlowStatus.ESCALATED})
        return await decision_of(
            self._journal,
            flow,
            conversation_dfid=conversation,
            tool_call_id=tool_call_id,
            replayed=True,
        )

    def _conversation(self, agent_id: str, conversation: str) -> Conversation:
        dfid = conversation_dfid(agent_id, conversation)
        conv = self._conversations.get(dfid)
        if conv is None:
            conv = self._conversations[dfid] = Conversation(agent_id, conversation, dfid)
        else:
            self._conversations.move_to_end(dfid)
        return conv

    def _forget_idle(self) -> None:
        """Keep at most ``kept`` conversations in memory: the least recent idle ones go."""
        while len(self._conversations) > self._kept:
            idle = next((d for d, c in self._conversations.items() if c.users == 0), None)
            if idle is None:
                return
            del self._conversations[idle]

    async def _refuse_stopped(self, conv: Conversation, tool_call_id: str) -> Decision:
        """Refuse a call of a conversation the governor stopped, on the conversation's record."""
        detail = f"{conv.stopped}; start a new conversation"[:500]
        await self._flows.recall(conv.dfid)
        await self._record(
            SubmissionRefused(
                reason_code=ReasonCode.REASONING_EXHAUSTION,
                detail=detail,
                claimed_agent=conv.agent_id,
            ),
            conv.dfid,
        )
        return Decision(
            verdict=DecisionVerdict.REFUSED,
            reason_code=ReasonCode.REASONING_EXHAUSTION,
            detail=detail,
            conversation_dfid=conv.dfid,
            tool_call_id=tool_call_id,
        )

    def _visible_ref(self, agent_id: str) -> str | None:
        agent = self._projections.agents.get(agent_id)
        if agent is None:
            return None
        return context_ref(self._projections.visible_state(tuple(agent.manifest.subscriptions)))

    # --- refusals on record --------------------------------------------------------

    async def _refuse_input(self, exc: InputInvalid, agent_id: Any) -> Decision:
        """Record a call the wall refused before any flow could be named, and answer it."""
        detail = clip(f"{exc.field}: {exc.detail}", wall.MAX_DETAIL)
        await self._record(
            InputRefused(
                reason_code=exc.reason_code,
                entry="propose",
                field=clip(exc.field, 64),
                detail=clip(exc.detail, wall.MAX_DETAIL),
                target=clip(agent_id) if agent_id is not None else "",
            )
        )
        return Decision(
            verdict=DecisionVerdict.REFUSED,
            reason_code=exc.reason_code,
            detail=detail,
            field=exc.field,
        )

    async def _record(self, payload: Any, dfid: str | None = None) -> list[Event]:
        """Append one event of the kernel's own (a refusal, a duplicate noticed)."""
        self._calls.raise_if_stopped()
        try:
            return await self._journal.append([Draft(payload=payload, dfid=dfid)])
        except IllegalTransition:
            # Its flow was forgotten again meanwhile: the note is kept, without its flow.
            return await self._journal.append([Draft(payload=payload)])
