"""The DecisionFlow lifecycle as a pure fold over events.

A flow's state is never stored, only derived: ``apply(state, event)`` returns
the next state or raises :class:`IllegalTransition`. Actors fold the events
they are about to record through the same function before recording them, so
an illegal transition is refused before it can reach the journal.

Lifecycle::

    CREATED -> ACTIVE -> VALIDATING -> ACTIVE (feedback, retries left)
                                    -> ACCEPTED | ESCALATED | ABORTED
    ESCALATED -> ACCEPTED (override) | VALIDATING (a modification, judged again) | ABORTED
    ACCEPTED -> EXECUTING -> CLOSED | ABORTED | DIRTY | ESCALATED (operational failure)
    DIRTY -> COMPENSATED | ESCALATED (a compensation failed)
    ACTIVE -> ESCALATED (the agent fell silent)
    ESCALATED -> EXECUTING | DIRTY (a human reconciles or retries an intent whose
                                     outcome is unknown; only then, and only so)
    ESCALATED | ACCEPTED -> ESCALATED (an approved or queued action, judged again just
                                       before it executes, needs a new approval)

An intent whose outcome is unknown (ExecutionFailed or CompensationFailed with
``unknown``) stays ``pending`` through the escalation: such a flow can be
neither approved nor modified, only reconciled or retried.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, cast

import msgspec

from kernel.core.events import (
    ApprovalExpired,
    ApprovalSuperseded,
    ApprovalVoted,
    CompensationFailed,
    CompensationStarted,
    CompensationSucceeded,
    ContextCompiled,
    DecisionRefused,
    DuplicateSuppressed,
    Event,
    ExecutionFailed,
    ExecutionIntent,
    ExecutionRefused,
    ExecutionRetried,
    ExecutionStarted,
    ExecutionSucceeded,
    FlowAborted,
    FlowClosed,
    FlowCompensated,
    FlowCreated,
    FlowDirty,
    FlowEscalated,
    FlowFlagged,
    GrantUsed,
    HumanDecided,
    Payload,
    ProposalAccepted,
    ProposalRecord,
    ProposalRejected,
    ProposalSubmitted,
    SubmissionRefused,
)
from kernel.core.reasons import ReasonCode


class FlowStatus(StrEnum):
    """Where a DecisionFlow is in its lifecycle."""

    CREATED = "CREATED"
    ACTIVE = "ACTIVE"
    VALIDATING = "VALIDATING"
    ACCEPTED = "ACCEPTED"
    ESCALATED = "ESCALATED"
    EXECUTING = "EXECUTING"
    CLOSED = "CLOSED"
    ABORTED = "ABORTED"
    DIRTY = "DIRTY"
    COMPENSATED = "COMPENSATED"


TERMINAL = frozenset({FlowStatus.CLOSED, FlowStatus.ABORTED, FlowStatus.COMPENSATED})
"""Statuses a flow never leaves."""

S = FlowStatus
_ABORTABLE = (S.CREATED, S.ACTIVE, S.VALIDATING, S.ACCEPTED, S.ESCALATED, S.EXECUTING)

# For each flow event type: the statuses it may occur in, and the status it leads to
# (None: the status does not change).
_TRANSITIONS: dict[type[Payload], tuple[frozenset[FlowStatus], FlowStatus | None]] = {
    ContextCompiled: (frozenset((S.CREATED, S.ACTIVE)), S.ACTIVE),
    ProposalSubmitted: (frozenset((S.ACTIVE, S.VALIDATING)), S.VALIDATING),
    ProposalRejected: (frozenset((S.VALIDATING,)), S.ACTIVE),
    ProposalAccepted: (frozenset((S.VALIDATING, S.ESCALATED)), S.ACCEPTED),
    # From ESCALATED and ACCEPTED too: an approved action judged again before it executes
    # may need a new approval (ApprovalSuperseded first says why).
    FlowEscalated: (
        frozenset((S.VALIDATING, S.DIRTY, S.ACTIVE, S.EXECUTING, S.ESCALATED, S.ACCEPTED)),
        S.ESCALATED,
    ),
    HumanDecided: (frozenset((S.ESCALATED,)), None),
    ApprovalExpired: (frozenset((S.ESCALATED,)), None),
    ApprovalVoted: (frozenset((S.ESCALATED,)), None),
    ApprovalSuperseded: (frozenset((S.ESCALATED, S.ACCEPTED)), None),
    GrantUsed: (frozenset((S.ACCEPTED,)), None),
    DecisionRefused: (frozenset(S), None),
    ExecutionStarted: (frozenset((S.ACCEPTED, S.EXECUTING)), S.EXECUTING),
    ExecutionSucceeded: (frozenset((S.EXECUTING,)), None),
    ExecutionFailed: (frozenset((S.EXECUTING,)), None),
    ExecutionRetried: (frozenset((S.EXECUTING, S.DIRTY)), None),
    ExecutionRefused: (frozenset((S.EXECUTING,)), None),
    FlowDirty: (frozenset((S.EXECUTING,)), S.DIRTY),
    CompensationStarted: (frozenset((S.DIRTY,)), None),
    CompensationSucceeded: (frozenset((S.DIRTY,)), None),
    CompensationFailed: (frozenset((S.DIRTY,)), None),
    FlowCompensated: (frozenset((S.DIRTY,)), S.COMPENSATED),
    FlowClosed: (frozenset((S.EXECUTING,)), S.CLOSED),
    FlowAborted: (frozenset(_ABORTABLE), S.ABORTED),
    DuplicateSuppressed: (frozenset(S), None),
    SubmissionRefused: (frozenset(S), None),
    FlowFlagged: (frozenset(S), None),
}

FLOW_EVENTS = frozenset(_TRANSITIONS) | {FlowCreated}
"""Payload types that belong to a DecisionFlow and go through the fold."""


class IllegalTransition(Exception):
    """An event that the flow's current status does not allow."""

    def __init__(self, dfid: str, status: FlowStatus | None, event_type: str) -> None:
        super().__init__(f"flow {dfid}: {event_type} is not allowed in status {status}")
        self.dfid = dfid
        self.status = status
        self.event_type = event_type


