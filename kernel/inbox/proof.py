"""Proof of who asked: a request is signed with its principal's own Ed25519 key.

The signature covers the canonical bytes of the whole envelope (kernel.inbox.requests
:class:`~kernel.inbox.requests.Signed` without its signature): the request, the
journal it is meant for, its own random id and the signer's name, under the context
label :data:`CONTEXT` (kernel.core.keys), so it proves nothing anywhere else. The
kernel checks it against the public key its keyring (kernel.inbox.keyring) holds for
the signer, and what the signer's role lets it ask:

- an ``operator`` key signs requests whose ``operator`` is itself;
- a ``door`` key (the console, an MCP server) signs operator requests for the
  operators it signed in; the record names the door as the signer;
- an ``agent`` key signs ``propose`` requests for itself.

So whoever can write the inbox table but holds no key can ask nothing: a row naming
any operator, a forged or altered signature, a row signed for another journal, or a
human act signed by an agent's key is refused, and the refusal recorded.
"""

from __future__ import annotations

import secrets

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kernel.core import keys
from kernel.core.reasons import ReasonCode
from kernel.inbox.keyring import Keyring, Policy, Principal
from kernel.inbox.requests import (
    VALID_S,
    InboxRequest,
    ProposeRequest,
    Signed,
    Unstamped,
    decode_row,
    encode,
    normalized,
    principal_of,
)

CONTEXT = "dirk/inbox-request/v1"
"""What an inbox signature is for (kernel.core.keys): it proves nothing elsewhere."""


class ProofRefused(Exception):
    """A row whose proof does not hold: a reason code, the field at fault, and why."""

    def __init__(self, code: ReasonCode, field: str, detail: str) -> None:
        super().__init__(f"{code}: {field}: {detail}")
        self.reason_code = code
        self.field = field
        self.detail = detail


class Proof(msgspec.Struct, frozen=True, kw_only=True):
    """A request whose proof checked out, and the row that carried it.

    Attributes:
        inbox_id: the row's id (what the events it causes name).
        request_id: the request's own id (inside the signed bytes).
        principal: whom it acts as (its operator, or the proposing agent).
        signer: the key's name: the principal itself, or a door acting for it.
        role: the signer's role in the keyring.
        fingerprint: the signer's key, shortened (kernel.core.keys.fingerprint).
    """

    inbox_id: int
    request_id: str
    principal: str
    signer: str
    role: str
    fingerprint: str
    roles: tuple[str, ...] = ()
    """The principal's operator roles in the keyring when the row was taken."""


def new_request_id() -> str:
    """Return a fresh request id: 128 random bits in base64url."""
    return secrets.token_urlsafe(16)


def signed_bytes(envelope: Signed) -> bytes:
    """Return the bytes a signature covers: the envelope without its signature.

    An envelope with no time (a row signed before rows carried one) is covered by the
    bytes it was signed as: without the time's fields. Adding a time to such a row, or
    taking one away from a stamped row, breaks its signature.
    """
    if envelope.signed_ns is None and envelope.valid_s is None:
        return encode(
            Unstamped(
                request=envelope.request,
                journal_id=envelope.journal_id,
                request_id=envelope.request_id,
                signer=envelope.signer,
            )
        )
    return encode(msgspec.structs.replace(envelope, signature=""))


def sign(
    request: InboxRequest,
    *,
    key: Ed25519PrivateKey,
    signer: str,
    journal_id: str,
    signed_ns: int,
    valid_s: int = VALID_S,
    request_id: str | None = None,
) -> bytes:
    """Return the row that carries ``request``, signed by ``key`` as ``signer`` at ``signed_ns``.

    ``signed_ns`` is the signer's time (unix nanoseconds); the kernel takes the row only
    within ``valid_s`` seconds of it (fewer if its keyring's policy says so).

    The request is first normalized (kernel.inbox.requests.normalized), and the row is
    decoded back as the kernel will decode it, so whatever the kernel would refuse at
    its wall is refused here.

    Raises:
        InputInvalid: the request, the signer's name or the journal id would be refused.
    """
    envelope = Signed(
        request=normalized(request),
        journal_id=journal_id,
        request_id=request_id or new_request_id(),
        signer=signer,
        signed_ns=signed_ns,
        valid_s=valid_s,
    )
    body = signed_bytes(envelope)
    decode_row(body)  # the envelope's own fields, checked as the kernel checks them
    signed = msgspec.structs.replace(envelope, signature=keys.sign(key, CONTEXT, body))
    return encode(signed)


