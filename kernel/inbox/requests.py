"""Every request the operator inbox carries: one tagged union, one decoder, one envelope.

A row of the inbox holds one :class:`Signed` envelope as JSON bytes: the request (a
member of :data:`InboxRequest`, told apart by its ``type``), the id of the journal it
is meant for, the request's own random id, the name of the key that signed it, and
the Ed25519 signature over the envelope's canonical bytes (kernel.inbox.proof). The
fields use the wall's bounded types (kernel.core.wall), so decoding a row *is*
checking it: a string too long, a number out of range, an unknown field or type, or
bytes that are not UTF-8 are refused before anything reads them.

Clients build the same structs and run them through :func:`normalized` before
signing, so what ``dirk decide``, the console and the MCP server send is exactly what
the kernel will decode; a request the kernel would refuse at its wall is refused
where it is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from kernel.core.events import TenantSpec
from kernel.core.wall import (
    INT_MAX,
    Confidence,
    Id,
    InputInvalid,
    Int64,
    Name,
    Reason,
    Seconds,
    Text,
    check_value,
)
from kernel.policy.money import parse_money
from kernel.runtime.messages import Decision
from kernel.state.projections import AgentStatus

RequestId = Annotated[str, Meta(min_length=16, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
"""A request's own id: random, base64url, drawn by whoever signs it (``new_request_id``)."""
Signature = Annotated[str, Meta(max_length=128)]
ValidFor = Annotated[int, Meta(ge=1, le=INT_MAX)]
"""How many seconds after its signing a request may be taken (the keyring's policy bounds it)."""
VALID_S = 900
"""The validity window a signer gives a request unless told otherwise: 15 minutes."""
Verifier = Annotated[str, Meta(max_length=80)]
PROPOSE_TOPIC = "inbox"
"""Flows of proposals from the inbox open on ``inbox.<agent>.<row id>``."""


class _Request(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    omit_defaults=True,
    tag_field="type",
):
    """What every request shares: it is frozen, tagged by ``type`` and has no stray field."""


class DecideRequest(_Request, frozen=True, tag="decide"):
    """A human decision on escalated flow ``dfid`` (``dirk decide``, the console, MCP).

    ``action_hash`` names the action the decision was made on: the kernel refuses a
    decision for another (ACTION_MISMATCH), and an inbox decision must name one.
    """

    dfid: Name
    decision: Decision
    operator: Name
    reason: Reason
    params: dict[Id, Any] | None = None
    action_hash: Id | None = None


class AmendRequest(_Request, frozen=True, tag="amend"):
    """Set one of an agent's pack limits for ``ttl_s`` seconds (``dirk amend``)."""

    agent_id: Name
    limit: Name
    value: Int64 | Annotated[str, Meta(min_length=1, max_length=64)]
    ttl_s: Seconds
    operator: Name
    reason: Reason


class AgentStatusRequest(_Request, frozen=True, tag="agent_status"):
    """Change an agent's status (``dirk agent --set``, the console's agents page)."""

    agent_id: Name
    status: AgentStatus
    operator: Name
    reason: Reason


class CredentialRequest(_Request, frozen=True, tag="credential"):
    """Provision or rotate an agent's credential: only its verifier, never the secret."""

    agent_id: Name
    verifier: Verifier
    operator: Name
    reason: Reason


class RuleDecisionRequest(_Request, frozen=True, tag="rule"):
    """Override or skip a rule proposal the promoter deferred to an operator."""

    proposal_seq: Annotated[int, Meta(ge=1, le=INT_MAX)]
    decision: Literal["override", "skip"]
    operator: Name
    reason: Reason


class RuleChangeRequest(_Request, frozen=True, tag="rule_change"):
    """Add, edit or retract a rule as an operator (an override, recorded with who and why).

    An add or edit names the version it was made on (``base_version``) and carries a
    title and a text; a retract carries neither.
    """

    action: Literal["add", "edit", "retract"]
    rule: Name
    operator: Name
    reason: Reason
    title: Text = ""
    content: Text = ""
    labels: list[Id] = []
    base_version: Annotated[int, Meta(ge=0, le=INT_MAX)] = 0
    ns: Name = "default"
    """The rulebook namespace the rule lives in (kernel.state.rulebook)."""


