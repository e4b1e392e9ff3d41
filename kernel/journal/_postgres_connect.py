"""How the PostgreSQL store reaches its server: the connection string, connections, errors."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kernel.journal.errors import JournalError

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
