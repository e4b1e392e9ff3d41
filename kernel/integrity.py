"""The Decision Integrity Module: the deterministic gate every proposal passes.

The verdict is a pure function of (proposal, projected state, time, policy
packs), computed by :func:`kernel.gate.judge`; its docstring lists the layers
in their fixed order. Before them, the boundary checks the session token
(INVALID_SESSION) and the flow (FLOW_NOT_ACTIVE); refusals there touch no flow
and count no attempt.

Acceptance and escalation reserve what the proposal consumes (ResourceReserved,
in the same append as the verdict); whoever records the end of the flow
releases it (see ``Outbox.emit``). This actor is the only one that reserves,
and it counts what the current batch staged, so two proposals racing for the
last unit cannot both win.

A rejection with attempts left hands the agent its feedback through a fresh
context; the intent retry governor ends the flow with REASONING_EXHAUSTION
once the agent's attempts are spent. There is no default-allow path.

The DIM times each rule it runs (a :class:`~kernel.rules.Stopwatch` on real
monotonic time) and records a rule that overran its budget as a finding right
after the verdict: FlowFlagged (guard ``"rule budget"``), which marks the flow
NEEDS_REVIEW and names the rule, its pack, the budget and the measured time.
The verdict is the same whatever the time, so replay reproduces it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec

from kernel.actors import Mailbox, Outbox, Reply
from kernel.amendments import AmendLimit, Amendment, amend, folded, in_force
from kernel.approvals import escalation as escalation_event
from kernel.approvals import policy_trigger
from kernel.citations import notes_on
from kernel.context import Compile, context_ref
from kernel.contracts import Outcome, Verdict
from kernel.events import (
    DuplicateSuppressed,
    Feedback,
    FlowAborted,
    FlowFlagged,
    LimitAmended,
    ProposalAccepted,
    ProposalRecord,
    ProposalRejected,
    ProposalSubmitted,
    ResourceReleased,
    ResourceReserved,
    SubmissionRefused,
)
from kernel.flow import FlowState, FlowStatus
from kernel.gate import LAYERS, Judgement, MemoryCheck, Snapshot, judge, reject
from kernel.guard_runner import Screen
from kernel.intents import Dispatch, stage_start
from kernel.memory import MemoryState
from kernel.memory import check as check_memory
from kernel.pack_loading import LoadPack, load
from kernel.packs import PolicyCatalog
from kernel.ports import Clock
from kernel.projection import AgentView, Projections
from kernel.reasons import ReasonCode
from kernel.registry import session_hash
from kernel.rules import Overrun, Stopwatch

log = logging.getLogger("kernel.integrity")

BUDGET_GUARD = "rule budget"
"""The name a rule's budget overrun is flagged under (FlowFlagged.guard)."""


class Validate(msgspec.Struct, frozen=True, kw_only=True):
    """A proposal to judge: from an agent (with its token) or a human modification."""

    dfid: str
    proposal: ProposalRecord
    token: str = ""
    by_human: bool = False
    invalid: Feedback | None = None
    reply: Reply[Verdict] | None = None


class Withdraw(msgspec.Struct, frozen=True, kw_only=True):
    """An agent gives up on a flow: it declined to act, or its reasoning failed."""

    dfid: str
    token: str
    attempt: int
    reason_code: ReasonCode
    detail: str = ""


class Escalate(msgspec.Struct, frozen=True, kw_only=True):
    """Tell the escalation manager a flow now waits for a human."""

    dfid: str


class Execute(msgspec.Struct, frozen=True, kw_only=True):
    """Carry out the accepted intent of a flow."""

    dfid: str
    reply: Reply[Verdict] | None = None


