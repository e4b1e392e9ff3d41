"""The DIM as the owner of standing grants: issuing, voting on and revoking them.

Grants change which proposals a human must see, so they are ordered with the verdicts
they affect, as limit amendments are: the DIM records them (GrantIssued, GrantVoted,
GrantRevoked) and the proposals it judges after one in the same batch see it
(``Staged.grants``), exactly as replay will. A grant is checked before it is recorded:
its kind exists, its bounds name fields of that kind with bounds that can be judged, its
window lies ahead, its uses are at least one, a money cap has a currency the kind has a
cost in, and its issuer may vote under the quorum the kind's pack asks for grants. A
refusal is recorded (InputRefused, entry ``grant``) and is the reply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernel.core.events import (
    Event,
    GrantIssued,
    GrantRevoked,
    GrantVoted,
    InputRefused,
    Payload,
    QuorumRule,
    digest,
)
from kernel.core.reasons import ReasonCode
from kernel.core.wall import InputInvalid, clip
from kernel.dim.verdict import Staged
from kernel.policy.money import CURRENCY
from kernel.policy.packs import PolicyCatalog
from kernel.policy.quorums import Tally, eligible, tally
from kernel.policy.rules import decimal_of
from kernel.runtime.actors import Outbox
from kernel.runtime.messages import GrantMessage, IssueGrant, RevokeGrant, VoteGrant
from kernel.state.grants import BOUNDS, Grant, Grants, GrantStatus
from kernel.state.projections import Projections
from kernel.state.quorums import Vote

NS = 1_000_000_000


class GrantRefused(InputInvalid):
    """A grant act the DIM will not record: its reason code, the field at fault, and why."""

    def __init__(self, code: ReasonCode, field: str, detail: str) -> None:
        super().__init__(field, detail)
        self.reason_code = code
        self.args = (f"{code}: {field}: {detail}",)


def handle(
    msg: GrantMessage,
    catalog: PolicyCatalog,
    projections: Projections,
    now_ns: int,
    out: Outbox,
) -> None:
    """Stage what ``msg`` records, and reply with it; or record and reply why not."""
    staged = _staged(out)
    try:
        match msg:
            case IssueGrant():
                payload: Payload = _issue(msg, catalog, projections, staged, now_ns)
            case VoteGrant():
                payload = _vote(msg, projections, staged, now_ns)
            case RevokeGrant():
                payload = _revoke(msg, projections, staged)
    except GrantRefused as exc:
        target = msg.grant if not isinstance(msg, IssueGrant) else msg.kind
        out.emit(
            InputRefused(
                reason_code=exc.reason_code,
                entry="grant",
                field=exc.field,
                detail=clip(exc.detail, 1000),
                operator=clip(msg.operator),
                target=clip(target),
                inbox_id=msg.inbox_id,
            )
        )
        out.reply(msg.reply, exc)
        return
    index = out.emit(payload)
    _fold(staged, projections, payload, now_ns)
    out.reply_events(msg.reply, [index])


def _staged(out: Outbox) -> Staged:
    staged = out.scratch.get("staged")
    if staged is None:
        staged = out.scratch["staged"] = Staged()
    assert isinstance(staged, Staged)
    return staged


def _grant(grant_id: str, projections: Projections, staged: Staged) -> Grant | None:
    found = staged.grants.get(grant_id)
    return found if found is not None else projections.domain(Grants).grants.get(grant_id)


def _fold(staged: Staged, projections: Projections, payload: Payload, now_ns: int) -> None:
    """Keep what this batch recorded, for the grant acts and the verdicts after it."""
    mirror = Grants(projections)  # a scratch domain: the staged grants, folded as replay will
    mirror.grants = dict(staged.grants)
    grant_id = str(getattr(payload, "grant", ""))
    if grant_id not in mirror.grants:
        found = projections.domain(Grants).grants.get(grant_id)
        if found is not None:
            mirror.grants[grant_id] = found
    fold = mirror.folds()[type(payload)]
    fold(Event(seq=projections.last_seq + 1, ts=now_ns, payload=payload))  # type: ignore[arg-type]
    staged.grants[grant_id] = mirror.grants[grant_id]


def _issue(
    msg: IssueGrant,
    catalog: PolicyCatalog,
    projections: Projections,
    staged: Staged,
    now_ns: int,
) -> GrantIssued:
    kind = catalog.kinds.get(msg.kind)
    if kind is None:
        raise GrantRefused(ReasonCode.SCHEMA_INVALID, "kind", f"no policy kind {msg.kind!r}")
    _check_bounds(msg.bounds, tuple(kind.__struct_fields__))
    start = msg.valid_from_ns if msg.valid_from_ns is not None else now_ns
    _check_terms(msg, catalog, start, now_ns)
    quorum = _quorum_of(msg, catalog)
    content = {
        "kind": msg.kind,
        "agent": msg.agent,
        "bounds": msg.bounds,
        "from": start,
        "until": msg.valid_until_ns,
        "uses": msg.uses,
        "cap": msg.cap,
        "currency": msg.currency,
        "operator": msg.operator,
        "now": now_ns,
    }
    grant_id = "g-" + digest(content)[:12]
    if _grant(grant_id, projections, staged) is not None:
        raise GrantRefused(ReasonCode.SCHEMA_INVALID, "$", f"grant {grant_id} exists already")
    return GrantIssued(
        grant=grant_id,
        kind=msg.kind,
        valid_until_ns=msg.valid_until_ns,
        uses=msg.uses,
        operator=msg.operator,
        agent=msg.agent,
        bounds=msg.bounds,
        valid_from_ns=start,
        cap=msg.cap,
        currency=msg.currency if msg.cap is not None else "",
        roles=list(msg.roles),
        reason=msg.reason,
        quorum=quorum,
        inbox_id=msg.inbox_id,
        via=msg.via,
        signer=msg.signer,
    )


def _check_terms(msg: IssueGrant, catalog: PolicyCatalog, start: int, now_ns: int) -> None:
    """Refuse a window that ends before it begins, no use, or a cap in no currency of its kind."""
    if not msg.valid_until_ns > max(start, now_ns):
        raise GrantRefused(
            ReasonCode.SCHEMA_INVALID, "valid_until", "a grant's window must end after it begins"
        )
    if msg.uses < 1:
        raise GrantRefused(ReasonCode.SCHEMA_INVALID, "uses", "a grant is for one use or more")
    if msg.cap is None:
        return
    costs = {c.currency for c in catalog.costs_of.get(msg.kind, ())}
    if msg.cap < 0 or not CURRENCY.match(msg.currency) or msg.currency not in costs:
        raise GrantRefused(
            ReasonCode.SCHEMA_INVALID,
            "cap",
            f"a money cap is minor units >= 0 in a currency {msg.kind} has a cost in"
            f" ({', '.join(sorted(costs)) or 'none'})",
        )


def _quorum_of(msg: IssueGrant, catalog: PolicyCatalog) -> QuorumRule | None:
    """The quorum the kind's pack asks of a grant, refusing an issuer it would not count."""
    pack = catalog.pack_of[msg.kind]
    quorum = pack.grant_quorum.rule() if pack.grant_quorum is not None else None
    if quorum is not None and not eligible(quorum, msg.roles):
        raise GrantRefused(
            ReasonCode.UNAUTHORIZED,
            "operator",
            f"a grant for {msg.kind} is voted by {' or '.join(quorum.roles)};"
            f" {msg.operator} holds {', '.join(msg.roles) or 'no role'}",
        )
    return quorum


