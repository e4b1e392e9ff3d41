"""The DecisionFlow lifecycle as a pure fold over events.

A flow's state is never stored, only derived: ``apply(state, event)`` returns
the next state or raises :class:`IllegalTransition`. Actors fold the events
they are about to record through the same function before recording them, so
an illegal transition is refused before it can reach the journal.

Lifecycle::

    CREATED -> ACTIVE -> VALIDATING -> ACTIVE (feedback, retries left)
                                    -> ACCEPTED | ESCALATED | ABORTED
    ESCALATED -> ACCEPTED (override) | VALIDATING (a modification, judged again) | ABORTED
    ACCEPTED -> EXECUTING -> CLOSED | ABORTED | DIRTY
    DIRTY -> COMPENSATED | ESCALATED
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from kernel.events import (
    ContextCompiled,
    DuplicateSuppressed,
    Event,
    ExecutionFailed,
    ExecutionStarted,
    ExecutionSucceeded,
    FlowAborted,
    FlowClosed,
    FlowCreated,
    FlowEscalated,
    HumanDecided,
    Payload,
    ProposalAccepted,
    ProposalRecord,
    ProposalRejected,
    ProposalSubmitted,
    SubmissionRefused,
)
from kernel.reasons import ReasonCode


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
_TRANSITIONS: dict[type[Payload], tuple[tuple[FlowStatus, ...], FlowStatus | None]] = {
    ContextCompiled: ((S.CREATED, S.ACTIVE), S.ACTIVE),
    ProposalSubmitted: ((S.ACTIVE, S.VALIDATING), S.VALIDATING),
    ProposalRejected: ((S.VALIDATING,), S.ACTIVE),
    ProposalAccepted: ((S.VALIDATING, S.ESCALATED), S.ACCEPTED),
    FlowEscalated: ((S.VALIDATING, S.DIRTY), S.ESCALATED),
    HumanDecided: ((S.ESCALATED,), None),
    ExecutionStarted: ((S.ACCEPTED, S.EXECUTING), S.EXECUTING),
    ExecutionSucceeded: ((S.EXECUTING,), None),
    ExecutionFailed: ((S.EXECUTING,), None),
    FlowClosed: ((S.EXECUTING,), S.CLOSED),
    FlowAborted: (_ABORTABLE, S.ABORTED),
    DuplicateSuppressed: (tuple(S), None),
    SubmissionRefused: (tuple(S), None),
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


class FlowState(msgspec.Struct, frozen=True, kw_only=True):
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


def apply(state: FlowState | None, event: Event) -> FlowState:
    """Return the flow state after ``event``; raise IllegalTransition if it is not allowed."""
    payload = event.payload
    dfid = event.dfid or ""
    if isinstance(payload, FlowCreated):
        if state is not None:
            raise IllegalTransition(dfid, state.status, "FlowCreated")
        return FlowState(
            dfid=dfid,
            root_dfid=payload.root_dfid,
            parent_dfid=event.parent_dfid,
            agent_id=event.agent_id or "",
            topic=payload.topic,
            status=S.CREATED,
            created_ts=event.ts,
            updated_ts=event.ts,
            last_seq=event.seq,
        )
    rule = _TRANSITIONS.get(type(payload))
    if rule is None:
        raise IllegalTransition(dfid, state.status if state else None, event.type)
    allowed, target = rule
    if state is None or state.status not in allowed:
        raise IllegalTransition(dfid, state.status if state else None, event.type)
    changes: dict[str, object] = {
        "status": target or state.status,
        "updated_ts": event.ts,
        "last_seq": event.seq,
    }
    match payload:
        case ContextCompiled(attempt=attempt, context_ref=ref):
            changes["context_ref"] = ref
            changes["compiled"] = attempt
        case HumanDecided(decision="modify"):
            # The modification is judged by the DIM next; nobody else may act meanwhile.
            changes["status"] = S.VALIDATING
        case ProposalSubmitted(attempt=attempt, proposal=proposal):
            changes["attempts"] = attempt
            changes["proposal"] = proposal
        case ProposalRejected(feedback=feedback):
            changes["rejections"] = state.rejections + 1
            changes["reason_code"] = feedback.reason_code
            changes["detail"] = feedback.detail
        case ProposalAccepted():
            changes["reason_code"] = None
            changes["detail"] = ""
        case FlowEscalated(reason_code=code, detail=detail):
            changes["escalated"] = True
            changes["reason_code"] = code
            changes["detail"] = detail
        case ExecutionStarted(intent=intent):
            changes["intent_key"] = intent.key
        case ExecutionSucceeded(external_id=external_id):
            changes["external_id"] = external_id
        case ExecutionFailed(error=error):
            changes["detail"] = error
        case FlowAborted(reason_code=code, detail=detail):
            changes["reason_code"] = code
            changes["detail"] = detail
        case _:
            pass
    return msgspec.structs.replace(state, **changes)
