"""Signed checkpoints in the C2SP text formats, Ed25519 only.

Pinned versions (C2SP main has moved past them: it now recommends ML-DSA-44):

- ``c2sp.org/signed-note@v1.0.0``: a text ending in a newline, a blank line, then one
  line per signature, ``— <key name> <base64(key ID || signature)>``; the key ID is
  ``SHA-256(name || 0x0A || type || public key)[:4]``, type 0x01 for Ed25519;
- ``c2sp.org/tlog-checkpoint@v1.0.0``: the text is ``<origin>``, the tree size and the
  base64 root, one a line; the log's key name is its origin;
- ``c2sp.org/tlog-cosignature@v1.0.1``: a witness's line is ``base64(key ID (type 0x04) ||
  uint64 time || Ed25519 signature)`` over ``cosignature/v1\\ntime <t>\\n`` and the text;
- ``c2sp.org/tlog-proof@v1`` (untagged): an inclusion proof and the checkpoint it is
  against, one text (:func:`tlog_proof`).

A verifier (:func:`open_note`) ignores signature lines whose (name, key ID) it does not
know, refuses the note if a known key's signature fails, and if none verifies. Checked
against Go's sumdb note code and production checkpoints (../shared/notes/transparency-log.md).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterable, Sequence

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SIGNED_NOTE = "c2sp.org/signed-note@v1.0.0"
CHECKPOINT = "c2sp.org/tlog-checkpoint@v1.0.0"
COSIGNATURE = "c2sp.org/tlog-cosignature@v1.0.1"
TLOG_PROOF = "c2sp.org/tlog-proof@v1"
ED25519 = 0x01
COSIGNATURE_V1 = 0x04
DASH = "\u2014"
_LINE = re.compile("\u2014 ([^\\s+]+) ([A-Za-z0-9+/=]+)")
_MAX_SIGNATURES = 64


class NoteError(ValueError):
    """A note, checkpoint, key or proof that does not parse or does not verify, with why."""


class Verifier(msgspec.Struct, frozen=True):
    """A public key that may sign notes: its name, signature type and 32 raw bytes."""

    name: str
    type: int
    key: bytes

    @property
    def key_id(self) -> bytes:
        """The 4-byte key ID its signature lines carry."""
        return key_id(self.name, self.type, self.key)

    def vkey(self) -> str:
        """Return the verifier key text, ``<name>+<hex key ID>+<base64(type || key)>``."""
        return vkey(self.name, self.type, self.key)


class Checkpoint(msgspec.Struct, frozen=True):
    """What a checkpoint's text says: the log's origin, its tree size and root."""

    origin: str
    size: int
    root: bytes

    def text(self) -> str:
        """Return the checkpoint's note text (what is signed)."""
        return checkpoint_text(self.origin, self.size, self.root)


class Signature(msgspec.Struct, frozen=True):
    """A signature line that verified: by whom, of which type, and a cosigner's time."""

    name: str
    type: int
    timestamp: int | None = None


def key_id(name: str, sig_type: int, public: bytes) -> bytes:
    """Return ``SHA-256(name || 0x0A || type || public key)[:4]``."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([sig_type]) + public).digest()[:4]


def raw_public(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    """Return the 32 raw bytes of a key's public half."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes_raw()


def vkey(name: str, sig_type: int, public: bytes) -> str:
    """Return the C2SP verifier key text of ``public`` under ``name``."""
    check_name(name)
    b64 = base64.b64encode(bytes([sig_type]) + public).decode()
    return f"{name}+{key_id(name, sig_type, public).hex()}+{b64}"


def parse_vkey(text: str) -> Verifier:
    """Return the verifier a vkey text names; its key ID must match its key.

    Raises:
        NoteError: not ``name+hex+base64`` of an Ed25519 (0x01) or cosignature (0x04) key.
    """
    name, _, rest = text.strip().partition("+")
    hex_id, _, b64 = rest.partition("+")
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise NoteError("a verifier key's key is not base64") from None
    if len(raw) != 33 or raw[0] not in (ED25519, COSIGNATURE_V1):
        raise NoteError("a verifier key must be an Ed25519 key (type 0x01 or 0x04)")
    check_name(name)
    if key_id(name, raw[0], raw[1:]).hex() != hex_id:
        raise NoteError(f"the verifier key of {name} carries a key ID that is not its key's")
    return Verifier(name, raw[0], raw[1:])


