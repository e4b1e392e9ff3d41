"""The public keys a door verifies user tokens with: a JWKS file or PEM public keys.

A door holds only the public halves of its identity provider's keys: a key file that
holds a private key is refused (whoever can read the door's configuration could then
mint tokens), as is a symmetric key (``oct``: the secret would verify and sign alike).
Each key is known by its ``kid``: a JWKS's own, or for a PEM file its file name's stem,
so a token's ``kid`` header names exactly one key and ``vouched_by`` says which.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from joserfc.errors import JoseError
from joserfc.jwk import Key, KeySet, OKPKey, RSAKey, import_key

from kernel.core.text import id_problem

MAX_KEY_FILE = 1 << 20
"""The largest key file read (a JWKS of a few keys is a few KiB)."""


class KeyFileError(ValueError):
    """A key file cannot be read, or holds no usable public key (one line, no key material)."""


def read_keys(paths: Iterable[str | Path]) -> KeySet:
    """Return the public keys of ``paths``: JWKS files (``{"keys": [...]}``), JWK or PEM files.

    Raises:
        KeyFileError: unreadable, not a key, a private or symmetric key, a key without a
            usable ``kid``, or the same ``kid`` twice.
    """
    keys: list[Key] = []
    for path in paths:
        keys.extend(_keys_of(Path(path)))
    if not keys:
        raise KeyFileError("no token key configured")
    seen: set[str] = set()
    for key in keys:
        kid = key.kid or ""
        if kid in seen:
            raise KeyFileError(f"two keys named {kid!r}")
        seen.add(kid)
    return KeySet(keys)


def _keys_of(path: Path) -> list[Key]:
    try:
        if path.stat().st_size > MAX_KEY_FILE:
            raise KeyFileError(f"{path}: larger than a key file")
        data = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read the key file {path}: {type(exc).__name__}") from None
    if data.lstrip().startswith(b"{"):
        return _json_keys(path, data)
    return [_pem_key(path, data)]


def _json_keys(path: Path, data: bytes) -> list[Key]:
    try:
        value = json.loads(data)
    except ValueError:
        raise KeyFileError(f"{path}: not JSON") from None
    items = value.get("keys") if isinstance(value, dict) and "keys" in value else [value]
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise KeyFileError(f"{path}: want a JWK or a JWKS ({{'keys': [...]}})")
    return [_checked(path, _jwk(path, item)) for item in items]


def _jwk(path: Path, item: dict[str, Any]) -> Key:
    if item.get("kty") == "oct":
        raise KeyFileError(f"{path}: a symmetric key (oct) verifies and signs alike")
    if any(name in item for name in ("d", "p", "q", "dp", "dq", "qi")):
        raise KeyFileError(f"{path}: holds a private key; a door keeps public keys only")
    try:
        return import_key(item)
    except (JoseError, ValueError, TypeError, KeyError):
        raise KeyFileError(f"{path}: not a usable JWK") from None


def _pem_key(path: Path, data: bytes) -> Key:
    if b"PRIVATE KEY" in data:
        raise KeyFileError(f"{path}: holds a private key; a door keeps public keys only")
    for kind in (OKPKey, RSAKey):
        try:
            key: Key = kind.import_key(data, parameters={"kid": path.stem})
        except (JoseError, ValueError, TypeError):
            continue
        return _checked(path, key)
    raise KeyFileError(f"{path}: not an Ed25519 or RSA public key (PEM)")


def _checked(path: Path, key: Key) -> Key:
    if key.is_private:
        raise KeyFileError(f"{path}: holds a private key; a door keeps public keys only")
    kid = key.kid
    if not kid or id_problem(kid) is not None or len(kid) > 128:
        raise KeyFileError(f"{path}: every key needs a kid (printable, at most 128 characters)")
    return key