def evaluate(
    proposal: ProposalRecord,
    agent: AgentView,
    catalog: PolicyCatalog,
    now_ns: int,
    current_ref: str,
    *,
    by_human: bool = False,
    memory: MemoryState | None = None,
    correlation_id: str = "",
) -> Feedback | None:
    """Run the pipeline on a bare snapshot; return the rejection's feedback, or None."""
    snapshot = Snapshot(context_ref=current_ref)
    check = memory_check(memory, correlation_id) if memory is not None else None
    return judge(
        proposal, agent, catalog, now_ns, snapshot, by_human=by_human, memory=check
    ).rejection


class FactCapacities(Mapping[str, int]):
    """Capacities set by ``capacity.<pool>`` facts, looked up only for the pools needed."""

    def __init__(self, projections: Projections) -> None:
        self._state = projections.state

    def __getitem__(self, pool: str) -> int:
        return int(self._state["capacity." + pool].value)

    def __contains__(self, pool: object) -> bool:
        return isinstance(pool, str) and "capacity." + pool in self._state

    def __iter__(self) -> Iterator[str]:
        return (k.removeprefix("capacity.") for k in self._state if k.startswith("capacity."))

    def __len__(self) -> int:
        return sum(1 for _ in self)


# --- execution coordination (issue 4): kept apart so the layers above can change freely.
def unsettled(projections: Projections, agent_id: str) -> Feedback | None:
    """Refuse with AGENT_PASSIVE while one of the agent's sagas has effects not converged.

    An agent whose earlier intent is half done and being undone (DIRTY), or
    waiting for a human after an undo failed, may start no new side effects.
    """
    flows = projections.unsettled_flows(agent_id)
    if not flows:
        return None
    return reject(
        "status",
        ReasonCode.AGENT_PASSIVE,
        f"agent {agent_id} has flow(s) {', '.join(flows)} with effects not yet converged",
    )


def memory_check(memory: MemoryState, correlation_id: str) -> MemoryCheck:
    """The memory layer over governed memory: enforced constraints refuse (kernel.memory)."""
    return lambda proposal, view: check_memory(memory, proposal, view.agent_id, correlation_id)


def with_unsettled(judgement: Judgement, projections: Projections, agent_id: str) -> Judgement:
    """Put the unsettled-saga refusal (a status layer check) at its place in the order."""
    rejection = judgement.rejection
    if rejection is not None and (
        rejection.layer not in LAYERS or LAYERS.index(rejection.layer) <= LAYERS.index("status")
    ):
        return judgement
    refusal = unsettled(projections, agent_id)
    return judgement if refusal is None else Judgement(rejection=refusal, pack=judgement.pack)