class CollectArtifactsRequest(_Request, frozen=True, tag="collect_artifacts"):
    """Collect the artifacts nothing live references (``dirk artifacts gc``), on record."""

    operator: Name
    reason: Reason


Short = Annotated[str, Meta(max_length=128)]


class DeclareTenantRequest(_Request, frozen=True, tag="declare_tenant"):
    """Declare a tenant, or declare it again: its members and layered policy (TenantDeclared).

    The whole spec replaces the one before (docs/identity.md).
    """

    tenant: TenantSpec
    operator: Name
    reason: Text = ""


class ChangeTenantPolicyRequest(_Request, frozen=True, tag="tenant_policy"):
    """Set one layer of a tenant's policy (TenantPolicyChanged), in force from the next call.

    ``user`` and ``kind`` empty: a tier's default; ``tier`` ``*``: every tier at that
    level. A field left None keeps its value; ``scopes`` replaces the user's scopes.
    """

    tenant: Name
    operator: Name
    tier: Short = "*"
    user: Short = ""
    kind: Short = ""
    permission: Literal["allow", "flag", "deny"] | None = None
    rate_per_minute: Annotated[int, Meta(ge=0, le=INT_MAX)] | None = None
    scopes: list[Short] | None = None
    reason: Text = ""


class ProposeRequest(_Request, frozen=True, tag="propose"):
    """An agent's proposal from another process (``dirk mcp`` following this journal).

    The kernel opens a flow for it on ``inbox.<agent>.<row id>``, in which the agent
    proposes ``policy``; the DIM judges it like any other. Signed with the agent's
    own key, never a door's.
    """

    agent_id: Name
    policy: dict[Id, Any]
    explain: Text = ""
    confidence: Confidence = 1.0


GrantId = Annotated[str, Meta(min_length=3, max_length=64, pattern=r"^g-[0-9a-f]+$")]
Uses = Annotated[int, Meta(ge=1, le=1_000_000)]
Bound = dict[Annotated[str, Meta(pattern=r"^(eq|in|min|max)$")], Any]


class GrantRequest(_Request, frozen=True, tag="grant"):
    """A standing grant (``dirk grant add``): proposals it matches proceed without a human.

    For ``agent`` (``*``: any) and ``kind``, within ``bounds`` (per field: ``eq``, ``in``,
    ``min``, ``max``), from ``valid_from_ns`` (default: when the kernel takes it) until
    ``valid_until_ns``, or for ``valid_for_s`` from then; ``uses`` times at most; with
    ``cap`` (minor units of ``currency``), for at most that much money in all.
    """

    kind: Id
    operator: Name
    reason: Reason
    uses: Uses
    agent: Name = "*"
    bounds: dict[Id, Bound] = {}
    valid_from_ns: Int64 | None = None
    valid_until_ns: Int64 | None = None
    valid_for_s: Seconds | None = None
    cap: Annotated[int, Meta(ge=0, le=INT_MAX)] | None = None
    currency: Annotated[str, Meta(pattern=r"^([A-Z]{3})?$")] = ""


class RevokeGrantRequest(_Request, frozen=True, tag="revoke_grant"):
    """Take a standing grant out of force (``dirk grant revoke``)."""

    grant: GrantId
    operator: Name
    reason: Reason


class VoteRequest(_Request, frozen=True, tag="vote"):
    """A vote on a standing grant that waits for its quorum (``dirk grant vote``).

    An escalated flow is voted on with a decision (``decide``): its approve or reject.
    """

    grant: GrantId
    vote: Literal["approve", "reject"]
    operator: Name
    reason: Reason


Digest = Annotated[str, Meta(max_length=64, pattern=r"^([0-9a-f]{64})?$")]
"""A SHA-256 in hex (a shadow report's digest), or empty."""
Version = Annotated[str, Meta(max_length=64, pattern=r"^[0-9A-Za-z.+_-]*$")]


