"""The operator inbox of a journal file: its table, and :class:`SqliteInbox` to use it."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernel.journal._inbox_rows import StoredRow, stored_rows
from kernel.journal._sqlite_errors import BUSY_TIMEOUT_S, SQLITE_ERRORS, sqlite_error

INBOX_SCHEMA = """
CREATE TABLE IF NOT EXISTS operator_inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, request BLOB NOT NULL,
    created_ts INTEGER NOT NULL, taken_seq INTEGER
);
"""
"""The operator inbox: signed requests written by another process (kernel.inbox).

It lives beside the events but outside the hash chain: a row is only a request.
What the kernel made of it is an event (HumanDecided, DecisionRefused, InputRefused...
naming the row's id), which is what makes each row count exactly once; ``taken_seq``
is a marker for the poller, set after that event committed. AUTOINCREMENT: an id is
never used twice, even after rows are gone, since events name rows by id.
"""
# Before requests were signed, a row held a JSON text in ``decision`` and a ``dfid``.
_OLD_INBOX = """
ALTER TABLE operator_inbox RENAME TO operator_inbox_unsigned;
CREATE TABLE operator_inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, request BLOB NOT NULL,
    created_ts INTEGER NOT NULL, taken_seq INTEGER
);
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'operator_inbox', coalesce(max(id), 0) FROM operator_inbox_unsigned;
"""
# Every column read as what it must be: a writer of the file may have stored anything.
_INBOX_ROWS = (
    "SELECT id, CAST(request AS BLOB),"
    " CASE WHEN typeof(created_ts) = 'integer' THEN created_ts END,"
    " CASE WHEN typeof(taken_seq) = 'integer' THEN taken_seq END"
    " FROM operator_inbox WHERE id > ?"
)


def ensure_inbox(conn: sqlite3.Connection) -> None:
    """Create the inbox table of a journal file that lacks it, or replace an unsigned one.

    The rows of an inbox from before requests were signed stay in
    ``operator_inbox_unsigned``, never read; new ids continue after theirs.
    """
    columns = {row[1] for row in conn.execute("PRAGMA table_info(operator_inbox)")}
    if "decision" in columns:
        conn.executescript(f"BEGIN IMMEDIATE; {_OLD_INBOX} COMMIT;")
    else:
        conn.executescript(INBOX_SCHEMA)


class SqliteInbox:
    """The operator inbox table of a journal file (plain sqlite3, one call at a time).

    The connection may move between worker threads (one call at a time); reads take
    every column as bytes or integers, so nothing a writer of the file stored makes a
    read fail. It never announces a row: a poller finds it on its next round.
    """

    announces = False

    def __init__(self, path: str, *, readonly: bool = False) -> None:
        self._path = path
        self.location = path
        self._readonly = readonly
        try:
            if readonly:
                uri = Path(path).absolute().as_uri() + "?mode=ro"
                self._conn = sqlite3.connect(
                    uri, uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False
                )
            else:
                self._conn = sqlite3.connect(
                    path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
                )
            if not readonly:
                ensure_inbox(self._conn)
            # Every text as bytes: a writer of the file may have stored text that is no UTF-8.
            self._conn.text_factory = bytes
        except SQLITE_ERRORS as exc:
            raise sqlite_error(path, exc) from exc

    def __enter__(self) -> SqliteInbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if self._readonly and ("no such table" in str(exc) or "no such column" in str(exc)):
                return []  # no kernel of this version opened the journal yet: no inbox to read
            raise sqlite_error(self._path, exc) from exc
        except SQLITE_ERRORS as exc:
            raise sqlite_error(self._path, exc) from exc

    def rows(self, *, pending: bool = True, after: int = 0) -> list[StoredRow]:
        """Return the rows after id ``after`` (only untaken ones if ``pending``), oldest first."""
        where = " AND taken_seq IS NULL" if pending else ""
        return stored_rows(self._run(f"{_INBOX_ROWS}{where} ORDER BY id", (after,)))

    def insert(self, body: bytes, now_ns: int) -> int:
        """Insert one row; return its id."""
        try:
            cursor = self._conn.execute(
                "INSERT INTO operator_inbox (request, created_ts) VALUES (?, ?)", (body, now_ns)
            )
        except SQLITE_ERRORS as exc:
            raise sqlite_error(self._path, exc) from exc
        return int(cursor.lastrowid or 0)

    def mark_taken(self, row_id: int, seq: int) -> None:
        """Record on the row that the event at ``seq`` took it."""
        self._run("UPDATE operator_inbox SET taken_seq = ? WHERE id = ?", (seq, row_id))

    def taken_seq(self, row_id: int) -> int | None:
        """Return the seq of the event that took row ``row_id`` (None: not taken yet)."""
        found = self._run(
            "SELECT CASE WHEN typeof(taken_seq) = 'integer' THEN taken_seq END"
            " FROM operator_inbox WHERE id = ?",
            (row_id,),
        )
        return found[0][0] if found and isinstance(found[0][0], int) else None

    def last_id(self) -> int:
        """Return the newest row's id (0: none)."""
        found = self._run("SELECT max(id) FROM operator_inbox")
        return found[0][0] if found and isinstance(found[0][0], int) else 0

    def wait(self, timeout_s: float) -> bool:
        """Return False: a file announces nothing (see :attr:`announces`)."""
        return False

    def close(self) -> None:
        self._conn.close()
