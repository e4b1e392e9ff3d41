"""What a webhook is told: a notice per approval request, reminder and outcome, as JSON.

Pure functions of recorded events (and, for a reminder, the approval as folded): the
same event always makes the same notice. Two bodies: the generic one (every field,
machine-readable) and a Slack-compatible one (``text`` and ``blocks``, what a Slack
incoming webhook takes). Money is shown formatted; nothing secret is in either (the
records hold no secrets: see docs/approvals.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgspec

from kernel.core.events import (
    ApprovalExpired,
    ApprovalSuperseded,
    ApprovalVoted,
    DriftBreached,
    Event,
    FlowEscalated,
    GrantIssued,
    GrantRevoked,
    GrantVoted,
    HumanDecided,
)
from kernel.core.wall import visible
from kernel.state.approvals import SHORT_HASH, Approval

Kind = Literal["request", "reminder", "outcome"]
KINDS: tuple[Kind, ...] = ("request", "reminder", "outcome")


class Notice(msgspec.Struct, frozen=True, kw_only=True):
    """One thing to tell people: its kind, the event it is about, the flow or grant, words.

    Attributes:
        kind: ``request`` (a human is needed), ``reminder`` (still needed) or ``outcome``.
        about: the seq of the event it is about (with ``kind`` and the hook: its id).
        target: the flow's DFID or the grant's id.
        title: one line for people.
        fields: the details, as a generic webhook receives them.
        n: which reminder this is (0 for the others).
    """

    kind: Kind
    about: int
    target: str
    title: str
    fields: dict[str, Any]
    n: int = 0

    @property
    def id(self) -> str:
        """What makes a delivery of this notice one (a receiver may dedupe on it)."""
        return f"{self.about}:{self.kind}" + (f":{self.n}" if self.n else "")


def notice_of(event: Event) -> Notice | None:
    """Return the notice a committed event makes, or None (most events make none)."""
    p = event.payload
    notice = _NOTICES.get(type(p))
    if notice is None:
        return None
    base = {"seq": event.seq, "ts": event.ts, "event": type(p).__name__}
    return notice(event, p, base, event.dfid or "")


def _drifted(event: Event, p: DriftBreached, base: dict[str, Any], dfid: str) -> Notice:
    fields = base | msgspec.to_builtins(p)
    title = f"Drift {p.monitor}: {p.metric} {p.value:g} crossed {p.bound:g} ({p.subject})"
    return Notice(kind="outcome", about=event.seq, target=p.subject, title=title, fields=fields)


def _escalated(event: Event, p: FlowEscalated, base: dict[str, Any], dfid: str) -> Notice | None:
    action = p.action_hash
    if not action:
        return None
    quorum = p.quorum
    fields = base | {
        "dfid": dfid,
        "agent_id": event.agent_id or "",
        "reason_code": str(p.reason_code),
        "detail": p.detail,
        "impact": p.impact,
        "action_hash": action[:SHORT_HASH],
        "quorum": msgspec.to_builtins(quorum) if quorum is not None else None,
    }
    need = f" ({quorum.required} approvals)" if quorum and quorum.required > 1 else ""
    title = f"Approval needed{need}: {p.reason_code} on flow {dfid} ({p.impact})"
    return Notice(kind="request", about=event.seq, target=dfid, title=title, fields=fields)


def _voted(event: Event, p: ApprovalVoted, base: dict[str, Any], dfid: str) -> Notice:
    fields = base | {"dfid": dfid, "vote": p.vote, "operator": p.operator}
    fields |= {"waiting": p.waiting, "met": p.met}
    title = f"{p.operator} voted {p.vote} on flow {dfid}: {p.waiting}"
    return Notice(kind="outcome", about=event.seq, target=dfid, title=title, fields=fields)


def _decided(event: Event, p: HumanDecided, base: dict[str, Any], dfid: str) -> Notice:
    fields = base | {"dfid": dfid, "decision": p.decision, "operator": p.operator}
    fields |= {"reason": p.reason}
    title = f"Flow {dfid}: {p.decision} by {p.operator}"
    return Notice(kind="outcome", about=event.seq, target=dfid, title=title, fields=fields)


def _expired(event: Event, p: ApprovalExpired, base: dict[str, Any], dfid: str) -> Notice:
    fields = base | {"dfid": dfid, "detail": p.detail}
    title = f"Flow {dfid}: the approval expired ({p.detail})"
    return Notice(kind="outcome", about=event.seq, target=dfid, title=title, fields=fields)


def _superseded(event: Event, p: ApprovalSuperseded, base: dict[str, Any], dfid: str) -> Notice:
    then = f"{p.approved.name} {p.approved.version}" if p.approved else "?"
    now = f"{p.current.name} {p.current.version}" if p.current else "?"
    fields = base | {"dfid": dfid, "approved_under": then, "judged_under": now}
    fields |= {"reason_code": str(p.reason_code), "detail": p.detail, "outcome": p.outcome}
    title = f"Flow {dfid}: approved under {then}, {p.outcome} under {now}"
    return Notice(kind="outcome", about=event.seq, target=dfid, title=title, fields=fields)


def _grant_issued(event: Event, p: GrantIssued, base: dict[str, Any], dfid: str) -> Notice | None:
    quorum = p.quorum
    if quorum is None:
        return None
    fields = base | {"grant": p.grant, "kind": p.kind, "agent": p.agent}
    fields |= {"operator": p.operator, "uses": p.uses, "required": quorum.required}
    title = f"Grant {p.grant} for {p.kind} by {p.agent} needs {quorum.required} approvals"
    return Notice(kind="request", about=event.seq, target=p.grant, title=title, fields=fields)


def _grant_acted(
    event: Event, p: GrantVoted | GrantRevoked, base: dict[str, Any], dfid: str
) -> Notice:
    word = "revoked" if isinstance(p, GrantRevoked) else f"voted {p.vote}"
    fields = base | {"grant": p.grant, "operator": p.operator, "act": word}
    title = f"Grant {p.grant}: {word} by {p.operator}"
    return Notice(kind="outcome", about=event.seq, target=p.grant, title=title, fields=fields)


# The events that make a notice, each with what it says (its fields, its title).
_NOTICES: dict[type[Any], Callable[[Event, Any, dict[str, Any], str], Notice | None]] = {
    FlowEscalated: _escalated,
    ApprovalVoted: _voted,
    HumanDecided: _decided,
    ApprovalExpired: _expired,
    ApprovalSuperseded: _superseded,
    GrantIssued: _grant_issued,
    GrantVoted: _grant_acted,
    GrantRevoked: _grant_acted,
    DriftBreached: _drifted,
}


def reminder(approval: Approval, waited_ns: int, n: int) -> Notice:
    """Return the ``n``-th reminder of an approval still pending after ``waited_ns``."""
    minutes = waited_ns // 60_000_000_000
    fields = {
        "event": "reminder",
        "dfid": approval.dfid,
        "agent_id": approval.agent_id,
        "reason_code": str(approval.reason_code),
        "detail": approval.detail,
        "impact": str(approval.impact),
        "action_hash": approval.short_hash,
        "waited_s": waited_ns // 1_000_000_000,
    }
    return Notice(
        kind="reminder",
        about=approval.escalated_seq,
        target=approval.dfid,
        title=f"Still waiting ({minutes} min): {approval.reason_code} on flow {approval.dfid}",
        fields=fields,
        n=n,
    )


def generic_body(notice: Notice, hook: str) -> dict[str, Any]:
    """The generic JSON body: the notice and every field."""
    return {
        "id": notice.id,
        "hook": hook,
        "notice": notice.kind,
        "target": notice.target,
        "text": notice.title,
        **notice.fields,
    }


def slack_body(notice: Notice) -> dict[str, Any]:
    """A body a Slack incoming webhook takes: ``text``, and one section block with details."""
    lines = [f"*{_escape(notice.title)}*"]
    for key in ("reason_code", "detail", "impact", "action_hash", "waiting", "operator"):
        value = notice.fields.get(key)
        if value not in (None, ""):
            lines.append(f"{key}: {_escape(str(value))}")
    return {
        "text": _escape(notice.title),
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)}}],
    }


def _escape(text: str) -> str:
    # Slack's three control characters, and no terminal controls in anyone's channel.
    return visible(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