def _check_bounds(bounds: Mapping[str, Mapping[str, Any]], fields: tuple[str, ...]) -> None:
    """Refuse bounds a grant could not judge: unknown fields, unknown words, bad numbers."""
    for name, spec in bounds.items():
        where = f"bounds.{name}"
        if name not in fields or name == "kind":
            raise GrantRefused(
                ReasonCode.SCHEMA_INVALID, where, f"no field {name!r} (it has {', '.join(fields)})"
            )
        _check_bound(where, spec)


def _check_bound(where: str, spec: Mapping[str, Any]) -> None:
    """Refuse one field's bound: an unknown word, 'in' without a list, a bound not a number."""
    if not spec or any(word not in BOUNDS for word in spec):
        raise GrantRefused(
            ReasonCode.SCHEMA_INVALID, where, f"a bound is one or more of {', '.join(BOUNDS)}"
        )
    if "in" in spec and not isinstance(spec["in"], list):
        raise GrantRefused(ReasonCode.SCHEMA_INVALID, where, "'in' takes a list of values")
    for word in ("min", "max"):
        value = spec.get(word)
        if word in spec and (isinstance(value, bool) or decimal_of(value) is None):
            raise GrantRefused(
                ReasonCode.SCHEMA_INVALID, where, f"{word!r} takes a number, not {value!r}"
            )


