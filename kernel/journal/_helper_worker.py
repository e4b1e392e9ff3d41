"""The helper process's side of :mod:`kernel.journal._helper`: read, check, hand over.

It imports as little as it can (it is started per long read): sqlite3, msgspec and the
body codec. Each frame it writes is a kind (one byte), a length (8 bytes) and that
many bytes.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import struct
import sys
from pathlib import Path
from typing import Any

import msgspec

from kernel.journal.codec import unpack

HEADER = struct.Struct("<cQ")
"""A frame's kind and length."""
BODIES, STOP = b"B", b"S"
"""Frames: a batch of checked rows (msgpack: their canonical bodies, and for a verify
their hashes, type and dfid columns and Merkle leaves); the seq from which the caller
reads on itself."""
PAGE = 1_000
"""Rows per frame: about 0.4 MB, so the pipe (:data:`PIPE_SIZE`) holds two or more."""
PIPE_SIZE = 1 << 20
_ROWS = (
    "SELECT seq, type, dfid, body, hash FROM events WHERE seq >= ? AND seq <= ?"
    " ORDER BY seq LIMIT ?"
)


def send(kind: bytes, payload: bytes) -> None:
    """Write one frame to stdout."""
    out = sys.stdout.buffer
    out.write(HEADER.pack(kind, len(payload)))
    out.write(payload)


def serve() -> None:
    """Answer the request on stdin: the helper process's body."""
    request = json.loads(sys.stdin.buffer.read())
    try:
        # Room to write ahead while the caller folds (Linux; elsewhere the default pipe).
        import fcntl

        fcntl.fcntl(sys.stdout.fileno(), fcntl.F_SETPIPE_SZ, PIPE_SIZE)  # type: ignore[attr-defined,unused-ignore]
    except (ImportError, AttributeError, OSError):
        pass
    scan(request)
    sys.stdout.buffer.flush()


def scan(request: dict[str, Any]) -> None:
    """Check rows ``start``..``last`` (seq, stored as bytes, the hash), handing them over.

    The first row that does not plainly check out ends it: the caller reads on from
    there, and says what is wrong in its words (the row is not judged here).
    """
    checked, start, last = request["checked"], request["start"], request["last"]
    last = (1 << 63) - 1 if last is None else last
    uri = Path(request["path"]).resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        conn.execute("BEGIN")  # one snapshot for every page
        found = conn.execute("SELECT hash FROM events WHERE seq = ?", (start - 1,)).fetchone()
        prev = bytes(32) if start == 1 else found[0] if found else None
        while isinstance(prev, bytes):
            rows = conn.execute(_ROWS, (start, last, PAGE)).fetchall()
            batch, prev = _checked(rows, start, prev, checked, request["verify"])
            if batch[0]:
                send(BODIES, msgspec.msgpack.encode(batch))
                start += len(batch[0])
            if len(batch[0]) < len(rows) or len(rows) < PAGE:
                break
        send(STOP, str(start).encode())
    finally:
        conn.close()


def _checked(
    rows: list[Any], seq: int, prev: bytes, checked: bool, verify: bool
) -> tuple[list[list[Any]], bytes]:
    """Return the rows that check out from ``seq`` on as [bodies, hashes, types, dfids,
    leaves] (the last four for a verify only), and the hash of the last that did."""
    good: list[tuple[Any, Any, bytes, bytes]] = []
    for row_seq, type_, dfid, body, hash_ in rows:
        if row_seq != seq or type(body) is not bytes or type(hash_) is not bytes:
            break
        plain = _chained(body, hash_, prev, checked)
        if plain is None:
            break
        good.append((type_, dfid, plain, hash_))
        seq, prev = seq + 1, hash_
    return _columns(good, verify), prev


def _columns(good: list[tuple[Any, Any, bytes, bytes]], verify: bool) -> list[list[Any]]:
    bodies = [plain for _, _, plain, _ in good]
    if not verify:
        return [bodies, [], [], [], []]
    sha256 = hashlib.sha256
    return [
        bodies,
        [hash_ for *_, hash_ in good],
        [type_ for type_, *_ in good],
        [dfid for _, dfid, *_ in good],
        [sha256(b"\x00" + body).digest() for body in bodies],
    ]


def _chained(body: bytes, hash_: bytes, prev: bytes, checked: bool) -> bytes | None:
    """The canonical bytes of ``body`` if its ``hash_`` chains it on ``prev`` (an unkeyed
    chain: a keyed one is read in process), else None."""
    try:
        plain = unpack(body)
    except ValueError:
        return None
    if checked and hash_ != hashlib.sha256(prev + plain).digest():
        return None
    return plain
