"""Signed user tokens (JWT) verified at a door, into the :class:`Principal` they name.

A door that takes user tokens (MCP, the gateway, an embedding host that is handed one)
verifies each against its identity provider's public keys (kernel.identity._keys),
its issuer and its audience, and only then believes its claims: ``sub`` is the user,
the tenant claim (``tenant`` unless configured) the tenant, ``email``, ``roles`` and
``scope`` (space-separated, as OAuth writes it; a list is taken too) what the door
vouches for. Anything else is a :class:`PrincipalInvalid` with one line that says why:
never a traceback, never the token itself.

Only asymmetric signatures are taken (Ed25519, RS256, ES256 by default): ``none`` and
the HMAC algorithms are never allowed, so a token signed with a public key as an HMAC
secret, or not signed at all, is refused whatever its header claims.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec
from joserfc import jwt
from joserfc.errors import (
    BadSignatureError,
    ExpiredTokenError,
    InvalidClaimError,
    InvalidKeyIdError,
    JoseError,
    MissingClaimError,
)
from joserfc.jwk import KeySet
from joserfc.jws import extract_compact

from kernel.core.events import Principal
from kernel.core.reasons import ReasonCode
from kernel.core.text import free_text_problem, id_problem
from kernel.identity._keys import read_keys

MAX_TOKEN = 16 * 1024
"""The longest token read: past it, refused before any decoding."""

ALGORITHMS = ("Ed25519", "RS256", "ES256")
"""The signature algorithms taken by default: asymmetric only. ``EdDSA`` (the older name
of Ed25519 signatures, deprecated by RFC 9864) may be added to ``UserTokens.algorithms``
for a provider that still writes it; joserfc warns when it is used."""

_FORBIDDEN = frozenset({"none", "HS256", "HS384", "HS512"})


class UserTokens(msgspec.Struct, frozen=True, kw_only=True):
    """How a door verifies user tokens: whose they are, for whom, with which keys.

    Attributes:
        issuer: the ``iss`` every token must carry (the identity provider's URL).
        audience: the ``aud`` a token must name (this kernel's, e.g. ``dirk``).
        keys: the files of the provider's public keys: JWKS, JWK or PEM (Ed25519, RSA).
        tenant_claim: the claim that names the user's tenant.
        leeway_s: how far ``exp`` and ``nbf`` may be off the door's clock, in seconds.
        algorithms: the signature algorithms taken (never ``none`` nor HMAC).
    """

    issuer: str
    audience: str
    keys: list[str]
    tenant_claim: str = "tenant"
    leeway_s: int = 30
    algorithms: list[str] = msgspec.field(default_factory=lambda: list(ALGORITHMS))


class PrincipalInvalid(Exception):
    """A user token (or a signed assertion) that does not verify, and why, in one line."""

    reason_code = ReasonCode.PRINCIPAL_INVALID

    def __init__(self, detail: str, field: str = "token") -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field


class TokenVerifier:
    """Verify user tokens against :class:`UserTokens` and answer their principals.

    Args:
        config: the issuer, audience and keys.
        keys: the keys already read (default: read from ``config.keys``).
        now: the door's clock in whole seconds (a door is an edge, not replayed code).

    Raises:
        kernel.identity.KeyFileError: a key file that cannot be used.
        ValueError: an algorithm that is not allowed.
    """

    def __init__(
        self,
        config: UserTokens,
        *,
        keys: KeySet | None = None,
        now: Callable[[], int] | None = None,
    ) -> None:
        unsafe = _FORBIDDEN.intersection(config.algorithms)
        if unsafe or not config.algorithms:
            raise ValueError(f"user tokens take asymmetric signatures only, not {sorted(unsafe)}")
        self.config = config
        self._keys = keys if keys is not None else read_keys(config.keys)
        self._now = now or (lambda: int(time.time()))

    def verify(self, token: str, *, vouched: str = "token") -> Principal:
        """Return the principal ``token`` names, once its signature and claims verify.

        ``vouched`` is the door's word for what vouched for it: the principal's
        ``vouched_by`` is ``<vouched>:<kid>``.

        Raises:
            PrincipalInvalid: why the token was not believed.
        """
        claims, kid = self.claims(token)
        return principal_of(claims, self.config.tenant_claim, f"{vouched}:{kid}")

    def claims(self, token: str) -> tuple[dict[str, Any], str]:
        """Return a verified token's claims and the ``kid`` of the key that signed it.

        Raises:
            PrincipalInvalid: why the token was not believed.
        """
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN:
            raise PrincipalInvalid(f"a token is a JWT of at most {MAX_TOKEN} characters")
        kid = _kid_of(token)
        try:
            key = self._keys.get_by_kid(kid)
        except InvalidKeyIdError:
            raise PrincipalInvalid(f"signed by a key this door does not trust ({kid!r})") from None
        try:
            decoded = jwt.decode(token, key, algorithms=list(self.config.algorithms))
        except BadSignatureError:
            raise PrincipalInvalid("the signature does not verify") from None
        except (JoseError, ValueError, TypeError, KeyError, UnicodeError):
            raise PrincipalInvalid("not a signed JWT this door takes") from None
        claims = decoded.claims
        if not isinstance(claims, dict):
            raise PrincipalInvalid("the token's claims are not an object")
        self._validate(claims)
        return claims, kid

    def _validate(self, claims: dict[str, Any]) -> None:
        registry = jwt.JWTClaimsRegistry(
            now=self._now,
            leeway=max(0, self.config.leeway_s),
            iss={"essential": True, "value": self.config.issuer},
            aud={"essential": True, "value": self.config.audience},
            sub={"essential": True},
            exp={"essential": True},
        )
        try:
            registry.validate(claims)
        except ExpiredTokenError:
            raise PrincipalInvalid("the token expired") from None
        except MissingClaimError as exc:
            raise PrincipalInvalid(f"the token has no {_claim_of(exc)} claim") from None
        except InvalidClaimError as exc:
            name = _claim_of(exc)
            what = {"aud": "for another audience", "iss": "from another issuer"}.get(name)
            raise PrincipalInvalid(
                f"the token is {what}" if what else f"the token's {name} claim is not valid"
            ) from None
        except (JoseError, ValueError, TypeError, OverflowError):
            # The claims registry's own refusals (a token not yet valid, a bad number).
            raise PrincipalInvalid("the token's time claims are not valid") from None


def _kid_of(token: str) -> str:
    try:
        header = extract_compact(token.encode("ascii")).protected
    except (JoseError, ValueError, TypeError, KeyError, UnicodeError):
        raise PrincipalInvalid("not a JWT (three base64url parts)") from None
    if not isinstance(header, dict):
        raise PrincipalInvalid("the token's header is not an object")
    alg, kid = header.get("alg"), header.get("kid")
    if alg in _FORBIDDEN or not isinstance(alg, str):
        raise PrincipalInvalid(f"the token is not signed with a key ({str(alg)[:16]!r})")
    if not isinstance(kid, str) or not kid or id_problem(kid) is not None or len(kid) > 128:
        raise PrincipalInvalid("the token's header names no key (kid)")
    return kid


def _claim_of(exc: Exception) -> str:
    claim = getattr(exc, "claim", "")
    return claim if isinstance(claim, str) and claim.isidentifier() else "a"


def principal_of(claims: dict[str, Any], tenant_claim: str, vouched_by: str) -> Principal:
    """Return the principal verified ``claims`` name.

    Raises:
        PrincipalInvalid: a claim of the principal missing or of the wrong shape.
    """
    user = _name(claims.get("sub"), "sub")
    tenant = _name(claims.get(tenant_claim), tenant_claim)
    email = claims.get("email", "")
    if not isinstance(email, str) or free_text_problem(email) is not None or len(email) > 320:
        raise PrincipalInvalid("the token's email claim is not an address", "email")
    roles = _names(claims.get("roles", []), "roles")
    scope = claims.get("scope")
    scopes = None
    if scope is not None:
        scopes = _names(scope.split() if isinstance(scope, str) else scope, "scope")
    return Principal(
        tenant=tenant,
        user=user,
        email=email,
        roles=roles,
        scopes=scopes,
        vouched_by=vouched_by,
    )


def _name(value: Any, claim: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 256 or id_problem(value):
        raise PrincipalInvalid(f"the token's {claim} claim is not a name", claim)
    return value


def _names(value: Any, claim: str) -> list[str]:
    if not isinstance(value, list) or len(value) > 256:
        raise PrincipalInvalid(f"the token's {claim} claim is not a list of names", claim)
    return [_name(v, claim) for v in value]
