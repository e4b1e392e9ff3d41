"""Events of approvals and what stands in for them: quorum votes, standing grants, money.

Money is integer minor units of an ISO 4217 currency everywhere (``amount`` and
``currency`` side by side), never a float: what is hashed and judged is exact.
"""

from __future__ import annotations

from typing import Any

from kernel.core._records import PackRef, Payload, Record
from kernel.core.reasons import ReasonCode


class QuorumRule(Record, frozen=True):
    """What an approval (or a grant) needs before it holds, as recorded when it opened.

    Attributes:
        required: approvals by distinct operators.
        roles: the operator roles that may vote (kernel.inbox.keyring); empty: any operator.
        distinct: each counted approval covers a role no other counted one covers (so
            ``required=2, roles=[risk, desk-head]`` takes one of each).
        on_reject: ``end`` (a rejection ends it) or ``vote`` (a rejection is a vote against;
            ``required`` of them end it).
        vote_ttl_s: a vote older than this on the recorded clock no longer counts (0: never).
        name: the pack's name for the rule (shown to operators).
    """

    required: int = 1
    roles: list[str] = []
    distinct: bool = True
    on_reject: str = "end"
    vote_ttl_s: int = 0
    name: str = ""


class ApprovalVoted(Payload, frozen=True, tag=True):
    """One operator's vote on an approval that needs a quorum (``FlowEscalated.quorum``).

    ``counted`` are the operators whose approvals count after this vote (their votes not
    expired), ``against`` those whose rejections do; ``met`` says the quorum holds with this
    vote (a HumanDecided approve follows in the same append). ``waiting`` is what operators
    are shown: "1 of 2, waiting for a desk-head". ``roles`` are the voter's, as the keyring
    held them when the vote was taken.
    """

    vote: str
    operator: str
    roles: list[str] = []
    reason: str = ""
    action_hash: str = ""
    counted: list[str] = []
    against: list[str] = []
    required: int = 1
    met: bool = False
    waiting: str = ""
    inbox_id: int | None = None
    via: str = ""
    signer: str = ""


class ApprovalSuperseded(Payload, frozen=True, tag=True):
    """An approved (or granted, or queued) action, judged again just before it would execute,
    no longer passes what is in force now.

    ``approved`` is the pack version the action was judged and approved under, ``current``
    the one in force now; ``reason_code``, ``detail``, ``layer`` and ``rule`` say what the
    judgement now finds. ``outcome`` is ``refused`` (FlowAborted APPROVAL_SUPERSEDED
    follows) or ``escalated`` (a fresh FlowEscalated follows: a new approval, new votes).
    ``via`` names what had let the action through: ``approval``, ``grant`` or ``queue``.
    """

    reason_code: ReasonCode
    action_hash: str = ""
    approved: PackRef | None = None
    current: PackRef | None = None
    detail: str = ""
    layer: str = ""
    rule: str = ""
    outcome: str = "refused"
    via: str = "approval"


class GrantIssued(Payload, frozen=True, tag=True):
    """An operator's standing grant: proposals it matches that would wait for a human proceed.

    A proposal of ``kind`` by ``agent`` (``*``: any agent) whose parameters lie within
    ``bounds`` (per field: ``eq``, ``in``, ``min``, ``max``; numbers as decimal strings)
    is accepted instead of escalated, from ``valid_from_ns`` until ``valid_until_ns`` on
    the recorded clock, ``uses`` times at most, and for at most ``cap`` minor units of
    ``currency`` in all (``cap`` None: no money cap). With ``quorum`` the grant waits for
    that many approvals (the issuer's is the first) before it is live (GrantVoted).
    """

    grant: str
    kind: str
    valid_until_ns: int
    uses: int
    operator: str
    agent: str = "*"
    bounds: dict[str, dict[str, Any]] = {}
    valid_from_ns: int = 0
    cap: int | None = None
    currency: str = ""
    roles: list[str] = []
    reason: str = ""
    quorum: QuorumRule | None = None
    inbox_id: int | None = None
    via: str = ""
    signer: str = ""


class GrantVoted(Payload, frozen=True, tag=True):
    """A vote on a grant that waits for its quorum; ``met``: the grant is live from here on."""

    grant: str
    vote: str
    operator: str
    roles: list[str] = []
    reason: str = ""
    counted: list[str] = []
    against: list[str] = []
    met: bool = False
    ended: bool = False
    """Rejections ended the grant before it was ever live."""
    waiting: str = ""
    inbox_id: int | None = None
    via: str = ""
    signer: str = ""


class GrantRevoked(Payload, frozen=True, tag=True):
    """An operator took a grant out of force: no proposal matches it from here on."""

    grant: str
    operator: str
    reason: str = ""
    inbox_id: int | None = None
    via: str = ""
    signer: str = ""


class GrantUsed(Payload, frozen=True, tag=True):
    """A proposal of this flow that would have waited for a human proceeded under ``grant``.

    Recorded with its acceptance; ``amount`` (minor units of ``currency``) counts against
    the grant's money cap, and ``uses`` is how many of its uses are now spent.
    """

    grant: str
    uses: int
    amount: int = 0
    currency: str = ""
    escalation: ReasonCode | None = None
    """What the proposal would have escalated for without the grant."""


class ReasoningCharged(Payload, frozen=True, tag=True):
    """What a flow's reasoning cost, by the price table in force (``KernelConfig.prices``).

    ``tokens`` by model as the agent reported them; ``amount`` is their price in minor
    units of ``currency``, rounded up. It counts against the money budgets that count
    reasoning (``Budget(reasoning=True)``), spent at once: thought cannot be given back.
    """

    tokens: dict[str, int]
    amount: int
    currency: str
    pools: list[str] = []
    """The money pools it is spent in (the budgets counting reasoning, for this flow)."""
    unpriced: list[str] = []
    """Models the price table does not name (their tokens are priced at nothing)."""


class WebhookDelivered(Payload, frozen=True, tag=True):
    """A webhook took a notice (an approval request, a reminder, an outcome) about event ``about``.

    ``hook`` is the webhook's configured name (never its URL's secret parts, never its key);
    ``status`` the HTTP status it answered with, after ``attempts`` tries.
    """

    hook: str
    notice: str
    about: int
    status: int
    attempts: int = 1
    target: str = ""
    """The flow (or grant) the notice is about."""


class WebhookFailed(Payload, frozen=True, tag=True):
    """A webhook did not take a notice after ``attempts`` tries; ``error`` says the last answer."""

    hook: str
    notice: str
    about: int
    error: str
    attempts: int = 1
    target: str = ""
    dropped: bool = False
    """Never sent: the queue of notices was full (the kernel never waits for a webhook)."""


__all__ = [
    "ApprovalSuperseded",
    "ApprovalVoted",
    "GrantIssued",
    "GrantRevoked",
    "GrantUsed",
    "GrantVoted",
    "QuorumRule",
    "ReasoningCharged",
    "WebhookDelivered",
    "WebhookFailed",
]
