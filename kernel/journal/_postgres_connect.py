"""How the PostgreSQL store reaches its server: the connection string, connections, errors."""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kernel.journal.errors import JournalError, JournalFenced, JournalUnreachable

# Every connection: bounded waits for a dead server or host, so a lease held by a
# vanished machine is freed, and a writer cut off learns it.
_DEFAULTS = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
    "application_name": "dirk",
}


def conninfo(location: str) -> str:
    """Return libpq's connection string for ``location``, with dirk's defaults added."""
    try:
        params = conninfo_to_dict(location)
    except psycopg.ProgrammingError as exc:
        raise JournalError(location, f"not a usable PostgreSQL URL ({exc})") from None
    for name, value in _DEFAULTS.items():
        params.setdefault(name, value)
    return make_conninfo("", **params)


def connect(location: str, *, autocommit: bool = True) -> psycopg.Connection[Any]:
    """Open a connection to the journal's database (run it in a worker thread)."""
    try:
        return psycopg.connect(conninfo(location), autocommit=autocommit)
    except psycopg.Error as exc:
        raise pg_error(location, exc) from None


def pg_error(location: str, exc: BaseException) -> JournalError:
    """Translate a psycopg error into a JournalError (the message never holds a password)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return JournalError(location, f"cannot be used ({text})")


def is_unreachable(exc: BaseException) -> bool:
    """Whether a driver error says the server cannot be reached (not that a statement failed)."""
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)


def unreachable(location: str, exc: BaseException) -> JournalUnreachable:
    """Translate a lost or refused connection into :class:`JournalUnreachable`."""
    return JournalUnreachable(location, pg_error(location, exc).detail)


def revived(location: str, conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """Return ``conn``, or a new connection in its place when the server dropped it."""
    if not conn.broken:
        return conn
    try:
        return psycopg.connect(conninfo(location), autocommit=conn.autocommit)
    except psycopg.Error as exc:
        raise unreachable(location, exc) from None


class Retaken(NamedTuple):
    """A writer's connections after an outage, its new epoch, and what became of its batch."""

    lease: psycopg.Connection[Any]
    conn: psycopg.Connection[Any]
    epoch: int
    committed: bool


def retake(
    location: str, lease_sql: str, epoch: int, expected_seq: int, pending: tuple[int, str] | None
) -> Retaken:
    """Take the journal's lease again after the store came back; say if ``pending`` committed.

    The writer held the lease in epoch ``epoch`` with the head at ``expected_seq``, and
    may have been committing ``pending`` (its new head seq and head record) when the
    connection went: the head row says which. Anything else (another epoch, another
    head, the lease held by another kernel) means another writer took the journal.

    Raises:
        JournalUnreachable: the server still cannot be reached.
        JournalFenced: another kernel wrote to the journal or holds its lease.
    """
    opened: list[psycopg.Connection[Any]] = []
    try:
        lease = psycopg.connect(conninfo(location), autocommit=True)
        opened.append(lease)
        row = lease.execute(lease_sql).fetchone()
        if row is None or not row[0]:
            raise JournalFenced(location, "another kernel holds the journal's lease now")
        conn = psycopg.connect(conninfo(location), autocommit=True)
        opened.append(conn)
        with conn.transaction():
            head = conn.execute(
                "SELECT seq, value, epoch FROM journal_head WHERE id = 1 FOR UPDATE"
            ).fetchone()
            committed = _committed(location, head, epoch, expected_seq, pending)
            bumped = conn.execute(
                "UPDATE journal_head SET epoch = epoch + 1 WHERE id = 1 RETURNING epoch"
            ).fetchone()
        assert bumped is not None
        return Retaken(lease, conn, int(bumped[0]), committed)
    except BaseException as exc:
        for each in opened:
            with contextlib.suppress(psycopg.Error):
                each.close()
        if isinstance(exc, psycopg.Error):
            if is_unreachable(exc):
                raise unreachable(location, exc) from None
            raise pg_error(location, exc) from None
        raise


def _committed(
    location: str,
    head: Any,
    epoch: int,
    expected_seq: int,
    pending: tuple[int, str] | None,
) -> bool:
    """Whether the head row shows ``pending`` committed (False: the head is still ours)."""
    if head is None or int(head[2]) != epoch:
        raise JournalFenced(location, "the journal's epoch moved while its store was away")
    if pending is not None and (int(head[0]), str(head[1])) == pending:
        return True
    if int(head[0]) != expected_seq:
        raise JournalFenced(location, f"the head moved from event {expected_seq} meanwhile")
    return False