def check_name(name: str) -> None:
    """Refuse a key name C2SP does not allow: empty, or with a space or a ``+``."""
    if not name or "+" in name or any(c.isspace() for c in name) or not name.isprintable():
        raise NoteError(f"{name!r} is not a key name (non-empty, no spaces, no '+')")


def _check_text(text: str) -> None:
    if not text.endswith("\n") or any(c < " " and c != "\n" for c in text):
        raise NoteError("a note's text ends in a newline and holds no other control character")


def _line(name: str, raw: bytes) -> str:
    check_name(name)
    return f"{DASH} {name} {base64.b64encode(raw).decode()}\n"


def checkpoint_text(origin: str, size: int, root: bytes) -> str:
    """Return the checkpoint text of a tree: origin, size and base64 root, one a line."""
    check_name(origin)
    if size < 0 or len(root) != 32:
        raise NoteError("a checkpoint has a size >= 0 and a 32-byte root")
    return f"{origin}\n{size}\n{base64.b64encode(root).decode()}\n"


def sign(text: str, name: str, key: Ed25519PrivateKey) -> str:
    """Return ``text`` as a signed note with one Ed25519 signature by ``key`` under ``name``."""
    _check_text(text)
    signature = key.sign(text.encode())
    return f"{text}\n{_line(name, key_id(name, ED25519, raw_public(key)) + signature)}"


def cosignature_message(text: str, timestamp: int) -> bytes:
    """Return what a tlog-cosignature/v1 signs: its label, the time, then the checkpoint."""
    return f"cosignature/v1\ntime {timestamp}\n{text}".encode()


def cosign(text: str, name: str, key: Ed25519PrivateKey, timestamp: int) -> str:
    """Return one cosignature line by ``key`` under ``name`` at ``timestamp`` (seconds)."""
    _check_text(text)
    if not 0 <= timestamp < 2**63:
        raise NoteError("a cosignature's time is in [0, 2**63)")
    kid = key_id(name, COSIGNATURE_V1, raw_public(key))
    signature = key.sign(cosignature_message(text, timestamp))
    return _line(name, kid + timestamp.to_bytes(8, "big") + signature)


def split_note(note: str) -> tuple[str, list[str]]:
    """Return a note's text and its signature lines (each without its newline).

    Raises:
        NoteError: no blank line before the signatures, or a malformed signature line.
    """
    if any(c < " " and c != "\n" for c in note) or not note.endswith("\n"):
        raise NoteError("a note ends in a newline and holds no other control character")
    cut = note.rfind("\n\n")
    if cut < 0:
        raise NoteError("a note has a blank line before its signatures")
    text, lines = note[: cut + 1], note[cut + 2 :].splitlines()
    if not lines or len(lines) > _MAX_SIGNATURES or not all(_LINE.fullmatch(x) for x in lines):
        raise NoteError("a note's signature lines are '— <name> <base64>'")
    return text, lines


def open_note(note: str, known: Iterable[Verifier]) -> tuple[str, list[Signature]]:
    """Verify ``note`` against the ``known`` keys; return its text and the signatures that held.

    A line whose (name, key ID) is unknown is ignored; a known key whose signature does
    not verify refuses the whole note, and so does a note no known key signed.

    Raises:
        NoteError: malformed, a known signature fails, or no known signature.
    """
    text, lines = split_note(note)
    keys = {(v.name, v.key_id): v for v in known}
    good: list[Signature] = []
    for line in lines:
        match = _LINE.fullmatch(line)
        assert match is not None
        name = match[1]
        try:
            raw = base64.b64decode(match[2], validate=True)
        except (binascii.Error, ValueError):
            raise NoteError(f"the signature line of {name} is not base64") from None
        verifier = keys.get((name, raw[:4]))
        if verifier is None:
            continue
        public = Ed25519PublicKey.from_public_bytes(verifier.key)
        try:
            if verifier.type == ED25519:
                public.verify(raw[4:], text.encode())
                good.append(Signature(name, ED25519))
            else:
                timestamp = int.from_bytes(raw[4:12], "big")
                if len(raw) != 76 or timestamp >= 2**63:
                    raise InvalidSignature
                public.verify(raw[12:], cosignature_message(text, timestamp))
                good.append(Signature(name, COSIGNATURE_V1, timestamp))
        except InvalidSignature:
            raise NoteError(f"the signature by {name} does not verify") from None
    if not good:
        raise NoteError("no known key signed it")
    return text, good


