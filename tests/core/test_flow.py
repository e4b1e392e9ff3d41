"""The DecisionFlow lifecycle as a pure fold."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel import TERMINAL, FlowState, FlowStatus
from kernel.audit import IllegalTransition
from kernel.core.events import (
    AnyPayload,
    ContextCompiled,
    Event,
    ExecutionIntent,
    ExecutionStarted,
    ExecutionSucceeded,
    Feedback,
    FlowAborted,
    FlowClosed,
    FlowCreated,
    FlowEscalated,
    HumanDecided,
    ProposalAccepted,
    ProposalRecord,
    ProposalRejected,
    ProposalSubmitted,
)
from kernel.core.flow import apply
from kernel.core.reasons import ReasonCode

DFID = "0b6a4f7e-8a59-4d5c-9d1b-0f0a7e1b2c3d"
PROPOSAL = ProposalRecord(kind="test.transfer", params={"amount_cents": 1})
FEEDBACK = Feedback(reason_code=ReasonCode.SCHEMA_INVALID)
INTENT = ExecutionIntent(key="k", kind="test.transfer", adapter="bank")

PAYLOADS: list[AnyPayload] = [
    FlowCreated(root_dfid=DFID),
    ContextCompiled(attempt=1, context_ref="r"),
    ProposalSubmitted(attempt=1, proposal=PROPOSAL),
    ProposalRejected(attempt=1, feedback=FEEDBACK),
    ProposalAccepted(attempt=1),
    FlowEscalated(reason_code=ReasonCode.LOW_CONFIDENCE),
    HumanDecided(decision="override", operator="ana"),
    ExecutionStarted(intent=INTENT),
    ExecutionSucceeded(key="k"),
    FlowClosed(),
    FlowAborted(reason_code=ReasonCode.KERNEL_FAULT),
]


def fold(payloads: list[AnyPayload]) -> FlowState:
    state: FlowState | None = None
    for seq, payload in enumerate(payloads, 1):
        state = apply(state, Event(seq=seq, ts=seq, payload=payload, dfid=DFID, agent_id="a"))
    assert state is not None
    return state


def test_the_happy_path() -> None:
    state = fold([PAYLOADS[i] for i in (0, 1, 2, 4, 7, 8, 9)])
    assert state.status is FlowStatus.CLOSED
    assert (state.attempts, state.intent_key, state.last_seq) == (1, "k", 7)


def test_feedback_loop_then_escalation_then_override() -> None:
    state = fold([PAYLOADS[i] for i in (0, 1, 2, 3, 1, 2, 5, 6, 4, 7, 8, 9)])
    assert state.status is FlowStatus.CLOSED
    assert state.rejections == 1 and state.escalated


@pytest.mark.parametrize(
    "path",
    [
        (0, 0),  # created twice
        (0, 9),  # closed before anything happened
        (0, 1, 7),  # executing without acceptance
        (0, 1, 4),  # accepted without a proposal
        (0, 1, 2, 4, 7, 8, 9, 10),  # aborting a closed flow
        (0, 1, 2, 6),  # a human decision without an escalation
        (1,),  # an event for a flow that does not exist
    ],
)
def test_illegal_transitions_raise(path: tuple[int, ...]) -> None:
    with pytest.raises(IllegalTransition):
        fold([PAYLOADS[i] for i in path])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, len(PAYLOADS) - 1), max_size=20))
def test_any_sequence_either_folds_or_is_refused_and_terminal_states_are_final(
    path: list[int],
) -> None:
    state = None
    for seq, i in enumerate(path, 1):
        event = Event(seq=seq, ts=seq, payload=PAYLOADS[i], dfid=DFID, agent_id="a")
        before = state
        try:
            state = apply(state, event)
        except IllegalTransition:
            continue
        if before is not None and before.status in TERMINAL:
            # Only bookkeeping events may follow the end, and they change nothing.
            assert state.status is before.status
