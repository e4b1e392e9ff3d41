"""Ed25519 keys: how a principal proves who it is without the kernel holding its secret.

Operators signing inbox requests, executors signing results and the kernel signing
checkpoints all use the same few functions. The kernel and its journal keep only
public keys (``ed25519:<base64url>``), so whoever can read or write the database or
the bus can check a signature and cannot make one.

Every signature covers a *context* label and the bytes, ``context || 0x00 || data``,
so a signature made for one purpose (an inbox request) can never be replayed as
another (an executor result). Verifying never raises on malformed input: a key or a
signature that does not parse simply does not verify.

Private keys live in files (PEM, PKCS#8, unencrypted) that only their owner may read:
:func:`write_private_key` creates them with mode 0600 and :func:`load_private_key`
refuses a file that others can read, as ssh does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

PREFIX = "ed25519:"
"""How a public key is written: ``ed25519:`` and its 32 bytes in unpadded base64url."""
SIGNATURE_CHARS = 86
"""An Ed25519 signature (64 bytes) in unpadded base64url."""


class KeyUnusable(ValueError):
    """A key file or key text that cannot be used, with the reason in words."""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text.isascii():
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def generate() -> Ed25519PrivateKey:
    """Return a new private key from the operating system's randomness."""
    return Ed25519PrivateKey.generate()


def public_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """Return the text form (``ed25519:...``) of a key's public half."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return PREFIX + _b64(raw)


def parse_public(text: str) -> Ed25519PublicKey:
    """Return the public key written as ``text``.

    Raises:
        KeyUnusable: ``text`` is not ``ed25519:`` followed by 32 bytes in base64url.
    """
    if not isinstance(text, str) or not text.startswith(PREFIX):
        raise KeyUnusable(f"a public key is written {PREFIX}<base64url>")
    try:
        raw = _unb64(text[len(PREFIX) :])
    except (ValueError, binascii.Error):
        raise KeyUnusable("the public key is not base64url") from None
    if len(raw) != 32:
        raise KeyUnusable(f"an Ed25519 public key has 32 bytes, not {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def is_public_key(text: object) -> bool:
    """Tell whether ``text`` is a well-formed public key."""
    try:
        parse_public(text)  # type: ignore[arg-type]
    except KeyUnusable:
        return False
    return True


def fingerprint(public: str) -> str:
    """Return a short, stable name for a public key: 16 hex digits of its SHA-256."""
    return hashlib.sha256(public.encode("utf-8")).hexdigest()[:16]


def _message(context: str, data: bytes) -> bytes:
    return context.encode("utf-8") + b"\x00" + data


def sign(key: Ed25519PrivateKey, context: str, data: bytes) -> str:
    """Return the signature of ``data`` for ``context`` in unpadded base64url."""
    return _b64(key.sign(_message(context, data)))


def verify(public: str, context: str, data: bytes, signature: str) -> bool:
    """Tell whether ``signature`` is ``public``'s signature of ``data`` for ``context``.

    Never raises: a malformed key or signature is a signature that does not verify.
    """
    if not isinstance(signature, str) or len(signature) != SIGNATURE_CHARS:
        return False
    try:
        key = parse_public(public)
        raw = _unb64(signature)
        key.verify(raw, _message(context, data))
    except (KeyUnusable, ValueError, binascii.Error, InvalidSignature):
        return False
    return True


def write_private_key(path: Path, key: Ed25519PrivateKey | None = None) -> Ed25519PrivateKey:
    """Write a private key (a new one unless given) to ``path``, readable by its owner only.

    Raises:
        KeyUnusable: ``path`` exists already (a key is never overwritten).
    """
    key = key or generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KeyUnusable(f"{path} exists: a key file is never overwritten") from None
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    return key


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """Read the private key in ``path``.

    Raises:
        KeyUnusable: the file is missing, readable by others than its owner, or not an
            Ed25519 private key in PEM.
    """
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KeyUnusable(
                f"{path} is readable by others (mode {stat.S_IMODE(mode):o}): chmod 600 it"
            )
        pem = path.read_bytes()
    except OSError as exc:
        raise KeyUnusable(f"{path}: {exc.strerror or exc}") from None
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        raise KeyUnusable(f"{path} is not a private key in PEM (PKCS#8, unencrypted)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyUnusable(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    return key
