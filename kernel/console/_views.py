"""What the console's pages show, read from the follower's projections and the journal.

Plain data for the templates (which escape every field): no HTML is built here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec

from kernel.audit.narrative import narrate, outcome
from kernel.audit.units import judged_by, offset
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
    offset: str = ""
    """``offset_ms`` as a person reads it (``+49 min 24 s``; kernel.audit.units)."""


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
    pack: str = ""
    """The pack and version whose verdict the flow's latest judgement names ("trading 0.4.0")."""
    on_behalf: ev.OnBehalf | None = None
    """Whom the flow acts for (None: a flow from before principals were recorded)."""


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
        lines=[
            Line(e.seq, (e.ts - start) / 1e6, e.type, narrate(e), offset(e.ts - start))
            for e in events
        ],
        outcome=outcome(flow),
        waiting=_waiting(flow, approval),
        decisions=_decisions(events),
        quorum=quorum_of(local, dfid),
        ballot=local.domain(Quorums).ballots.get(dfid),
        pack=judged_by(events, projections.packs.values()),
        on_behalf=_on_behalf(events),
    )


def _waiting(flow: FlowState, approval: Approval | None) -> bool:
    """The flow waits for a human's decision (escalated, its approval pending)."""
    return (
        flow.status is FlowStatus.ESCALATED
        and approval is not None
        and approval.status is ApprovalStatus.PENDING
    )


def _decisions(events: list[Event]) -> list[Event]:
    """The humans' decisions on the flow, and the refusals of them, newest first."""
    kinds = ev.HumanDecided | ev.DecisionRefused | ev.ApprovalVoted
    return [e for e in reversed(events) if isinstance(e.payload, kinds)]


def _on_behalf(events: list[Event]) -> ev.OnBehalf | None:
    """Whom the flow acts for, as its FlowCreated records it."""
    created = (e.payload for e in events if isinstance(e.payload, ev.FlowCreated))
    return next((payload.on_behalf for payload in created), None)


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
    q: str = ""
    """A DFID (or trace id) prefix, or words found in the flow's agent, kind, reason,
    parameters, explanation or detail."""


PAGE = 50
"""Flows per page of the flows list."""

_HEX = re.compile(r"[0-9a-f-]+")


def matches(flow: FlowState, q: str) -> bool:
    """Whether the search ``q`` finds ``flow``: a DFID or trace-id prefix, or its words."""
    q = q.strip().lower()
    if not q:
        return True
    if _HEX.fullmatch(q) and (
        flow.dfid.startswith(q) or flow.dfid.replace("-", "").startswith(q.replace("-", ""))
    ):
        return True
    proposal = flow.proposal
    words = [flow.dfid, flow.agent_id, flow.topic, str(flow.reason_code or ""), flow.status]
    if proposal is not None:
        words += [proposal.kind, proposal.explain, json.dumps(proposal.params, sort_keys=True)]
    return all(any(part in word.lower() for word in words) for part in q.split() if part)


def flows(
    projections: Projections, where: FlowFilter, now_ns: int, limit: int | None = None
) -> list[FlowState]:
    """Flows matching ``where``, newest first (every one the journal holds; ``limit``: at most)."""
    chosen = [
        flow
        for flow in projections.flows.values()
        if _named(flow, where) and _recent_and_found(flow, where, now_ns)
    ]
    chosen.sort(key=lambda f: (f.created_ts, f.dfid), reverse=True)
    return chosen if limit is None else chosen[:limit]


def _named(flow: FlowState, where: FlowFilter) -> bool:
    """The flow has the status, agent, kind and reason the filter names (each if it names one)."""
    if where.status and flow.status != where.status:
        return False
    if where.agent and flow.agent_id != where.agent:
        return False
    if where.kind and (flow.proposal is None or flow.proposal.kind != where.kind):
        return False
    return not where.reason or str(flow.reason_code or "") == where.reason


def _recent_and_found(flow: FlowState, where: FlowFilter, now_ns: int) -> bool:
    """The flow began within ``since_s`` and its words hold the query (each if given)."""
    if where.since_s and flow.created_ts < now_ns - int(where.since_s * 1e9):
        return False
    return not where.q or matches(flow, where.q)


# --- the modify form ---------------------------------------------------------------------


