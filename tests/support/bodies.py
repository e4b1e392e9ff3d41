"""What a journal file holds, readable: for tests that look for a secret in it.

Bodies are stored deflated (kernel/journal/codec.py), so a secret in an event would not
show in the file's raw bytes; these are the raw bytes (the meta table, the WAL) and every
event body inflated, where it would.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from kernel.journal.codec import unpack


def readable_bytes(path: Path) -> bytes:
    """Return the file and its WAL as stored, then every event body of it inflated."""
    raw = path.read_bytes()
    wal = path.with_name(path.name + "-wal")
    if wal.exists():
        raw += wal.read_bytes()
    with closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)) as db:
        bodies = [unpack(bytes(body)) for (body,) in db.execute("SELECT body FROM events")]
    assert bodies, "a journal without events proves nothing here"
    return raw + b"".join(bodies)
