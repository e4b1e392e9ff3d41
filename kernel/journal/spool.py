"""The outage spool: calls decided while the journal's store was away, kept until appended.

A local SQLite file beside the kernel (``Storage.spool``), one row per call, written
with ``synchronous=FULL`` in WAL mode, so a row is on disk (fsynced) before the call it
records proceeds or is answered. Rows are numbered by SQLite's AUTOINCREMENT, never
reused, so a row's id is its place in the spool for good. Once the store is back each
row is appended to the journal as one ``DecidedWithoutJournal`` (``kernel.api.outage``)
and marked drained; a kernel killed between the append and the mark finds the row's
event in the journal by its id and dfid, and only marks it.

The spool holds bytes it does not interpret: what they mean is the caller's.
Methods are synchronous: run them in a worker thread.
"""

from __future__ import annotations

import os
import sqlite3
from typing import NamedTuple

_SCHEMA = """
CREATE TABLE IF NOT EXISTS spool (
    id INTEGER PRIMARY KEY AUTOINCREMENT, dfid TEXT NOT NULL, body BLOB NOT NULL,
    drained INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class SpoolRow(NamedTuple):
    """One spooled call: its id (its place in the spool), its dfid and its recorded bytes."""

    id: int
    dfid: str
    body: bytes


class SpoolForeign(Exception):
    """The spool file belongs to another journal: its rows are not this journal's to append."""


class Spool:
    """The spool file of one journal (``journal_id``), opened for adding and draining."""

    def __init__(self, path: str | os.PathLike[str], journal_id: str) -> None:
        self.path = os.fspath(path)
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.executescript(_SCHEMA)
            self._conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('journal_id', ?)", (journal_id,)
            )
            (owner,) = self._conn.execute(
                "SELECT value FROM meta WHERE key = 'journal_id'"
            ).fetchone()
        except BaseException:
            self._conn.close()
            raise
        if owner != journal_id:
            self._conn.close()
            raise SpoolForeign(f"spool {self.path} belongs to journal {owner}, not {journal_id}")

    def add(self, dfid: str, body: bytes) -> int:
        """Keep one call (committed and fsynced on return); return its id."""
        cur = self._conn.execute("INSERT INTO spool (dfid, body) VALUES (?, ?)", (dfid, body))
        assert cur.lastrowid is not None
        return int(cur.lastrowid)

    def pending(self) -> list[SpoolRow]:
        """Return the rows not yet drained, in spool order."""
        rows = self._conn.execute(
            "SELECT id, dfid, body FROM spool WHERE drained = 0 ORDER BY id"
        ).fetchall()
        return [SpoolRow(int(i), str(d), bytes(b)) for i, d, b in rows]

    def mark_drained(self, row_id: int) -> None:
        """Record that row ``row_id`` is in the journal now."""
        self._conn.execute("UPDATE spool SET drained = 1 WHERE id = ?", (row_id,))

    def close(self) -> None:
        """Close the file."""
        self._conn.close()
