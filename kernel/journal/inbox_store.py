"""Where the operator inbox lives: beside the events, in the journal's own store.

On SQLite the inbox is a table of the journal file, reached with plain sqlite3
(:mod:`kernel.inbox` does that itself). On PostgreSQL it is a table of the
journal's schema, reached through :class:`InboxStore`; an insert there also
sends a NOTIFY, so the kernel's poller wakes at once instead of at its next round.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kernel.journal.errors import is_postgres


class InboxStore(Protocol):
    """The inbox table of a journal on a server (each call may block: use a worker thread).

    Every method raises :class:`~kernel.journal.errors.JournalError` for a failure.
    """

    def rows(self, pending: bool) -> Sequence[Any]:
        """Return (id, dfid, decision, created_ts, taken_seq) rows, oldest first."""
        ...

    def mark_taken(self, row_id: int, seq: int) -> None:
        """Record on the row that the event at ``seq`` took it."""
        ...

    def insert(self, dfid: str, decision: str, now_ns: int) -> int:
        """Insert a row (and wake the kernel); return its id."""
        ...

    def taken_seq(self, row_id: int) -> int | None:
        """Return the seq that took row ``row_id``, or None."""
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
    """True if the journal at ``location`` is on a server (its inbox is an :class:`InboxStore`)."""
    return is_postgres(location)


def open_inbox(location: str) -> InboxStore:
    """Connect to the inbox of the journal at the server URL ``location``."""
    from kernel.journal._postgres import PostgresInbox

    return PostgresInbox(location)