def parse_checkpoint(text: str) -> Checkpoint:
    """Return what a checkpoint's text says (extension lines are refused: none are written).

    Raises:
        NoteError: not three lines of origin, decimal size and base64 32-byte root.
    """
    lines = text.split("\n")
    if len(lines) != 4 or lines[-1] != "" or not all(lines[:3]):
        raise NoteError("a checkpoint is three lines: origin, size, root")
    origin, size, b64 = lines[:3]
    if not size.isascii() or not size.isdigit() or (size != "0" and size[0] == "0"):
        raise NoteError("a checkpoint's size is a decimal without leading zeros")
    try:
        root = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise NoteError("a checkpoint's root is not base64") from None
    if len(root) != 32 or len(size) > 19:
        raise NoteError("a checkpoint's root has 32 bytes and its size fits 63 bits")
    check_name(origin)
    return Checkpoint(origin, int(size), root)


def merge(note: str, other: str) -> str:
    """Return ``note`` with the signature lines of ``other`` (the same text) added once.

    Raises:
        NoteError: the two notes sign different texts.
    """
    text, lines = split_note(note)
    other_text, other_lines = split_note(other)
    if text != other_text:
        raise NoteError("the two notes sign different texts")
    merged = lines + [x for x in other_lines if x not in lines]
    return text + "\n" + "".join(f"{x}\n" for x in merged)


def log_verifiers(origin: str, publics: Sequence[Verifier | bytes]) -> list[Verifier]:
    """Return the verifiers of a log's keys: a raw key signs under the origin's name."""
    return [p if isinstance(p, Verifier) else Verifier(origin, ED25519, p) for p in publics]


def cosigner(verifier: Verifier) -> Verifier:
    """Return the cosignature (0x04) form of a witness key published with type 0x01."""
    return Verifier(verifier.name, COSIGNATURE_V1, verifier.key)


def tlog_proof(index: int, proof: Sequence[bytes], note: str, extra: bytes = b"") -> str:
    """Return a ``c2sp.org/tlog-proof@v1`` text: the entry's index, its proof, the checkpoint."""
    head = TLOG_PROOF + "\n"
    if extra:
        head += f"extra {base64.b64encode(extra).decode()}\n"
    lines = "".join(base64.b64encode(h).decode() + "\n" for h in proof)
    return f"{head}index {index}\n{lines}\n{note}"


def parse_tlog_proof(text: str) -> tuple[int, list[bytes], str, bytes]:
    """Return a tlog-proof's (index, proof, checkpoint note, extra).

    Raises:
        NoteError: not a ``c2sp.org/tlog-proof@v1`` text.
    """
    head, _, note = text.partition("\n\n")
    lines = head.split("\n")
    if lines[0] != TLOG_PROOF:
        raise NoteError(f"not a {TLOG_PROOF} text")
    rest = lines[1:]
    try:
        extra = b""
        if rest and rest[0].startswith("extra "):
            extra = base64.b64decode(rest.pop(0)[6:], validate=True)
        if not rest or not rest[0].startswith("index "):
            raise NoteError("a tlog-proof names its index")
        index = rest.pop(0)[6:]
        if not index.isascii() or not index.isdigit() or (index != "0" and index[0] == "0"):
            raise NoteError("a tlog-proof's index is a decimal")
        proof = [base64.b64decode(x, validate=True) for x in rest]
    except (binascii.Error, ValueError) as exc:
        raise NoteError(f"a tlog-proof line is not base64 ({exc})") from None
    return int(index), proof, note, extra