class IntegrityModule:
    """The DIM actor."""

    def __init__(
        self,
        projections: Projections,
        catalog: PolicyCatalog,
        clock: Clock,
        compiler: Mailbox[Any],
        escalation: Mailbox[Any],
        execution: Mailbox[Any],
        memory: MemoryCheck | None = None,
        guards: Mailbox[Any] | None = None,
        rule_clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        # Measures rules beside the verdict; real time is right: it decides nothing.
        self._rule_clock = rule_clock
        self._memory = memory
        self._guards = guards
        self._capacities = FactCapacities(projections)
        self._projections = projections
        self._catalog = catalog
        self._clock = clock
        self._compiler = compiler
        self._escalation = escalation
        self._execution = execution

    async def handle(self, msg: Validate | Withdraw | AmendLimit | LoadPack, out: Outbox) -> None:
        match msg:
            case Validate():
                self._validate(msg, out)
            case AmendLimit():
                self._amend(msg, out)
            case LoadPack():
                load(msg, self._catalog, self._projections.packs, out)
            case Withdraw():
                flow = out.flow(msg.dfid)
                owner = self._projections.sessions.get(session_hash(msg.token))
                if (
                    flow is not None
                    and flow.agent_id == owner
                    and flow.awaiting_proposal
                    and flow.compiled == msg.attempt
                ):
                    out.emit(
                        FlowAborted(reason_code=msg.reason_code, detail=msg.detail), dfid=msg.dfid
                    )

    def _amend(self, msg: AmendLimit, out: Outbox) -> None:
        event = amend(msg, self._catalog, self._projections.agents, self._clock.now_ns())
        out.emit(event, agent_id=msg.agent_id or None)
        if isinstance(event, LimitAmended):
            # In force for the proposals this batch judges after it, as replay will see it.
            staged: dict[str, dict[str, Amendment]] = out.scratch.setdefault("amended", {})
            staged.setdefault(msg.agent_id, {})[event.limit] = folded(event, 0)
        out.reply(msg.reply, event)

    def _amendments(self, agent_id: str, now_ns: int, out: Outbox) -> dict[str, int | str]:
        amended = self._projections.amendments.get(agent_id, {})
        staged = out.scratch.get("amended", {}).get(agent_id)
        return in_force({**amended, **staged} if staged else amended, now_ns)

    def _validate(self, msg: Validate, out: Outbox) -> None:
        flow = out.flow(msg.dfid)
        agent_id = self._projections.sessions.get(session_hash(msg.token)) if msg.token else None
        if not msg.by_human and agent_id is None:
            self._refuse(
                msg, flow, ReasonCode.INVALID_SESSION, "the session token is not valid", out
            )
            return
        if flow is None or (not msg.by_human and flow.agent_id != agent_id):
            self._refuse(
                msg, None, ReasonCode.FLOW_NOT_ACTIVE, f"no flow {msg.dfid} for this agent", out
            )
            return
        ready = flow.status is FlowStatus.VALIDATING if msg.by_human else flow.awaiting_proposal
        if not ready:
            if flow.proposal == msg.proposal and flow.status not in (
                FlowStatus.VALIDATING,
                FlowStatus.ACTIVE,
            ):
                self._duplicate(msg, flow, out)
            elif flow.status is FlowStatus.ACTIVE:
                self._refuse(
                    msg, flow, ReasonCode.FLOW_NOT_ACTIVE, "the flow awaits a fresh context", out
                )
            else:
                self._refuse(msg, flow, ReasonCode.FLOW_NOT_ACTIVE, f"flow is {flow.status}", out)
            return

        agent = self._projections.agents[flow.agent_id]
        attempt = flow.attempts + (0 if msg.by_human else 1)
        submitted = out.emit(
            ProposalSubmitted(attempt=attempt, proposal=msg.proposal, by_human=msg.by_human),
            dfid=msg.dfid,
        )
        # Citations and advisory constraints are recorded, never judged (kernel.citations).
        for note in notes_on(self._projections.memory, flow, msg.proposal):
            out.emit(note, dfid=msg.dfid, agent_id=flow.agent_id, after=submitted)
        visible, ref = self._visible(agent.manifest.subscriptions, out)
        # What this batch staged but has not committed yet counts as held.
        staged: dict[str, dict[str, int]] = out.scratch.setdefault("reserved", {})
        held = dict(self._projections.held)
        for dfid, pools in staged.items():
            before = self._projections.reservations.get(dfid, {})
            for pool, amount in pools.items():
                held[pool] = held.get(pool, 0) + amount - before.get(pool, 0)
        own = staged.get(msg.dfid, self._projections.reservations.get(msg.dfid, {}))
        now_ns = self._clock.now_ns()
        snapshot = Snapshot(
            context_ref=ref,
            state=visible,
            held=held,
            own=own,
            capacities=self._capacities,
            amendments=self._amendments(flow.agent_id, now_ns, out),
        )
        stopwatch = Stopwatch(self._rule_clock)
        if msg.invalid is not None:
            judgement = Judgement(rejection=msg.invalid)
        else:
            judgement = judge(
                msg.proposal,
                agent,
                self._catalog,
                now_ns,
                snapshot,
                by_human=msg.by_human,
                memory=self._memory or memory_check(self._projections.memory, flow.root_dfid),
                stopwatch=stopwatch,
            )
        overruns = stopwatch.overruns
        if not msg.by_human:
            judgement = with_unsettled(judgement, self._projections, flow.agent_id)
        if judgement.rejection is not None:
            self._rejected(msg, agent, attempt, judgement, submitted, overruns, out)
            return
        escalation = judgement.escalation
        if escalation is None and not msg.by_human:
            # The kind's own rule: authority threshold, ambiguity (kernel/approvals.py).
            trigger = policy_trigger(msg.proposal, self._catalog)
            if trigger is not None:
                escalation = reject("escalation", trigger.reason_code, trigger.detail)
        if escalation is not None:
            event = escalation_event(
                msg.dfid, msg.proposal, self._catalog, escalation.reason_code, escalation.detail
            )
            verdict = out.emit(
                msgspec.structs.replace(event, pack=judgement.pack, rule=escalation.rule),
                dfid=msg.dfid,
                after=submitted,
            )
            self._flag(msg, judgement, overruns, verdict, out)
            self._reserve(msg.dfid, flow.agent_id, judgement, own, verdict, out)
            self._screen(msg, snapshot.state, out)
            out.send(self._escalation, Escalate(dfid=msg.dfid))
            out.reply(
                msg.reply,
                Verdict(
                    outcome=Outcome.ESCALATED, dfid=msg.dfid, attempt=attempt, feedback=escalation
                ),
            )
            return
        verdict = out.emit(
            ProposalAccepted(attempt=attempt, by_human=msg.by_human, pack=judgement.pack),
            dfid=msg.dfid,
            after=submitted,
        )
        self._flag(msg, judgement, overruns, verdict, out)
        self._reserve(msg.dfid, flow.agent_id, judgement, own, verdict, out)
        self._screen(msg, snapshot.state, out)
        # The start of execution goes into this append too (one commit fewer per flow);
        # the engine calls the adapter only once it is recorded (kernel.intents).
        accepted = out.flow(msg.dfid)
        assert accepted is not None
        intent = stage_start(self._catalog, accepted, out, policy=judgement.policy)
        if intent is not None:
            out.send(self._execution, Dispatch(dfid=msg.dfid, key=intent.key))
        out.reply(msg.reply, Verdict(outcome=Outcome.ACCEPTED, dfid=msg.dfid, attempt=attempt))

    def _visible(self, subscriptions: list[str], out: Outbox) -> tuple[dict[str, Any], str]:
        """Return the state these subscriptions see and its reference, once per batch.

        The DIM stages no facts, so the state cannot change within its batch; the
        agents of one batch mostly share their subscriptions.
        """
        seen: dict[tuple[str, ...], tuple[dict[str, Any], str]]
        seen = out.scratch.setdefault("visible", {})
        key = tuple(subscriptions)
        found = seen.get(key)
        if found is None:
            visible = self._projections.visible_state(key)
            found = seen[key] = (visible, context_ref(visible))
        return found

    def _flag(
        self,
        msg: Validate,
        judgement: Judgement,
        overruns: list[Overrun],
        verdict: int,
        out: Outbox,
    ) -> None:
        """Record each rule that overran its budget: the flow needs review, the verdict stands."""
        if not overruns:
            return
        pack = self._catalog.pack_of.get(msg.proposal.kind)
        of_pack = f" of pack {pack.name} {pack.version}" if pack is not None else ""
        for o in overruns:
            reason = (
                f"rule {o.rule}{of_pack} took {o.took_us} us, over its budget of {o.budget_us} us"
                " (the verdict does not depend on it; make the rule cheaper or raise its budget)"
            )
            log.warning("flow %s: %s", msg.dfid, reason)
            out.emit(
                FlowFlagged(
                    guard=BUDGET_GUARD,
                    reason=reason,
                    rule=o.rule,
                    budget_us=o.budget_us,
                    took_us=o.took_us,
                    pack=judgement.pack,
                ),
                dfid=msg.dfid,
                after=verdict,
            )

    def _screen(self, msg: Validate, state: Mapping[str, Any], out: Outbox) -> None:
        """Hand a proposal let through to the soft guards, once its verdict is recorded."""
        if self._guards is not None and msg.proposal.kind in self._catalog.guards_of:
            # Its own copy: the state seen is shared by the flows of this batch.
            screen = Screen(dfid=msg.dfid, proposal=msg.proposal, state=dict(state))
            out.send(self._guards, screen)

    def _reserve(
        self,
        dfid: str,
        agent_id: str,
        judgement: Judgement,
        own: Mapping[str, int],
        verdict: int,
        out: Outbox,
    ) -> None:
        """Stage what the flow now holds: new amounts reserved, pools no longer needed released."""
        want = judgement.reserve
        for pool, amount in sorted(want.items()):
            if own.get(pool) != amount:
                out.emit(
                    ResourceReserved(pool=pool, amount=amount),
                    dfid=dfid,
                    agent_id=agent_id,
                    after=verdict,
                )
        for pool, amount in sorted(own.items()):
            if pool not in want:
                out.emit(
                    ResourceReleased(pool=pool, amount=amount, reason="modified"),
                    dfid=dfid,
                    agent_id=agent_id,
                    after=verdict,
                )
        if want or own:
            out.scratch["reserved"][dfid] = dict(want)

    def _rejected(
        self,
        msg: Validate,
        agent: AgentView,
        attempt: int,
        judgement: Judgement,
        submitted: int,
        overruns: list[Overrun],
        out: Outbox,
    ) -> None:
        feedback = judgement.rejection
        assert feedback is not None
        rejected = out.emit(
            ProposalRejected(attempt=attempt, feedback=feedback, pack=judgement.pack),
            dfid=msg.dfid,
            after=submitted,
        )
        self._flag(msg, judgement, overruns, rejected, out)
        if msg.by_human:
            out.emit(
                FlowAborted(
                    reason_code=feedback.reason_code,
                    detail=f"human modification refused: {feedback.detail}",
                ),
                dfid=msg.dfid,
                after=rejected,
            )
            outcome = Outcome.ABORTED
        elif attempt >= agent.manifest.max_attempts:
            out.emit(
                FlowAborted(
                    reason_code=ReasonCode.REASONING_EXHAUSTION,
                    detail=f"{attempt} proposals rejected; last: {feedback.reason_code}",
                ),
                dfid=msg.dfid,
                after=rejected,
            )
            outcome = Outcome.ABORTED
        else:
            out.send(self._compiler, Compile(dfid=msg.dfid, attempt=attempt + 1, feedback=feedback))
            outcome = Outcome.REJECTED
        out.reply(
            msg.reply, Verdict(outcome=outcome, dfid=msg.dfid, attempt=attempt, feedback=feedback)
        )

    def _refuse(
        self, msg: Validate, flow: FlowState | None, code: ReasonCode, detail: str, out: Outbox
    ) -> None:
        out.emit(
            SubmissionRefused(
                reason_code=code, detail=detail, claimed_agent=flow.agent_id if flow else ""
            ),
            dfid=flow.dfid if flow else None,
        )
        feedback = reject("boundary", code, detail)
        out.reply(msg.reply, Verdict(outcome=Outcome.REFUSED, dfid=msg.dfid, feedback=feedback))

    def _duplicate(self, msg: Validate, flow: FlowState, out: Outbox) -> None:
        out.emit(DuplicateSuppressed(key=flow.intent_key, source="submission"), dfid=flow.dfid)
        outcome = {
            FlowStatus.CLOSED: Outcome.DUPLICATE,
            FlowStatus.ABORTED: Outcome.ABORTED,
            FlowStatus.ESCALATED: Outcome.ESCALATED,
        }.get(flow.status, Outcome.DUPLICATE)
        feedback = reject("boundary", flow.reason_code, flow.detail) if flow.reason_code else None
        out.reply(
            msg.reply,
            Verdict(
                outcome=outcome,
                dfid=flow.dfid,
                attempt=flow.attempts,
                feedback=feedback,
                external_id=flow.external_id,
            ),
        )
