"""An identity provider for tests: Ed25519 and RSA keys, their public files, signed tokens."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from joserfc import jwt
from joserfc.jwk import Key, OKPKey, RSAKey

from kernel.identity import TokenVerifier, UserTokens

ISSUER = "https://id.example"
AUDIENCE = "dirk"


class Provider:
    """An identity provider with one Ed25519 key (``ed``) and one RSA key (``rsa``)."""

    def __init__(self, folder: Path) -> None:
        self.ed = OKPKey.import_key(Ed25519PrivateKey.generate(), parameters={"kid": "ed"})
        self.rsa = RSAKey.generate_key(2048, parameters={"kid": "rsa"})
        self.jwks = folder / "jwks.json"
        public = {"keys": [self.ed.as_dict(private=False), self.rsa.as_dict(private=False)]}
        self.jwks.write_text(json.dumps(public))

    def config(self, **changes: Any) -> UserTokens:
        """The doors' configuration trusting this provider's keys."""
        fields: dict[str, Any] = {"issuer": ISSUER, "audience": AUDIENCE, "keys": [str(self.jwks)]}
        return UserTokens(**{**fields, **changes})

    def verifier(self, **changes: Any) -> TokenVerifier:
        return TokenVerifier(self.config(**changes))

    def token(
        self,
        user: str = "alice",
        tenant: str | None = "acme",
        *,
        key: Key | None = None,
        alg: str = "Ed25519",
        header: dict[str, Any] | None = None,
        **claims: Any,
    ) -> str:
        """A token for ``user`` of ``tenant`` valid for an hour; ``claims`` add or replace."""
        signer = key if key is not None else self.ed
        now = int(time.time())
        body: dict[str, Any] = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": user,
            "tenant": tenant,
            "email": f"{user}@{tenant}.example",
            "roles": ["staff"],
            "scope": "rules:read memory:write",
            "iat": now,
            "exp": now + 3600,
        }
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        head = {"alg": alg, "kid": signer.kid, **(header or {})}
        return jwt.encode(head, body, signer, algorithms=[alg])
