"""The operator inbox of a journal on PostgreSQL: :class:`PostgresInbox`.

An insert also sends a NOTIFY on :data:`INBOX_CHANNEL`, so the kernel's poller
wakes at once instead of at its next round.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from kernel.journal._inbox_rows import StoredRow, stored_rows
from kernel.journal._postgres_connect import connect, pg_error, revived
from kernel.journal.errors import redact

INBOX_CHANNEL = "dirk_inbox"
"""The channel an inbox insert notifies, so the kernel's poller wakes at once."""


class PostgresInbox:
    """The operator inbox table of a journal on PostgreSQL, for ``dirk`` and the poller.

    Each method runs one statement (autocommit); a driver error becomes a
    :class:`~kernel.journal.errors.JournalError`. :meth:`wait` listens on a
    second connection, opened on first use; an insert notifies it.
    """

    announces = True

    def __init__(self, location: str) -> None:
        self._location = location
        self.location = redact(location)
        self._conn = connect(location)
        self._listener: psycopg.Connection[Any] | None = None

    def __enter__(self) -> PostgresInbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        # A connection the server dropped (an outage) is replaced: the poller tries again.
        self._conn = revived(self._location, self._conn)
        try:
            cur = self._conn.execute(sql, params)
            return cur.fetchall() if cur.description else []
        except psycopg.Error as exc:
            raise pg_error(self._location, exc) from None

    def rows(self, *, pending: bool = True, after: int = 0) -> list[StoredRow]:
        """Return the rows after id ``after`` (only untaken ones if ``pending``), oldest first."""
        where = " AND taken_seq IS NULL" if pending else ""
        sql = "SELECT id, request, created_ts, taken_seq FROM operator_inbox WHERE id > %s"
        return stored_rows(self._run(f"{sql}{where} ORDER BY id", (after,)))

    def mark_taken(self, row_id: int, seq: int) -> None:
        """Record on the row that the event at ``seq`` took it."""
        self._run("UPDATE operator_inbox SET taken_seq = %s WHERE id = %s", (seq, row_id))

    def insert(self, body: bytes, now_ns: int) -> int:
        """Insert one row and wake the kernel; return the row's id."""
        self._conn = revived(self._location, self._conn)
        try:
            with self._conn.transaction():
                (row_id,) = self._conn.execute(
                    "INSERT INTO operator_inbox (request, created_ts) VALUES (%s, %s) RETURNING id",
                    (body, now_ns),
                ).fetchall()[0]
                self._conn.execute("SELECT pg_notify(%s, %s)", (INBOX_CHANNEL, str(row_id)))
        except psycopg.Error as exc:
            raise pg_error(self._location, exc) from None
        return int(row_id)

    def taken_seq(self, row_id: int) -> int | None:
        """Return the seq of the event that took row ``row_id`` (None: not taken yet)."""
        rows = self._run("SELECT taken_seq FROM operator_inbox WHERE id = %s", (row_id,))
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    def last_id(self) -> int:
        """Return the newest row's id (0: none)."""
        rows = self._run("SELECT coalesce(max(id), 0) FROM operator_inbox")
        return int(rows[0][0]) if rows else 0

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for an insert's notification; True if one came."""
        try:
            if self._listener is not None and self._listener.broken:
                self._listener.close()
                self._listener = None
            if self._listener is None:
                self._listener = connect(self._location)
                self._listener.execute(f"LISTEN {INBOX_CHANNEL}")
            for _ in self._listener.notifies(timeout=timeout_s, stop_after=1):
                return True
        except psycopg.Error as exc:
            raise pg_error(self._location, exc) from None
        return False

    def close(self) -> None:
        self._conn.close()
        if self._listener is not None:
            self._listener.close()