def _vote(msg: VoteGrant, projections: Projections, staged: Staged, now_ns: int) -> GrantVoted:
    grant = _grant(msg.grant, projections, staged)
    if grant is None or grant.status is not GrantStatus.PENDING or grant.quorum is None:
        status = grant.status if grant is not None else "unknown"
        raise GrantRefused(
            ReasonCode.GRANT_NOT_LIVE, "grant", f"grant {msg.grant} is {status}, not voted on"
        )
    rule = grant.quorum
    standing = _standing(grant.votes, rule, now_ns)
    _check_voter(msg, rule, standing)
    new = Vote(operator=msg.operator, vote=msg.vote, roles=list(msg.roles), ts=now_ns)
    counted = _tally(rule, [*standing, new])
    ended = counted.ended or (msg.vote == "reject" and rule.on_reject == "end")
    return GrantVoted(
        grant=msg.grant,
        vote=msg.vote,
        operator=msg.operator,
        roles=list(msg.roles),
        reason=msg.reason,
        counted=counted.counted,
        against=counted.against,
        met=counted.met and not ended,
        ended=ended,
        waiting=counted.waiting,
        inbox_id=msg.inbox_id,
        via=msg.via,
        signer=msg.signer,
    )


def _tally(rule: QuorumRule, votes: list[Vote]) -> Tally:
    """Count the standing votes: approvals with their roles, rejections by those who count."""
    approvals = [(v.operator, v.roles) for v in votes if v.vote == "approve"]
    against = [v.operator for v in votes if v.vote == "reject" and eligible(rule, v.roles)]
    return tally(rule, approvals, against)


def _check_voter(msg: VoteGrant, rule: QuorumRule, standing: list[Vote]) -> None:
    """Refuse a vote that is neither approve nor reject, a second vote, a voter not counted."""
    if msg.vote not in ("approve", "reject"):
        raise GrantRefused(ReasonCode.SCHEMA_INVALID, "vote", "a vote is approve or reject")
    if any(v.operator == msg.operator for v in standing):
        raise GrantRefused(
            ReasonCode.DUPLICATE_VOTE, "operator", f"{msg.operator} voted on {msg.grant} already"
        )
    if not eligible(rule, msg.roles):
        raise GrantRefused(
            ReasonCode.UNAUTHORIZED,
            "operator",
            f"grant {msg.grant} is voted by {' or '.join(rule.roles)};"
            f" {msg.operator} holds {', '.join(msg.roles) or 'no role'}",
        )


def _standing(votes: list[Vote], rule: QuorumRule, now_ns: int) -> list[Vote]:
    ttl = rule.vote_ttl_s
    return [v for v in votes if not ttl or v.ts >= now_ns - ttl * NS]


def _revoke(msg: RevokeGrant, projections: Projections, staged: Staged) -> GrantRevoked:
    grant = _grant(msg.grant, projections, staged)
    if grant is None or grant.status not in (GrantStatus.PENDING, GrantStatus.LIVE):
        status = grant.status if grant is not None else "unknown"
        raise GrantRefused(
            ReasonCode.GRANT_NOT_LIVE, "grant", f"grant {msg.grant} is {status}: nothing to revoke"
        )
    return GrantRevoked(
        grant=msg.grant,
        operator=msg.operator,
        reason=msg.reason,
        inbox_id=msg.inbox_id,
        via=msg.via,
        signer=msg.signer,
    )


__all__ = ["GrantRefused", "handle"]
