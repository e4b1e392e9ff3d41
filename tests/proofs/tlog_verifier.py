"""A c2sp.org/tlog-proof@v1 verifier written from the C2SP texts, with hashlib and cryptography.

It imports nothing of dirk: what it accepts, any reader of the C2SP formats would. The
texts it follows: tlog-proof (the lines: the header, an optional ``extra``, ``index``, the
inclusion proof from the leaf's sibling up, an empty line, the checkpoint verbatim),
signed-note (a text, an empty line, ``U+2014 name base64(key ID || signature)`` lines;
the key ID is ``SHA-256(name || 0x0A || type || public key)[:4]``), tlog-checkpoint
(origin, decimal size, base64 root), tlog-cosignature/v1 (type 0x04: ``key ID ||
uint64 big-endian time || Ed25519("cosignature/v1\\ntime <t>\\n" || checkpoint)``) and
RFC 6962 section 2.1 (leaf ``SHA-256(0x00 || entry)``, node ``SHA-256(0x01 || l || r)``,
the inclusion check of RFC 9162 section 2.1.3.2).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

HEADER = "c2sp.org/tlog-proof@v1"
ED25519 = 0x01
COSIGNATURE = 0x04
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
_SIGNATURE = re.compile("\u2014 ([^ +\n]+) ([A-Za-z0-9+/=]+)")


class Refused(ValueError):
    """The proof does not hold, with why."""


@dataclass(frozen=True)
class Proven:
    """What a proof that holds says."""

    origin: str
    size: int
    index: int
    extra: bytes
    witnesses: list[str]


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise Refused(f"not base64: {text[:40]!r}") from None


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def key_id(name: str, sig_type: int, public: bytes) -> bytes:
    return _sha256(name.encode() + b"\n" + bytes([sig_type]) + public)[:4]


def included(index: int, size: int, leaf: bytes, proof: list[bytes], root: bytes) -> bool:
    """RFC 9162 section 2.1.3.2, step by step."""
    if index >= size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = _sha256(b"\x01" + p + r)
            while fn and not fn & 1:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = _sha256(b"\x01" + r + p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


def _signatures(note: str, text: str) -> list[tuple[str, bytes]]:
    block = note[len(text) + 1 :]
    lines = block.split("\n")
    if lines[-1] != "" or len(lines) < 2:
        raise Refused("a signed note ends with its signature lines")
    found = []
    for line in lines[:-1]:
        match = _SIGNATURE.fullmatch(line)
        if match is None:
            raise Refused(f"not a signature line: {line[:60]!r}")
        found.append((match.group(1), _b64(match.group(2))))
    return found


def verify(
    text: str,
    entry: bytes | None,
    origin: str,
    log_key: bytes,
    witnesses: Mapping[str, bytes] | None = None,
    quorum: int = 0,
) -> Proven:
    """Check a tlog-proof for ``entry`` (None: its ``extra`` bytes are the entry).

    ``log_key`` and the ``witnesses`` (by name) are raw 32-byte Ed25519 public keys.
    """
    head, sep, note = text.partition("\n\n")
    if not sep:
        raise Refused("no empty line before the checkpoint")
    lines = head.split("\n")
    if lines[0] != HEADER:
        raise Refused(f"the first line is not {HEADER}")
    rest = lines[1:]
    extra = _b64(rest.pop(0)[len("extra ") :]) if rest and rest[0].startswith("extra ") else b""
    if not rest or not rest[0].startswith("index "):
        raise Refused("no index line")
    number = rest.pop(0)[len("index ") :]
    if not _DECIMAL.fullmatch(number):
        raise Refused(f"the index is not a decimal: {number!r}")
    proof = [_b64(line) for line in rest]
    if any(len(h) != 32 for h in proof):
        raise Refused("a proof line is not one SHA-256 hash")
    # The checkpoint: its text ends at the last empty line (signed-note).
    cut = note.rfind("\n\n")
    if cut < 0:
        raise Refused("the checkpoint is not a signed note")
    body = note[: cut + 1]
    fields = body.split("\n")
    if len(fields) < 4 or fields[0] != origin or not _DECIMAL.fullmatch(fields[1]):
        raise Refused(f"not a checkpoint of {origin}")
    size, root = int(fields[1]), _b64(fields[2])
    signed_by_log = False
    cosigned: list[str] = []
    known = dict(witnesses or {})
    for name, raw in _signatures(note, body):
        try:
            if name == origin and raw[:4] == key_id(name, ED25519, log_key):
                Ed25519PublicKey.from_public_bytes(log_key).verify(raw[4:], body.encode())
                signed_by_log = True
            elif name in known and raw[:4] == key_id(name, COSIGNATURE, known[name]):
                if len(raw) != 4 + 8 + 64:
                    raise Refused(f"{name}'s cosignature is not 76 bytes")
                when = int.from_bytes(raw[4:12], "big")
                message = f"cosignature/v1\ntime {when}\n".encode() + body.encode()
                Ed25519PublicKey.from_public_bytes(known[name]).verify(raw[12:], message)
                cosigned.append(name)
        except InvalidSignature:
            raise Refused(f"{name}'s signature does not verify") from None
    if not signed_by_log:
        raise Refused(f"the log's key did not sign the checkpoint of {origin}")
    if len(cosigned) < quorum:
        raise Refused(f"{len(cosigned)} witnesses cosigned; {quorum} needed")
    leaf = _sha256(b"\x00" + (extra if entry is None else entry))
    if not included(int(number), size, leaf, proof, root):
        raise Refused(f"entry {number} is not in the tree of {size}")
    return Proven(origin=origin, size=size, index=int(number), extra=extra, witnesses=cosigned)
