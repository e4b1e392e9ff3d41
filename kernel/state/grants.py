"""Standing grants: approvals given before the proposals they approve, as a domain.

An operator grants (GrantIssued): for one agent or all, proposals of one kind whose
parameters lie within bounds, valid from one time until another on the recorded clock,
for N uses and, optionally, up to a money cap. A grant that needs a quorum
(``PolicyPack.grant_quorum``) is *pending* until its votes meet it (GrantVoted); then it
is *live*. The DIM, judging a proposal that would escalate for a human, accepts it
instead when a live grant matches (:func:`covering`), and records the use with the
acceptance (GrantUsed), so uses and money are counted exactly in journal order, however
many proposals race: the DIM judges one at a time and counts what its batch staged.
An operator revokes a grant (GrantRevoked); one past its window or its uses simply
matches nothing more. The fold reads no clock: whether a grant is live *now* is a
question asked with the time (:func:`live`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from enum import StrEnum
from typing import Any

import msgspec

from kernel.core.events import (
    Event,
    GrantIssued,
    GrantRevoked,
    GrantUsed,
    GrantVoted,
    Payload,
    QuorumRule,
)
from kernel.policy.money import format_money
from kernel.policy.quorums import tally
from kernel.policy.rules import decimal_of
from kernel.state.domain import OMIT, Domain, Fold, Saved, State
from kernel.state.quorums import Vote

BOUNDS = ("eq", "in", "min", "max")
"""What a grant may say of one parameter: equal to, one of, at least, at most."""
_WORDS = {"eq": "=", "in": "in", "min": ">=", "max": "<="}


class GrantStatus(StrEnum):
    """Where a grant is: waiting for its quorum, in force, or taken out of force."""

    PENDING = "PENDING"
    LIVE = "LIVE"
    REVOKED = "REVOKED"
    REJECTED = "REJECTED"


class Grant(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A standing grant as of the last event that touched it."""

    grant: str
    kind: str
    agent: str
    bounds: dict[str, dict[str, Any]]
    valid_from_ns: int
    valid_until_ns: int
    uses: int
    cap: int | None
    currency: str
    operator: str
    reason: str
    issued_seq: int
    issued_ts: int
    quorum: QuorumRule | None = None
    votes: list[Vote] = []
    status: GrantStatus = GrantStatus.LIVE
    used: int = 0
    spent: int = 0
    revoked_by: str = ""
    waiting: str = ""

    def approvers(self) -> list[tuple[str, list[str]]]:
        """The operators who approved the grant (the issuer first), with their roles."""
        return [(v.operator, v.roles) for v in self.votes if v.vote == "approve"]


def live(grant: Grant, now_ns: int) -> bool:
    """Whether ``grant`` is in force at ``now_ns``: live, in its window, uses left."""
    return (
        grant.status is GrantStatus.LIVE
        and grant.valid_from_ns <= now_ns <= grant.valid_until_ns
        and grant.used < grant.uses
    )


def within(bounds: Mapping[str, Mapping[str, Any]], params: Mapping[str, Any]) -> bool:
    """Whether ``params`` lie within every bound (a missing parameter lies within none)."""
    return all(_within(spec, params.get(name, _MISSING)) for name, spec in bounds.items())


_MISSING = object()


def _within(spec: Mapping[str, Any], value: Any) -> bool:
    if value is _MISSING:
        return False
    if "eq" in spec and value != spec["eq"]:
        return False
    if "in" in spec and value not in spec["in"]:
        return False
    return _in_range(spec, value)


def _in_range(spec: Mapping[str, Any], value: Any) -> bool:
    if "min" not in spec and "max" not in spec:
        return True
    number = decimal_of(value) if not isinstance(value, bool) else None
    if number is None:
        return False  # a bound on a number holds no text: fail closed
    low, high = decimal_of(spec.get("min")), decimal_of(spec.get("max"))
    return (low is None or number >= low) and (high is None or number <= high)


def covering(
    grants: Iterable[Grant],
    kind: str,
    agent_id: str,
    params: Mapping[str, Any],
    now_ns: int,
    *,
    needs: QuorumRule,
    cost: Mapping[str, int],
    staged: Mapping[str, tuple[int, int]] | None = None,
) -> Grant | None:
    """Return the first live grant (in issue order) that covers a proposal, or None.

    Args:
        grants: the grants as folded.
        kind, agent_id, params: the proposal.
        now_ns: the DIM's time.
        needs: the quorum the escalation would need: the grant's approvers must meet it.
        cost: what the proposal costs, by currency (a capped grant needs its currency).
        staged: uses and money each grant's acceptances staged in this batch.
    """
    for grant in sorted(grants, key=lambda g: g.issued_seq):
        used, spent = (staged or {}).get(grant.grant, (0, 0))
        current = msgspec.structs.replace(grant, used=grant.used + used, spent=grant.spent + spent)
        if (
            current.kind == kind
            and current.agent in ("*", agent_id)
            and live(current, now_ns)
            and within(current.bounds, params)
            and _affordable(current, cost)
            and tally(needs, current.approvers()).met
        ):
            return current
    return None


