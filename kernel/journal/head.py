"""What anchors a journal's chain: its head record and its optional chain key.

The head record (``meta.head``) is the last event's seq and hash, rewritten in
the same transaction as every append, so a tail removed behind the kernel's
back no longer matches it. With a chain key every event hash is an HMAC
(:func:`kernel.core.events.chain`) and the head record carries an HMAC of its own:
without the key no one can write an event, or a head, that verifies.
docs/integrity.md says what each proves and what it does not.

These are pure functions over the journal's ``meta`` and rows, shared by
:mod:`kernel.journal.store` (opening, appending) and :mod:`kernel.journal.verify`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from kernel.core.events import chain_key_id

KEYED_CHAIN = "hmac-sha256"
"""``meta.chain`` of a journal whose hashes are HMACs under a chain key."""
MIN_KEY_BYTES = 16
"""The shortest chain key taken: a key is a secret, not a password."""
CHAIN_KEY_ENV = "DIRK_CHAIN_KEY"
"""The environment variable ``open_kernel`` and ``dirk`` take the chain key from."""

Row = tuple[int, str, str | None, bytes, bytes]
"""An events row: seq, type, dfid, canonical body, hash."""


def head_value(seq: int, hash_: bytes, key: bytes | None = None) -> str:
    """Return the head record of event ``seq``: "<seq> <hash>", and its MAC when keyed."""
    value = f"{seq} {hash_.hex()}"
    return value if key is None else f"{value} {_head_mac(key, seq, hash_)}"


def _head_mac(key: bytes, seq: int, hash_: bytes) -> str:
    # Without it a head record could be made from any row's hash, and a keyed
    # journal's tail cut off at that row; only heads the kernel wrote carry one.
    return hmac.new(key, b"dirk head v1 %d " % seq + hash_, hashlib.sha256).hexdigest()


def parse_head(value: object) -> tuple[int, bytes, str] | None:
    """Return the (seq, hash, MAC or "") a head record holds, or None if it is malformed."""
    if not isinstance(value, str):
        return None
    seq, _, rest = value.partition(" ")
    hex_, _, mac = rest.partition(" ")
    if not seq.isascii() or not seq.isdigit() or len(hex_) != 64:
        return None
    try:
        return int(seq), bytes.fromhex(hex_), mac
    except ValueError:
        return None


def head_problem(
    meta: Mapping[str, Any], last_seq: int, last_hash: bytes | None, key: bytes | None = None
) -> tuple[str, int | None]:
    """Compare the head record with the last event; return (problem, its seq) or ("", None).

    With the ``key`` of a keyed journal the record's MAC is checked too.
    """
    record = meta.get("head")
    if record is None:
        if meta.get("chain") == KEYED_CHAIN:
            return "a keyed journal without a head record: it was removed", last_seq
        return "", None  # a journal from before head records; its first append writes one
    parsed = parse_head(record)
    if parsed is None:
        return "its head record is malformed", None
    seq, hash_, mac = parsed
    if key is not None and not hmac.compare_digest(mac, _head_mac(key, seq, hash_)):
        return f"its head record (event {seq}) was not written by a kernel with this key", seq
    if last_seq < seq:
        return (
            f"the journal ends at event {last_seq}, but its head record is at event {seq}:"
            f" events {last_seq + 1}..{seq} were removed",
            last_seq + 1,
        )
    if last_seq > seq:
        return (
            f"events {seq + 1}..{last_seq} come after the head record (event {seq}):"
            " they were not appended by a kernel",
            seq + 1,
        )
    if last_hash is not None and last_hash != hash_:
        return f"event {seq} differs from the head record: it was altered", seq
    return "", None


def key_problem(meta: Mapping[str, Any], key: bytes | None, *, events: int, need_key: bool) -> str:
    """Return what is wrong with opening a journal of ``meta`` with ``key``; "" if nothing.

    Args:
        meta: The journal's meta table.
        key: The chain key given, if any.
        events: The journal's events (a key can only be given to one without).
        need_key: The caller must check hashes (writing, verifying), not just read.
    """
    known = meta.get("chain_key_id", "?")
    if meta.get("chain") != KEYED_CHAIN:
        if key is not None and events:
            return (
                "its chain is not keyed, but a chain key was given (a key can only be given"
                " to a journal without events, or the key's record was removed)"
            )
        return ""
    if key is None:
        if need_key:
            return (
                f"its chain is keyed (key id {known}): this needs its chain key"
                f" ({CHAIN_KEY_ENV}, --key-file or chain_key=)"
            )
        return ""
    given = chain_key_id(key)
    if not hmac.compare_digest(given, str(known)):
        return f"the chain key given (key id {given}) is not this journal's (key id {known})"
    return ""