def check(
    envelope: Signed, keyring: Keyring, journal_id: str, revoked: frozenset[str] | set[str]
) -> Principal:
    """Return the principal whose key signed ``envelope``, if it may ask what it asks.

    Raises:
        ProofRefused: SIGNATURE_INVALID (no such key in the keyring, a revoked one, a
            signature that does not verify, another journal) or UNAUTHORIZED (the
            signer's role may not make this request, or not for this principal).
    """
    signer = keyring.get(envelope.signer)
    if signer is None:
        raise ProofRefused(
            ReasonCode.SIGNATURE_INVALID,
            "signer",
            f"no key named {envelope.signer[:64]!r} in this kernel's keyring",
        )
    if signer.fingerprint in revoked:
        raise ProofRefused(
            ReasonCode.SIGNATURE_INVALID, "signer", f"the key of {signer.name!r} was revoked"
        )
    if not keys.verify(signer.key, CONTEXT, signed_bytes(envelope), envelope.signature):
        raise ProofRefused(
            ReasonCode.SIGNATURE_INVALID,
            "signature",
            f"not a signature of this request by {signer.name!r}'s key",
        )
    if envelope.journal_id != journal_id:
        raise ProofRefused(
            ReasonCode.SIGNATURE_INVALID,
            "journal_id",
            f"signed for journal {envelope.journal_id[:64]!r}, not this one",
        )
    problem = _unauthorized(signer, envelope.request)
    if problem is not None:
        raise ProofRefused(ReasonCode.UNAUTHORIZED, *problem)
    return signer


def check_time(envelope: Signed, policy: Policy, now_ns: int) -> None:
    """Refuse ``envelope`` unless ``now_ns`` (the kernel's clock) lies in its validity window.

    The window opens ``policy.skew_s`` before the signing time (clocks differ) and closes
    ``valid_s`` after it, never later than ``policy.max_valid_s``.

    Raises:
        ProofRefused: REQUEST_EXPIRED (taken too late, or no signing time at all) or
            REQUEST_NOT_YET_VALID (signed later than now, beyond the skew).
    """
    if envelope.signed_ns is None or envelope.valid_s is None:
        raise ProofRefused(
            ReasonCode.REQUEST_EXPIRED,
            "signed_ns",
            "signed with no time: sign it again (a request is taken only soon after it is signed)",
        )
    valid_s = min(envelope.valid_s, policy.max_valid_s)
    if now_ns < envelope.signed_ns - policy.skew_s * 1_000_000_000:
        ahead = (envelope.signed_ns - now_ns) // 1_000_000_000
        raise ProofRefused(
            ReasonCode.REQUEST_NOT_YET_VALID,
            "signed_ns",
            f"signed {ahead} s later than the kernel's clock (the keyring tolerates"
            f" {policy.skew_s} s)",
        )
    if now_ns > envelope.signed_ns + valid_s * 1_000_000_000:
        age = (now_ns - envelope.signed_ns) // 1_000_000_000
        raise ProofRefused(
            ReasonCode.REQUEST_EXPIRED,
            "signed_ns",
            f"signed {age} s ago, valid for {valid_s} s: sign it again",
        )


def _unauthorized(signer: Principal, request: InboxRequest) -> tuple[str, str] | None:
    """Why ``signer`` may not make ``request`` (field, detail), or None."""
    principal = principal_of(request)
    proposes = isinstance(request, ProposeRequest)
    if signer.role == "agent":
        if not proposes:
            return "type", f"{signer.name!r} is an agent's key: it only proposes"
        if principal != signer.name:
            return "agent_id", f"{signer.name!r}'s key proposes only as {signer.name!r}"
        return None
    if proposes:
        return "type", f"a proposal is signed by the agent's own key, not {signer.name!r}'s"
    if signer.role == "operator" and principal != signer.name:
        return "operator", f"{signer.name!r}'s key acts only as {signer.name!r}"
    return None  # a door acts for the operators it signed in