def _affordable(grant: Grant, cost: Mapping[str, int]) -> bool:
    if grant.cap is None:
        return True
    amount = cost.get(grant.currency)
    return amount is not None and grant.spent + amount <= grant.cap


class Grants(Domain):
    """The standing grants (saved as ``grants``)."""

    name = "grants"

    def __init__(self, projections: State) -> None:
        self.grants: dict[str, Grant] = {}

    def folds(self) -> Mapping[type[Payload], Fold]:
        return {
            GrantIssued: self._issued,
            GrantVoted: self._voted,
            GrantRevoked: self._revoked,
            GrantUsed: self._used,
        }

    def saved(self) -> Sequence[Saved]:
        return (
            Saved(
                name="grants",
                type=dict[str, Grant],
                get=lambda: self.grants,
                load=self._load,
                copy=dict,
                canonical=_unless_empty,
                default={},
            ),
        )

    def _load(self, grants: dict[str, Grant]) -> None:
        self.grants = grants

    def _issued(self, event: Event) -> None:
        p: GrantIssued = event.payload  # type: ignore[assignment]
        first = Vote(operator=p.operator, vote="approve", roles=list(p.roles), ts=event.ts)
        pending = p.quorum is not None and not tally(p.quorum, [(p.operator, p.roles)]).met
        self.grants[p.grant] = Grant(
            grant=p.grant,
            kind=p.kind,
            agent=p.agent,
            bounds=p.bounds,
            valid_from_ns=p.valid_from_ns,
            valid_until_ns=p.valid_until_ns,
            uses=p.uses,
            cap=p.cap,
            currency=p.currency,
            operator=p.operator,
            reason=p.reason,
            issued_seq=event.seq,
            issued_ts=event.ts,
            quorum=p.quorum,
            votes=[first],
            status=GrantStatus.PENDING if pending else GrantStatus.LIVE,
        )

    def _voted(self, event: Event) -> None:
        p: GrantVoted = event.payload  # type: ignore[assignment]
        grant = self.grants.get(p.grant)
        if grant is None:
            return
        status = grant.status
        if p.met:
            status = GrantStatus.LIVE
        elif p.ended:
            status = GrantStatus.REJECTED
        vote = Vote(operator=p.operator, vote=p.vote, roles=list(p.roles), ts=event.ts)
        self.grants[p.grant] = msgspec.structs.replace(
            grant, votes=[*grant.votes, vote], status=status, waiting=p.waiting
        )

    def _revoked(self, event: Event) -> None:
        p: GrantRevoked = event.payload  # type: ignore[assignment]
        grant = self.grants.get(p.grant)
        if grant is not None:
            self.grants[p.grant] = msgspec.structs.replace(
                grant, status=GrantStatus.REVOKED, revoked_by=p.operator
            )

    def _used(self, event: Event) -> None:
        p: GrantUsed = event.payload  # type: ignore[assignment]
        grant = self.grants.get(p.grant)
        if grant is not None:
            self.grants[p.grant] = msgspec.structs.replace(
                grant, used=grant.used + 1, spent=grant.spent + p.amount
            )


def _unless_empty(grants: dict[str, Grant]) -> Any:
    return dict(sorted(grants.items())) if grants else OMIT


def amount_text(value: Any) -> str:
    """A bound's number as a decimal string (what a grant records), or the value's text."""
    number = decimal_of(value)
    return str(number) if isinstance(number, Decimal) else str(value)


def describe(grant: Grant) -> str:
    """One line saying what a grant allows (for CLI, console and MCP)."""
    bounds = ", ".join(
        f"{name} {_WORDS.get(word, word)} {value}"
        for name, spec in grant.bounds.items()
        for word, value in spec.items()
    )
    cap = f", up to {format_money(grant.cap, grant.currency)}" if grant.cap is not None else ""
    return (
        f"{grant.kind} by {grant.agent}" + (f" where {bounds}" if bounds else "") + f"{cap},"
        f" {grant.used} of {grant.uses} uses"
    )