class ShadowRequest(_Request, frozen=True, tag="shadow"):
    """Load, retire or promote the shadow of pack ``pack`` (``dirk shadow load|retire|promote``).

    ``version``, when given, must be the shadow's; ``report``, when given, must be the
    digest of the shadow's report as the kernel computes it when it promotes (the one
    reviewed: SHADOW_REPORT_CHANGED otherwise). Loading takes the candidate's code, which
    no request carries: ``load`` names one the embedding program offered
    (``Kernel.offer_shadow``) by ``version`` (required), and ``candidate``, when given,
    is the content hash the operator reviewed (SHADOW_INVALID if the offered one differs).
    """

    action: Literal["retire", "promote", "load"]
    pack: Name
    operator: Name
    reason: Reason
    version: Version = ""
    report: Digest = ""
    candidate: Digest = ""


InboxRequest = (
    DecideRequest
    | AmendRequest
    | AgentStatusRequest
    | CredentialRequest
    | RuleDecisionRequest
    | RuleChangeRequest
    | ProposeRequest
    | CollectArtifactsRequest
    | GrantRequest
    | RevokeGrantRequest
    | VoteRequest
    | DeclareTenantRequest
    | ChangeTenantPolicyRequest
    | ShadowRequest
)
"""Every request the inbox takes; ``type`` tells them apart."""

OperatorRequest = (
    DecideRequest
    | AmendRequest
    | AgentStatusRequest
    | CredentialRequest
    | RuleDecisionRequest
    | RuleChangeRequest
    | CollectArtifactsRequest
    | GrantRequest
    | RevokeGrantRequest
    | VoteRequest
    | DeclareTenantRequest
    | ChangeTenantPolicyRequest
    | ShadowRequest
)
"""The requests an operator makes (each names its ``operator``); the others are agents'."""


