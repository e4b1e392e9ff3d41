"""What the console's pages show, read from the follower's projections and the journal.

Plain data for the templates (which escape every field): no HTML is built here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec

from kernel.audit.narrative import narrate, outcome
from kernel.core import events as ev
from kernel.core.events import Event
from kernel.core.flow import FlowState, FlowStatus
from kernel.policy.kinds import Impact
from kernel.policy.quorums import waiting
from kernel.state.approvals import Approval, ApprovalStatus
from kernel.state.projections import Projections
from kernel.state.quorums import Ballot, Quorums


@dataclass(frozen=True)
class Card:
    """One pending escalation in the queue."""

    dfid: str
    impact: str
    reason_code: str
    detail: str
    agent_id: str
    action: str
    short_hash: str
    escalated_ts: int
    expires_ts: int | None
    queued: bool
    unknown_outcome: bool
    quorum: str = ""
    """What a quorum waits for ("1 of 2, waiting for a desk-head"); "" without one."""


def quorum_of(projections: Projections, dfid: str) -> str:
    """What flow ``dfid``'s approval waits for when its pack asks a quorum ("" otherwise)."""
    ballot = projections.domain(Quorums).ballots.get(dfid)
    if ballot is None or (ballot.quorum.required < 2 and not ballot.quorum.roles):
        return ""
    return ballot.waiting or waiting(ballot.quorum, [])


def describe_action(flow: FlowState) -> str:
    """Return the proposed action in plain words (as ``dirk escalations`` does)."""
    if flow.proposal is None:
        return "(nothing proposed)"
    params = ", ".join(f"{k}={v}" for k, v in sorted(flow.proposal.params.items()))
    return f"{flow.proposal.kind}({params})"


def pending(projections: Projections) -> list[tuple[FlowState, Approval]]:
    """Flows waiting for a human, HIGH_IMPACT first, then oldest first."""
    rows = []
    for dfid, approval in projections.approvals.items():
        flow = projections.flows.get(dfid)
        if flow is not None and flow.status is FlowStatus.ESCALATED:
            if approval.status is ApprovalStatus.PENDING:
                rows.append((flow, approval))
    return sorted(
        rows, key=lambda r: (r[1].impact is not Impact.HIGH_IMPACT, r[1].escalated_ts, r[0].dfid)
    )


def queue(projections: Projections, queued: set[str], ttl_s: float | None) -> list[Card]:
    """The escalation queue's cards."""
    return [
        Card(
            dfid=flow.dfid,
            impact=str(approval.impact),
            reason_code=str(approval.reason_code),
            detail=approval.detail,
            agent_id=flow.agent_id,
            action=describe_action(flow),
            short_hash=approval.short_hash,
            escalated_ts=approval.escalated_ts,
            # An unknown outcome never expires: only a human who looked may close it.
            expires_ts=(
                approval.escalated_ts + int(ttl_s * 1e9)
                if ttl_s is not None and flow.pending is None
                else None
            ),
            queued=flow.dfid in queued,
            unknown_outcome=flow.pending is not None,
            quorum=quorum_of(projections, flow.dfid),
        )
        for flow, approval in pending(projections)
    ]


@dataclass(frozen=True)
class Line:
    """One event of a flow's narrative."""

    seq: int
    offset_ms: float
    type: str
    text: str


@dataclass(frozen=True)
class Review:
    """Everything needed to decide on one flow (what ``dirk review`` prints), and its story."""

    flow: FlowState
    approval: Approval | None
    action: str
    params_json: str
    context: ev.ContextCompiled | None
    manifest: ev.Manifest | None
    packs: list[ev.PackRef]
    lines: list[Line]
    outcome: str
    waiting: bool
    """Whether the flow waits for a human decision right now."""
    decisions: list[Event]
    """The flow's HumanDecided, ApprovalVoted and DecisionRefused events, newest first."""
    quorum: str = ""
    """What the approval's quorum waits for ("" without one)."""
    ballot: Ballot | None = None
    """Who voted, with which roles, and who may not vote."""


def review(projections: Projections, events: list[Event]) -> Review | None:
    """Build a flow's review from its events (None when there are none)."""
    if not events:
        return None
    local = Projections()
    local.apply(events)
    dfid = events[0].dfid or ""
    flow = local.flows.get(dfid)
    if flow is None:
        return None
    approval = local.approvals.get(dfid)
    proposal = flow.proposal
    agent = projections.agents.get(flow.agent_id)
    start = events[0].ts
    return Review(
        flow=flow,
        approval=approval,
        action=describe_action(flow),
        params_json=json.dumps(proposal.params, indent=2, sort_keys=True) if proposal else "{}",
        context=_context_seen(events, proposal.context_ref if proposal else ""),
        manifest=agent.manifest if agent else None,
        packs=list(projections.packs.values()),
        lines=[Line(e.seq, (e.ts - start) / 1e6, e.type, narrate(e)) for e in events],
        outcome=outcome(flow),
        waiting=(
            flow.status is FlowStatus.ESCALATED
            and approval is not None
            and approval.status is ApprovalStatus.PENDING
        ),
        decisions=[
            e
            for e in reversed(events)
            if isinstance(e.payload, ev.HumanDecided | ev.DecisionRefused | ev.ApprovalVoted)
        ],
        quorum=quorum_of(local, dfid),
        ballot=local.domain(Quorums).ballots.get(dfid),
    )


def _context_seen(events: list[Event], ref: str) -> ev.ContextCompiled | None:
    """The context the proposal reasoned on (the latest, if none matches its reference)."""
    contexts = [e.payload for e in events if isinstance(e.payload, ev.ContextCompiled)]
    for context in reversed(contexts):
        if context.context_ref == ref:
            return context
    return contexts[-1] if contexts else None


def as_json(value: Any) -> str:
    """A value as the page shows it: JSON, keys sorted."""
    return json.dumps(msgspec.to_builtins(value), sort_keys=True, default=str)


@dataclass(frozen=True)
class FlowFilter:
    """The flows list's filters; empty fields do not filter."""

    status: str = ""
    agent: str = ""
    kind: str = ""
    reason: str = ""
    since_s: float = 0.0
    """Only flows created within this many seconds before now (0: any time)."""


def flows(
    projections: Projections, where: FlowFilter, now_ns: int, limit: int = 500
) -> list[FlowState]:
    """Flows matching ``where``, newest first, at most ``limit``."""
    chosen = []
    for flow in projections.flows.values():
        if where.status and flow.status != where.status:
            continue
        if where.agent and flow.agent_id != where.agent:
            continue
        if where.kind and (flow.proposal is None or flow.proposal.kind != where.kind):
            continue
        if where.reason and str(flow.reason_code or "") != where.reason:
            continue
        if where.since_s and flow.created_ts < now_ns - int(where.since_s * 1e9):
            continue
        chosen.append(flow)
    chosen.sort(key=lambda f: (f.created_ts, f.dfid), reverse=True)
    return chosen[:limit]
