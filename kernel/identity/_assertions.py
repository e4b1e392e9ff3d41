"""A principal a host vouches for, signed: what crosses the mesh beside a proposal.

A mesh host authenticates itself with its credential (its agent key signs each
proposal). The principal it acts for travels as a compact JWS (Ed25519) signed by the
same host key: the principal's claims, the host (``iss``), the kernel's journal
(``aud``), and the proposal it is for (``bind``: the hex SHA-256 of the message id
and body), so an assertion lifted off one proposal verifies on no other. A kernel
believes it only with the host's public key; anything else is
:class:`PrincipalInvalid`.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet, OKPKey

from kernel.core.events import Principal
from kernel.identity._tokens import PrincipalInvalid, TokenVerifier, UserTokens, principal_of

ASSERTION_TTL_S = 300
"""How long a signed assertion is taken after it was signed."""


def binding(msg_id: str, body: bytes) -> str:
    """The hex SHA-256 that ties an assertion to one message (its id and body)."""
    return hashlib.sha256(msg_id.encode() + b"\n" + body).hexdigest()


class AssertionSigner:
    """Sign the principal a host acts for, one proposal at a time.

    Args:
        host: the host's name (its agent id on the mesh), the assertion's issuer.
        key: the host's Ed25519 private key.
        audience: the kernel's journal id the proposal goes to.
        now: the host's clock in whole seconds.
    """

    def __init__(
        self,
        host: str,
        key: Ed25519PrivateKey,
        audience: str,
        *,
        now: Callable[[], int] | None = None,
    ) -> None:
        self.host = host
        self._key = OKPKey.import_key(key, parameters={"kid": host})
        self.audience = audience
        self._now = now or (lambda: int(time.time()))

    def sign(self, principal: Principal, msg_id: str, body: bytes) -> str:
        """Return the compact JWS asserting ``principal`` for the message ``msg_id``/``body``."""
        issued = self._now()
        claims: dict[str, Any] = {
            "iss": self.host,
            "aud": self.audience,
            "sub": principal.user,
            "tenant": principal.tenant,
            "email": principal.email,
            "roles": list(principal.roles),
            "iat": issued,
            "exp": issued + ASSERTION_TTL_S,
            "bind": binding(msg_id, body),
        }
        if principal.scopes is not None:
            claims["scope"] = " ".join(principal.scopes)
        return jwt.encode(
            {"alg": "Ed25519", "kid": self.host}, claims, self._key, algorithms=["Ed25519"]
        )


class AssertionVerifier:
    """Verify a host's signed assertion against the host's public key.

    Args:
        audience: this kernel's journal id.
        now: the kernel's door clock in whole seconds.
    """

    def __init__(self, audience: str, *, now: Callable[[], int] | None = None) -> None:
        self.audience = audience
        self._now = now

    def verify(
        self, assertion: object, host: str, public: Ed25519PublicKey, msg_id: str, body: bytes
    ) -> Principal:
        """Return the principal ``host`` asserts for this message (``vouched_by`` bus:<host>).

        Raises:
            PrincipalInvalid: not signed by the host's key, for another kernel or message,
                expired, or malformed.
        """
        if not isinstance(assertion, str):
            raise PrincipalInvalid("no signed principal assertion", "assertion")
        try:
            raw = public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
            key = OKPKey.import_key(raw, parameters={"kid": host})
        except (JoseError, ValueError, TypeError):
            raise PrincipalInvalid("the host's key is not an Ed25519 key", "assertion") from None
        config = UserTokens(issuer=host, audience=self.audience, keys=[], algorithms=["Ed25519"])

        verifier = TokenVerifier(config, keys=KeySet([key]), now=self._now)
        try:
            claims, _ = verifier.claims(assertion)
        except PrincipalInvalid as exc:
            raise PrincipalInvalid(f"the principal assertion: {exc.detail}", "assertion") from None
        if claims.get("bind") != binding(msg_id, body):
            raise PrincipalInvalid("the principal assertion is for another message", "assertion")

        return principal_of(claims, "tenant", f"bus:{host}")