class StaleVerdict(IllegalTransition):
    """A verdict judged against less than the journal records before it (kernel.dim._raced).

    Another actor's events land between what the DIM judged against and its verdict
    (the same group commit, or the one in flight while it judged) and would have
    changed it: nothing of the DIM's append is written, and it judges again.
    """


class FlowState(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """Everything the kernel knows about one DecisionFlow, derived from its events."""

    dfid: str
    root_dfid: str
    parent_dfid: str | None
    agent_id: str
    topic: str
    status: FlowStatus
    created_ts: int
    updated_ts: int
    last_seq: int
    attempts: int = 0
    compiled: int = 0
    rejections: int = 0
    context_ref: str = ""
    proposal: ProposalRecord | None = None
    escalated: bool = False
    intent_key: str = ""
    external_id: str = ""
    reason_code: ReasonCode | None = None
    detail: str = ""
    pending: ExecutionIntent | None = None
    """The intent (step or compensation) started and not yet answered: what recovery resumes."""
    retries: int = 0
    """Transient failures of the pending intent so far."""
    done: int = 0
    """Steps of the intent that took effect."""
    undone: int = 0
    """Completed steps compensated since the flow became DIRTY."""
    needs_review: bool = False
    """A soft guard flagged the flow (FlowFlagged): a human should look; the verdict stands."""

    @property
    def terminal(self) -> bool:
        """Whether the flow has ended."""
        return self.status in TERMINAL

    @property
    def awaiting_proposal(self) -> bool:
        """Whether the agent holds a fresh context and the kernel waits for its proposal.

        Each attempt gets its own context: after a rejection the flow waits for the
        compiler, and only then for the agent, so exactly one actor may move a flow
        at any time.
        """
        return self.status is S.ACTIVE and self.compiled == self.attempts + 1


_replace = msgspec.structs.replace
_Update = Callable[[FlowState, Any, int, int, FlowStatus], FlowState]
"""What a flow event records besides its status: (state, payload, ts, seq, the status it
leads to) -> the next state, its time, seq and status written with one struct copy."""


def _context(
    state: FlowState, p: ContextCompiled, ts: int, seq: int, status: FlowStatus
) -> FlowState:
    return _replace(
        state,
        updated_ts=ts,
        last_seq=seq,
        status=status,
        context_ref=p.context_ref,
        compiled=p.attempt,
    )


RESOLVE_WORDS = frozenset({"reconcile", "retry"})
"""The decisions on an intent whose outcome is unknown (and the only ones allowed there)."""


def _decided(state: FlowState, p: HumanDecided, ts: int, seq: int, status: FlowStatus) -> FlowState:
    unknown = state.pending is not None
    if (p.decision in RESOLVE_WORDS) is not unknown:
        # Reconcile and retry need an intent of unknown outcome; nothing else may
        # decide one (an approval or rejection would guess at the world).
        raise IllegalTransition(state.dfid, state.status, f"HumanDecided({p.decision})")
    if unknown:
        # The engine records the result (reconcile) or calls again (retry) next.
        assert state.pending is not None
        return _replace(
            state,
            updated_ts=ts,
            last_seq=seq,
            status=S.DIRTY if state.pending.compensation else S.EXECUTING,
            retries=0,
        )
    # A modification is judged by the DIM next; nobody else may act meanwhile.
    if p.decision == "modify":
        status = S.VALIDATING
    return _replace(state, updated_ts=ts, last_seq=seq, status=status)


def _submitted(
    state: FlowState, p: ProposalSubmitted, ts: int, seq: int, status: FlowStatus
) -> FlowState:
    return _replace(
        state, updated_ts=ts, last_seq=seq, status=status, attempts=p.attempt, proposal=p.proposal
    )


def _rejected(
    state: FlowState, p: ProposalRejected, ts: int, seq: int, status: FlowStatus
) -> FlowState:
    return _replace(
        state,
        updated_ts=ts,
        last_seq=seq,
        status=status,
        rejections=state.rejections + 1,
        reason_code=p.feedback.reason_code,
        detail=p.feedback.detail,
    )


def _accepted(
    state: FlowState, p: ProposalAccepted, ts: int, seq: int, status: FlowStatus
) -> FlowState:
    if state.pending is not None:
        # An approval would start the intent afresh while its outcome is unknown.
        raise IllegalTransition(state.dfid, state.status, "ProposalAccepted")
    return _replace(state, updated_ts=ts, last_seq=seq, status=status, reason_code=None, detail="")


def _escalated(
    state: FlowState, p: FlowEscalated, ts: int, seq: int, status: FlowStatus
) -> FlowState:
    return _replace(
        state,
        updated_ts=ts,
        last_seq=seq,
        status=status,
        escalated=True,
        reason_code=p.reason_code,
        detail=p.detail,
    )


def _started(
    state: FlowState, p: ExecutionStarted, ts: int, seq: int, status: FlowStatus
) -> FlowState:
    return _replace(
        state,
        updated_ts=ts,
        last_seq=seq,
        status=status,
        intent_key=p.intent.key,
        pending=p.intent,
        retries=0,
    )


def _succeeded(
    state: FlowState, p: ExecutionSucceeded, ts: int, seq: int, status: FlowStatus
) -> FlowState:
    return _replace(
        state,
        updated_ts=ts,
        last_seq=seq,
        status=status,
        external_id=p.external_id,
        pending=None,
        done=state.done + 1,
    )


def _failed(
    state: FlowState, p: ExecutionFailed, ts: int, seq: int, status: FlowStatus
) -> FlowState:
    return _replace(
        state,
        updated_ts=ts,
        last_seq=seq,
        status=status,
        detail=p.error,
        pending=state.pending if p.unknown else None,
    )


def _retried(
    state: FlowState, p: ExecutionRetried, ts: int, seq: int, status: FlowStatus
) -> FlowState:
    return _replace(state, updated_ts=ts, last_seq=seq, status=status, retries=p.attempt)


def _refused(
    state: FlowState, p: ExecutionRefused, ts: int, seq: int, status: FlowStatus
) -> FlowState:
    return _replace(
        state,
        updated_ts=ts,
        last_seq=seq,
        status=status,
        reason_code=p.reason_code,
        detail=p.detail,
        pending=None,
    )


def _dirty(state: FlowState, p: FlowDirty, ts: int, seq: int, status: FlowStatus) -> FlowState:
    return _replace(
        state,
        updated_ts=ts,
        last_seq=seq,
        status=status,
        reason_code=p.reason_code,
        detail=p.detail,
    )


def _compensating(
    state: FlowState, p: CompensationStarted, ts: int, seq: int, status: FlowStatus
) -> FlowState:
    return _replace(state, updated_ts=ts, last_seq=seq, status=status, pending=p.intent, retries=0)


def _compensated_step(
    state: FlowState, p: CompensationSucceeded, ts: int, seq: int, status: FlowStatus
) -> FlowState:
    return _replace(
        state, updated_ts=ts, last_seq=seq, status=status, pending=None, undone=state.undone + 1
    )


def _compensation_failed(
    state: FlowState, p: CompensationFailed, ts: int, seq: int, status: FlowStatus
) -> FlowState:
    return _replace(
        state,
        updated_ts=ts,
        last_seq=seq,
        status=status,
        pending=state.pending if p.unknown else None,
        detail=p.error,
    )


def _compensated(
    state: FlowState, p: FlowCompensated, ts: int, seq: int, status: FlowStatus
) -> FlowState:
    return _replace(
        state, updated_ts=ts, last_seq=seq, status=status, reason_code=ReasonCode.COMPENSATED
    )


def _flagged(state: FlowState, p: FlowFlagged, ts: int, seq: int, status: FlowStatus) -> FlowState:
    return _replace(state, updated_ts=ts, last_seq=seq, status=status, needs_review=True)


def _aborted(state: FlowState, p: FlowAborted, ts: int, seq: int, status: FlowStatus) -> FlowState:
    return _replace(
        state,
        updated_ts=ts,
        last_seq=seq,
        status=status,
        reason_code=p.reason_code,
        detail=p.detail,
    )


# What each event records in the flow besides its status (dispatch by type: the
# fold runs several times per event, and a chain of class patterns is slow).
_UPDATES: dict[type[Payload], _Update] = {
    ContextCompiled: _context,
    HumanDecided: _decided,
    ProposalSubmitted: _submitted,
    ProposalRejected: _rejected,
    ProposalAccepted: _accepted,
    FlowEscalated: _escalated,
    ExecutionStarted: _started,
    ExecutionSucceeded: _succeeded,
    ExecutionFailed: _failed,
    ExecutionRetried: _retried,
    ExecutionRefused: _refused,
    FlowDirty: _dirty,
    CompensationStarted: _compensating,
    CompensationSucceeded: _compensated_step,
    CompensationFailed: _compensation_failed,
    FlowCompensated: _compensated,
    FlowAborted: _aborted,
    FlowFlagged: _flagged,
}


def apply(state: FlowState | None, event: Event) -> FlowState:
    """Return the flow state after ``event``; raise IllegalTransition if it is not allowed."""
    payload = event.payload
    kind = type(payload)
    if kind is FlowCreated:
        return _created(state, event, cast(FlowCreated, payload))
    rule = _RULES.get(kind)
    if rule is None or state is None or state.status not in rule[0]:
        raise _illegal(state, event)
    _, status, update = rule
    to = status or state.status
    if update is None:
        return _replace(state, updated_ts=event.ts, last_seq=event.seq, status=to)
    return update(state, payload, event.ts, event.seq, to)


def _created(state: FlowState | None, event: Event, created: FlowCreated) -> FlowState:
    """A flow's first state; a second FlowCreated for it is illegal."""
    if state is not None:
        raise IllegalTransition(event.dfid or "", state.status, "FlowCreated")
    return FlowState(
        dfid=event.dfid or "",
        root_dfid=created.root_dfid,
        parent_dfid=event.parent_dfid,
        agent_id=event.agent_id or "",
        topic=created.topic,
        status=S.CREATED,
        created_ts=event.ts,
        updated_ts=event.ts,
        last_seq=event.seq,
    )


def _illegal(state: FlowState | None, event: Event) -> IllegalTransition:
    return IllegalTransition(event.dfid or "", state.status if state else None, event.type)


# Per flow event type: the statuses it may occur in, the status it leads to, and what it
# records besides (one lookup per event: the fold runs for every event replayed).
_RULES: dict[type[Payload], tuple[frozenset[FlowStatus], FlowStatus | None, _Update | None]] = {
    kind: (allowed, to, _UPDATES.get(kind)) for kind, (allowed, to) in _TRANSITIONS.items()
}