def field_text(value: Any) -> str:
    """A parameter's value as its form field shows it: text as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def edited_params(proposed: dict[str, Any], form: dict[str, Any]) -> dict[str, Any]:
    """The whole new parameters from a modify form's ``param.NAME`` fields.

    Each field keeps the proposed value's type where its text is one (``162`` stays a
    number, ``"295.81"`` text); text that is not stays text, and the kernel refuses it
    with its reason (SCHEMA_INVALID), as it would from ``dirk decide --modify``.
    """
    params: dict[str, Any] = {}
    for name, was in proposed.items():
        text = form.get(f"param.{name}")
        if not isinstance(text, str):
            params[name] = was
            continue
        if isinstance(was, str):
            params[name] = text
            continue
        try:
            params[name] = json.loads(text)
        except ValueError:
            params[name] = text
    return params


@dataclass(frozen=True)
class Change:
    """One parameter a modification changes: its name, the proposed value, the new one."""

    name: str
    was: str
    now: str


def diff(proposed: dict[str, Any], params: dict[str, Any]) -> list[Change]:
    """What ``params`` changes of the proposal, by name."""
    return [
        Change(name, field_text(proposed.get(name, "")), field_text(params.get(name, "")))
        for name in sorted({*proposed, *params})
        if proposed.get(name) != params.get(name)
    ]


# --- the audit page ----------------------------------------------------------------------

HUMAN_ACTS = {
    "HumanDecided": "decision",
    "DecisionRefused": "decision refused",
    "LimitAmended": "amendment",
    "AmendmentRefused": "amendment refused",
    "CredentialIssued": "credential",
    "AgentStatusChanged": "agent status",
    "RuleProposed": "rule change",
    "RuleDecided": "rule change",
    "RuleRetracted": "rule change",
    "PackLoaded": "pack",
    "OperatorKeyTrusted": "operator key",
    "OperatorKeyRevoked": "operator key",
    "InputRefused": "request refused",
}
"""The events that record what a person did (or tried), and the kind of act each is."""


@dataclass(frozen=True)
class Act:
    """One human act as the audit page lists it."""

    seq: int
    ts: int
    kind: str
    type: str
    operator: str
    target: str
    what: str
    reason: str
    dfid: str
    text: str

    COLUMNS: ClassVar[tuple[str, ...]] = (
        "seq",
        "time",
        "act",
        "event",
        "operator",
        "target",
        "what",
        "reason",
        "dfid",
        "narrative",
    )
    """The exported record's fields, in order."""

    def row(self, when: str) -> dict[str, Any]:
        """The act as one exported record (``when``: its time as text)."""
        return {
            "seq": self.seq,
            "time": when,
            "act": self.kind,
            "event": self.type,
            "operator": self.operator,
            "target": self.target,
            "what": self.what,
            "reason": self.reason,
            "dfid": self.dfid,
            "narrative": self.text,
        }


def _operator_of(payload: Any) -> str:
    """Who did the act: its operator, actor, proposer or key name."""
    return str(
        getattr(payload, "operator", "")
        or getattr(payload, "actor", "")
        or getattr(payload, "proposer", "")
        or getattr(payload, "name", "")
    )


def _target_of(event: Event, payload: Any) -> str:
    """What a flowless act is about: a rule, a limit, a pack, a key or an agent."""
    return str(
        getattr(payload, "rule", "")
        or getattr(payload, "limit", "")
        or (payload.pack.name if isinstance(payload, ev.PackLoaded) else "")
        or getattr(payload, "fingerprint", "")
        or event.agent_id
        or ""
    )


def _what_of(event: Event, payload: Any) -> str:
    """What the act was: a decision, a status, a value, a code, a role, else its type."""
    return str(
        getattr(payload, "decision", "")
        or getattr(payload, "status", "")
        or getattr(payload, "value", "")
        or getattr(payload, "reason_code", "")
        or getattr(payload, "role", "")
        or event.type
    )


def act_of(event: Event) -> Act | None:
    """The human act ``event`` records, or None (an agent's or the kernel's own event)."""
    kind = HUMAN_ACTS.get(event.type)
    if kind is None:
        return None
    payload: Any = event.payload
    if isinstance(payload, ev.AgentStatusChanged) and not payload.operator:
        return None  # the kernel's own demotion (an escalation budget spent), not a person's
    operator = _operator_of(payload)
    target = event.dfid or _target_of(event, payload)
    what = _what_of(event, payload)
    reason = str(getattr(payload, "reason", "") or getattr(payload, "detail", ""))
    return Act(
        seq=event.seq,
        ts=event.ts,
        kind=kind,
        type=event.type,
        operator=operator,
        target=target,
        what=what,
        reason=reason,
        dfid=event.dfid or "",
        text=narrate(event),
    )


@dataclass(frozen=True)
class ActFilter:
    """The audit page's filters; empty fields do not filter."""

    operator: str = ""
    kind: str = ""
    q: str = ""


def acts(events: list[Event], where: ActFilter) -> list[Act]:
    """The human acts among ``events`` that ``where`` keeps, newest first."""
    found = []
    q = where.q.strip().lower()
    for event in events:
        act = act_of(event)
        if act is None:
            continue
        if where.operator and act.operator != where.operator:
            continue
        if where.kind and act.kind != where.kind:
            continue
        haystack = " ".join([act.operator, act.target, act.what, act.reason, act.text]).lower()
        if q and not all(part in haystack for part in q.split()):
            continue
        found.append(act)
    return sorted(found, key=lambda a: a.seq, reverse=True)
