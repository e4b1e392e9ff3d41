"""Where the operator inbox lives: beside the events, in the journal's own store.

The inbox is a table of the journal's store, outside the hash chain: a row is only a
request (kernel.inbox), and what the kernel made of it is an event naming the row.
Both stores implement :class:`InboxStore`: :class:`~kernel.journal._sqlite_inbox.SqliteInbox`
(a table of the journal file, plain sqlite3) and
:class:`~kernel.journal._postgres_inbox.PostgresInbox` (a table of the journal's schema, where
an insert also sends a NOTIFY, so the kernel's poller wakes at once instead of at its
next round). Everything above this port is written once for both.

A row's body is bytes (BLOB / BYTEA), read back as bytes whatever a writer put
there: text that is not UTF-8 is the reader's to refuse, never a read that fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kernel.journal._inbox_rows import StoredRow, stored_rows
from kernel.journal.errors import is_postgres

__all__ = ["InboxStore", "StoredRow", "on_server", "open_inbox", "stored_rows"]


class InboxStore(Protocol):
    """The inbox table of a journal (each call may block: use a worker thread).

    Every method raises :class:`~kernel.journal.errors.JournalError` for a failure.
    """

    location: str
    """Where it is, fit to print (a server URL without its password)."""
    announces: bool
    """Whether :meth:`wait` returns as soon as a row is inserted (PostgreSQL's NOTIFY);
    without it, a poller finds new rows on its next round."""

    def rows(self, *, pending: bool = True, after: int = 0) -> Sequence[StoredRow]:
        """Return the rows with an id above ``after`` (only untaken ones if ``pending``)."""
        ...

    def insert(self, body: bytes, now_ns: int) -> int:
        """Insert a row (and wake the kernel where the store can); return its id."""
        ...

    def mark_taken(self, row_id: int, seq: int) -> None:
        """Record on the row that the event at ``seq`` took it (-1: nothing recorded it)."""
        ...

    def taken_seq(self, row_id: int) -> int | None:
        """Return the seq that took row ``row_id``, or None (not taken, or no such row)."""
        ...

    def last_id(self) -> int:
        """Return the newest row's id (0: none): with :meth:`rows`, a change mark."""
        ...

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for a new row; True if one was announced."""
        ...

    def close(self) -> None:
        """Close the store's connections."""
        ...

    def __enter__(self) -> InboxStore: ...

    def __exit__(self, *exc_info: object) -> None: ...


def on_server(location: str) -> bool:
    """True if the journal at ``location`` is on a server (PostgreSQL)."""
    return is_postgres(location)


def open_inbox(location: str, *, readonly: bool = False) -> InboxStore:
    """Open the inbox of the journal at ``location`` (a file or a server URL).

    ``readonly`` never creates the table: a journal no kernel of this version opened
    yet simply has no rows.
    """
    if on_server(location):
        from kernel.journal._postgres_inbox import PostgresInbox

        return PostgresInbox(location)
    from kernel.journal._sqlite_inbox import SqliteInbox

    return SqliteInbox(location, readonly=readonly)
