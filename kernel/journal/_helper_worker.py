"""The helper process's side of :mod:`kernel.journal._helper`: read, check, hand over.

It imports as little as it can (it is started per long read): for a scan, sqlite3 and
the body codec. Each frame it writes is a kind (one byte), a length (8 bytes) and
that many bytes.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import struct
import sys
from array import array
from pathlib import Path
from typing import Any

from kernel.journal.codec import unpack

HEADER = struct.Struct("<cQ")
"""A frame's kind and length."""
BODIES, STOP, REPORT = b"B", b"S", b"R"
"""Frames: a batch of checked canonical bodies (their count, lengths, bytes); the seq from
which the caller reads on itself; verify's report (msgspec JSON)."""
PAGE = 5_000
FRAME = 1_000
"""Bodies per frame: about 0.5 MB, so the pipe (:data:`PIPE_SIZE`) holds two."""
PIPE_SIZE = 1 << 20
_ROWS = "SELECT seq, body, hash FROM events WHERE seq >= ? ORDER BY seq LIMIT ?"


def send(kind: bytes, payload: bytes) -> None:
    """Write one frame to stdout."""
    out = sys.stdout.buffer
    out.write(HEADER.pack(kind, len(payload)))
    out.write(payload)


def send_bodies(bodies: list[bytes]) -> None:
    """Write BODIES frames of at most :data:`FRAME` bodies each."""
    for at in range(0, len(bodies), FRAME):
        part = bodies[at : at + FRAME]
        lengths = array("I", [len(body) for body in part])
        send(BODIES, struct.pack("<I", len(part)) + lengths.tobytes() + b"".join(part))


def serve() -> None:
    """Answer the request on stdin: the helper process's body."""
    request = json.loads(sys.stdin.buffer.read())
    try:
        # Room to write ahead while the caller folds (Linux; elsewhere the default pipe).
        import fcntl

        fcntl.fcntl(sys.stdout.fileno(), fcntl.F_SETPIPE_SZ, PIPE_SIZE)  # type: ignore[attr-defined,unused-ignore]
    except (ImportError, AttributeError, OSError):
        pass
    if request["verify"]:
        import anyio

        from kernel.journal._verify_helper import verify

        anyio.run(verify, request, backend="asyncio")
    else:
        scan(request)
    sys.stdout.buffer.flush()


def scan(request: dict[str, Any]) -> None:
    """Check rows from ``start`` on (seq, stored as bytes, the hash), handing over bodies.

    The first row that does not plainly check out ends it: the caller reads on from
    there, and says what is wrong in its words (the row is not judged here).
    """
    key = bytes.fromhex(request["key"]) if request["key"] is not None else None
    checked, start = request["checked"], request["start"]
    uri = Path(request["path"]).resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        conn.execute("BEGIN")  # one snapshot for every page
        found = conn.execute("SELECT hash FROM events WHERE seq = ?", (start - 1,)).fetchone()
        prev = bytes(32) if start == 1 else found[0] if found else None
        if not isinstance(prev, bytes):
            send(STOP, str(start).encode())
            return
        while True:
            rows = conn.execute(_ROWS, (start, PAGE)).fetchall()
            bodies, prev = _checked(rows, start, prev, key, checked)
            if bodies:
                send_bodies(bodies)
                start += len(bodies)
            if len(bodies) < len(rows) or len(rows) < PAGE:
                send(STOP, str(start).encode())
                return
    finally:
        conn.close()


def _checked(
    rows: list[Any], seq: int, prev: bytes, key: bytes | None, checked: bool
) -> tuple[list[bytes], bytes]:
    """Return the canonical bodies of the rows that check out from ``seq`` on, and the last
    hash."""
    bodies: list[bytes] = []
    for row_seq, body, hash_ in rows:
        if row_seq != seq or type(body) is not bytes or type(hash_) is not bytes:
            break
        plain = _chained(body, hash_, prev, key, checked)
        if plain is None:
            break
        bodies.append(plain)
        seq, prev = seq + 1, hash_
    return bodies, prev


def _chained(
    body: bytes, hash_: bytes, prev: bytes, key: bytes | None, checked: bool
) -> bytes | None:
    """The canonical bytes of ``body`` if its ``hash_`` chains it on ``prev``, else None."""
    try:
        plain = unpack(body)
    except ValueError:
        return None
    if not checked:
        return plain
    if key is None:
        return plain if hash_ == hashlib.sha256(prev + plain).digest() else None
    from kernel.core.events import chain

    return plain if hash_ == chain(prev, plain, key) else None
