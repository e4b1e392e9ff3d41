"""A verdict is judged against everything the journal records before it.

The DIM judges a batch against the projections as committed, while other actors'
appends may already be on their way: in the transaction in flight, or earlier in
the group commit its own append joins. Replay (kernel.audit.reverify) judges each
proposal against everything recorded before it, in the journal's order. So the
journal's transition check (kernel.state.projections) calls :func:`check` with each
append of a transaction and the flows the appends before it staged, and an append
holding a verdict those flows would have changed is refused (:class:`StaleVerdict`):
nothing of it is written, and the supervisor hands the DIM the same messages again,
now judged against what committed (kernel.runtime.actors).

The rule read here is the unsettled-saga check (status layer, AGENT_PASSIVE): the
agent's unsettled flows are written by the executor, not the DIM. What the verdict
saw is in the verdict itself: a refusal for unsettled flows names them (its detail),
and any other verdict past the schema layer and the agent's own status saw none.

The other state the verdict reads that another actor writes moves one way only: a
flow that ends releases what it held (more room: an acceptance stands), and a closed
flow's money moves from held to spent (the same room). Grants, amendments, packs,
rules and principals acts (tenants declared or changed, delegations: RecordAct) are the
DIM's own messages, ordered with its verdicts. Not covered yet: a
refusal or escalation for room (RESOURCE_CONTENTION, BUDGET_EXHAUSTED) that a release
before it would have let through, and facts that change the agent's visible state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kernel.core.events import (
    Event,
    Feedback,
    FlowEscalated,
    ProposalAccepted,
    ProposalRejected,
    ProposalSubmitted,
)
from kernel.core.flow import FlowState, StaleVerdict
from kernel.core.reasons import ReasonCode
from kernel.dim._gate import unsettled_detail
from kernel.state.projections import Projections


def check(
    projections: Projections, events: Sequence[Event], staged: Mapping[str, FlowState]
) -> None:
    """Refuse an append whose verdicts read unsettled flows other than those before them.

    Raises:
        StaleVerdict: a verdict of the append saw the agent's unsettled flows otherwise
            than the flows committed and ``staged`` (the appends before it) leave them.
    """
    judged: dict[str, str] = {}
    # What a verdict of each agent should have seen: ``staged`` is the same for every
    # event of this append, so it is worked out once per agent, not once per verdict.
    expected_of: dict[str, str] = {}
    for event in events:
        payload = event.payload
        dfid = event.dfid
        if dfid is None:
            continue
        if isinstance(payload, ProposalSubmitted):
            if not payload.by_human and event.agent_id is not None:
                judged[dfid] = event.agent_id
            continue
        agent_id = judged.pop(dfid, None)
        if agent_id is None:
            continue
        seen = _seen(agent_id, payload)
        if seen is None:
            continue
        expected = expected_of.get(agent_id)
        if expected is None:
            expected = expected_of[agent_id] = _expected(projections, agent_id, staged)
        if seen != expected:
            raise StaleVerdict(dfid, None, type(payload).__name__)


def _expected(projections: Projections, agent_id: str, staged: Mapping[str, FlowState]) -> str:
    """What a verdict of ``agent_id`` should have seen of its unsettled flows ("" none)."""
    now = projections.unsettled_with(agent_id, staged)
    return unsettled_detail(agent_id, now) if now else ""


def _seen(agent_id: str, payload: object) -> str | None:
    """What the verdict saw of the agent's unsettled flows: the refusal's detail, "" for
    none, None when the verdict did not read them (or ``payload`` is no verdict)."""
    if isinstance(payload, ProposalAccepted | FlowEscalated):
        return ""
    if not isinstance(payload, ProposalRejected):
        return None
    feedback: Feedback = payload.feedback
    if feedback.layer == "schema" or feedback.reason_code is ReasonCode.SCHEMA_INVALID:
        # Refused before the status layer (or as if): whatever else it missed, the
        # verdict is the same; judging it again would give it again (never a loop).
        return None
    if feedback.layer == "status" and feedback.reason_code is ReasonCode.AGENT_PASSIVE:
        prefix = f"agent {agent_id} has flow(s) "
        return feedback.detail if feedback.detail.startswith(prefix) else None
    if feedback.layer == "status":
        return None  # the agent's own status (suspended, retired, passive)
    return ""
