"""Quorums: approvals that take more than one operator, and how votes are counted.

A pack declares, per kind, escalation reason, impact or amount, how many operators must
approve an escalated action, and which roles they must hold (:class:`Quorum`)::

    Quorum(required=2, roles=("risk", "desk-head"), kind=PlaceOrder,
           amount=notional_minor, above=5_000_000)

The escalation records the rule it needs (``FlowEscalated.quorum``), so a vote is
counted against what was asked when the flow escalated, whatever the pack says later
(an approval is judged again against the later pack before it executes). Votes are
counted by :func:`tally`, a pure function: distinct operators, each vote once, the
proposer and whoever modified the action never among them (the escalation desk refuses
their votes), and with ``distinct`` each counted vote covering a role no other covers
(two risk officers do not make "one risk and one desk-head").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from kernel.core.events import QuorumRule
from kernel.core.reasons import ReasonCode
from kernel.policy.kinds import Impact
from kernel.policy.rules import decimal_of


@dataclass(frozen=True)
class Quorum:
    """How many operators must approve an escalated action, and holding which roles.

    Args:
        required: approvals by distinct operators.
        roles: the roles (kernel.inbox.keyring) whose holders may vote; empty: any operator.
        distinct: each counted approval must cover a role no other counted one covers
            (``required`` is then at most the number of roles).
        on_reject: ``end``: one rejection ends the flow (HUMAN_REJECTED); ``vote``: a
            rejection is a vote against, and ``required`` of them end it.
        vote_ttl_s: a vote older than this (recorded clock) no longer counts; None: never.
        kind: the policy kind it is about (None: every kind of the pack).
        reasons: the escalation reasons it applies to (empty: any).
        impact: only escalations of this impact (None: any).
        amount, above: only when ``amount`` (a field, or a pure function of the typed
            parameters) is above ``above``.
        name: shown to operators ("two-person rule").
    """

    required: int = 2
    roles: tuple[str, ...] = ()
    distinct: bool = True
    on_reject: Literal["end", "vote"] = "end"
    vote_ttl_s: int | None = None
    kind: Any = None
    reasons: tuple[ReasonCode, ...] = ()
    impact: Impact | None = None
    amount: Any = ""
    above: int | str | None = None
    name: str = ""

    def rule(self) -> QuorumRule:
        """Return the rule as an escalation records it."""
        return QuorumRule(
            required=self.required,
            roles=list(self.roles),
            distinct=self.distinct and bool(self.roles),
            on_reject=self.on_reject,
            vote_ttl_s=self.vote_ttl_s or 0,
            name=self.name,
        )

    def applies(self, reason: ReasonCode, impact: Impact, params: Any) -> bool:
        """Whether an escalation for ``reason`` of an action of ``impact`` needs this quorum.

        An amount that cannot be computed counts as above (fail closed: more eyes).
        """
        if self.reasons and reason not in self.reasons:
            return False
        if self.impact is not None and impact is not self.impact:
            return False
        if self.above is None:
            return True
        try:
            value = getattr(params, self.amount) if isinstance(self.amount, str) else None
            if not isinstance(self.amount, str):
                value = self.amount(params)
        except Exception:
            return True
        amount = decimal_of(value)
        return amount is None or amount > Decimal(str(self.above))


SINGLE = QuorumRule()
"""One operator's approval: what an escalation without a quorum rule needs."""


@dataclass(frozen=True)
class Tally:
    """Votes counted against a rule.

    Attributes:
        counted: the operators whose approvals count, in voting order.
        against: the operators whose rejections count (``on_reject="vote"``).
        met: the quorum holds.
        ended: the rejections that count end it.
        waiting: what operators are shown, e.g. "1 of 2, waiting for a desk-head".
    """

    counted: list[str]
    against: list[str]
    met: bool
    ended: bool
    waiting: str


def eligible(rule: QuorumRule, roles: Sequence[str]) -> bool:
    """Whether an operator holding ``roles`` may vote under ``rule``."""
    return not rule.roles or any(role in rule.roles for role in roles)


def tally(
    rule: QuorumRule,
    approvals: Sequence[tuple[str, Sequence[str]]],
    rejections: Sequence[str] = (),
) -> Tally:
    """Count votes: ``approvals`` as (operator, roles), oldest first, each operator once.

    Votes of operators not :func:`eligible` are not counted. With ``rule.distinct``
    the largest set of approvers that cover distinct roles counts (a matching, so an
    operator holding two roles is placed where the others leave room).
    """
    voters = [(op, tuple(roles)) for op, roles in approvals if eligible(rule, roles)]
    if rule.distinct and rule.roles:
        counted = _matched(rule.roles, voters)
    else:
        counted = [op for op, _ in voters][: max(rule.required, 0)]
    against = list(rejections)
    met = len(counted) >= rule.required
    ended = rule.on_reject == "vote" and len(against) >= rule.required
    return Tally(
        counted=counted,
        against=against,
        met=met,
        ended=ended,
        waiting=waiting(rule, counted, voters),
    )


def _matched(roles: Sequence[str], voters: Sequence[tuple[str, tuple[str, ...]]]) -> list[str]:
    """Return the voters of a largest matching of voters to distinct roles, in voting order."""
    holder: dict[str, str] = {}  # role -> operator

    def place(op: str, held: tuple[str, ...], seen: set[str]) -> bool:
        for role in roles:
            if role not in held or role in seen:
                continue
            seen.add(role)
            other = holder.get(role)
            if other is None or place(other, dict(voters)[other], seen):
                holder[role] = op
                return True
        return False

    for op, held in voters:
        place(op, held, set())
    placed = set(holder.values())
    return [op for op, _ in voters if op in placed]


def _article(word: str) -> str:
    return f"an {word}" if word[:1].lower() in "aeiou" else f"a {word}"


def waiting(
    rule: QuorumRule,
    counted: Sequence[str],
    voters: Sequence[tuple[str, tuple[str, ...]]] = (),
) -> str:
    """Return what operators are shown: "1 of 2, waiting for a desk-head"."""
    have, need = len(counted), rule.required
    head = f"{have} of {need}"
    if have >= need:
        return f"{head}, quorum met"
    more = need - have
    if rule.distinct and rule.roles:
        return _waiting_for_roles(rule, head, more, counted, voters)
    if rule.roles:
        return f"{head}, waiting for {more} more ({' or '.join(rule.roles)})"
    return f"{head}, waiting for {more} more operator{'s' if more > 1 else ''}"


def _waiting_for_roles(
    rule: QuorumRule,
    head: str,
    more: int,
    counted: Sequence[str],
    voters: Sequence[tuple[str, tuple[str, ...]]],
) -> str:
    """What a quorum of distinct roles still waits for: the roles no counted vote holds."""
    held = {role for op, roles in voters if op in counted for role in roles}
    missing = [role for role in rule.roles if role not in held]
    if more == 1 and len(missing) == 1:
        return f"{head}, waiting for {_article(missing[0])}"
    return f"{head}, waiting for {more} more of {', '.join(missing or rule.roles)}"


__all__ = ["SINGLE", "Quorum", "Tally", "eligible", "tally", "waiting"]