class Signed(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One row of the inbox: a request, whom and what it is for, and its proof.

    Attributes:
        request: what is asked.
        journal_id: the journal it is meant for: a row copied into another journal
            does not verify there.
        request_id: the request's own random id: a row that repeats it is refused.
        signer: the name of the key that signed, as the kernel's keyring holds it.
        signed_ns: when it was signed (unix nanoseconds, the signer's clock).
        valid_s: for how long after ``signed_ns`` the kernel may take it (the keyring's
            policy may shorten it: kernel.inbox.keyring.Policy).
        signature: Ed25519 over the canonical bytes of all the above (kernel.inbox.proof).

    A row written before requests carried their time has neither ``signed_ns`` nor
    ``valid_s``: it still decodes, and its signature still covers the bytes it was
    made over (kernel.inbox.proof.signed_bytes), but a kernel refuses it as expired
    (REQUEST_EXPIRED) when it comes to take it. Rows taken before are never taken
    again, so the journals that recorded them replay and verify as they did.
    """

    request: InboxRequest
    journal_id: Id
    request_id: RequestId
    signer: Name
    signed_ns: Int64 | None = None
    valid_s: ValidFor | None = None
    signature: Signature = ""


class Unstamped(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An envelope as rows were signed before they carried their time (for their bytes)."""

    request: InboxRequest
    journal_id: Id
    request_id: RequestId
    signer: Name
    signature: Signature = ""


_decoder = msgspec.json.Decoder(Signed)
_request_decoder = msgspec.json.Decoder(InboxRequest)
_encoder = msgspec.json.Encoder(order="sorted")


def request_type(request: InboxRequest) -> str:
    """Return the ``type`` a request is written with (``decide``, ``amend``...)."""
    tag = request.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def principal_of(request: InboxRequest) -> str:
    """Return whom a request acts as: its operator, or the agent that proposes."""
    if isinstance(request, ProposeRequest):
        return request.agent_id
    return request.operator


def encode(value: Signed | Unstamped | InboxRequest) -> bytes:
    """Return the canonical JSON bytes of a request or an envelope (sorted keys)."""
    return _encoder.encode(value)


def decode_row(body: bytes) -> Signed:
    """Decode and check one inbox row.

    Raises:
        InputInvalid: the bytes are not UTF-8 JSON, not an envelope, or a field of it
            is of the wrong type, out of range, too long or too deep (the ``field``
            names it).
    """
    try:
        signed = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise InputInvalid(_field(exc), str(exc)[:500]) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise InputInvalid("$", f"not a JSON object in UTF-8 ({exc})"[:500]) from None
    except RecursionError:
        raise InputInvalid("$", "nested too deep") from None
    _check_free_form(signed.request)
    return signed


def normalized(request: InboxRequest) -> InboxRequest:
    """Return ``request`` as the kernel will decode it, or refuse it as the kernel would.

    Building a Struct checks nothing; a round trip through the decoder does (types,
    bounds, lengths, enums), and the free-form values (``params``, ``policy``) are
    walked with the wall's bounds. Clients sign what this returns.

    Raises:
        InputInvalid: naming the first field the kernel's wall would refuse.
    """
    # Before encoding: JSON would write a NaN as null, and the check would pass on that.
    _check_free_form(request)
    try:
        body = _encoder.encode(request)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        # A lone surrogate does not encode as UTF-8; nor does an integer past 64 bits.
        raise InputInvalid("$", f"not plain data in UTF-8: {exc}"[:500]) from None
    try:
        decoded: InboxRequest = _request_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise InputInvalid(_field(exc), str(exc)[:500]) from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InputInvalid("$", f"not JSON the kernel reads: {exc}"[:500]) from None
    _check_free_form(decoded)
    return decoded


def _check_free_form(request: InboxRequest) -> None:
    """Walk a request's free-form values with the wall's bounds (depth, size, finiteness)."""
    if isinstance(request, DecideRequest) and request.params is not None:
        check_value(request.params, "params")
    elif isinstance(request, GrantRequest):
        check_value(request.bounds, "bounds")
        if (request.valid_until_ns is None) == (request.valid_for_s is None):
            raise InputInvalid("valid_until_ns", "a grant ends: valid_until_ns or valid_for_s")
        if (request.cap is None) != (not request.currency):
            raise InputInvalid("currency", "a money cap takes its currency, and only then")
    elif isinstance(request, ProposeRequest):
        check_value(request.policy, "policy")
        if not isinstance(request.policy, dict) or not isinstance(request.policy.get("kind"), str):
            raise InputInvalid("policy.kind", 'a policy names its "kind"')


def _field(exc: msgspec.ValidationError) -> str:
    text = str(exc)
    if " - at `" in text:
        path = text.rsplit(" - at `", 1)[1].rstrip("`")
        return path.removeprefix("$.").removeprefix("$") or "$"
    return "$"


def grant_request(
    kind: str,
    *,
    operator: str,
    reason: str,
    uses: int,
    agent: str = "*",
    bounds: Mapping[str, Mapping[str, Any]] | None = None,
    valid_from_ns: int | None = None,
    valid_until_ns: int | None = None,
    valid_for_s: float | None = None,
    cap: str | None = None,
) -> GrantRequest:
    """Return the normalized request for a standing grant; ``cap`` is money text.

    The one builder for the API (``Kernel.grant``) and the doors (``prepare.grant_request``).

    Raises:
        InputInvalid: a ``cap`` that is not money (``"1,000.00 EUR"``), or a field the
            kernel's wall refuses.
    """
    amount, currency = None, ""
    if cap is not None:
        try:
            amount, currency = parse_money(cap)
        except ValueError as exc:
            raise InputInvalid("cap", str(exc)) from None
    request = normalized(
        GrantRequest(
            kind=kind,
            operator=operator,
            reason=reason,
            uses=uses,
            agent=agent,
            bounds={k: dict(v) for k, v in (bounds or {}).items()},
            valid_from_ns=valid_from_ns,
            valid_until_ns=valid_until_ns,
            valid_for_s=valid_for_s,
            cap=amount,
            currency=currency,
        )
    )
    assert isinstance(request, GrantRequest)
    return request
