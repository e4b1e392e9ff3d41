"""How a journal file's sqlite3 errors become journal errors, for the store and the inbox."""

from __future__ import annotations

import sqlite3

from kernel.journal.errors import JournalCorrupt, JournalError

# sqlite3 raises UnicodeDecodeError for a schema whose text was damaged.
SQLITE_ERRORS = (sqlite3.Error, UnicodeDecodeError)

BUSY_TIMEOUT_S = 10.0
"""How long the inbox waits for the journal writer's lock on the shared file."""


def sqlite_error(path: str, exc: sqlite3.Error | UnicodeDecodeError) -> JournalError:
    """Translate a sqlite3 error met on ``path`` into a JournalError."""
    if isinstance(exc, UnicodeDecodeError):
        # SQLite read text that is not UTF-8 (a damaged schema), before any row.
        return JournalCorrupt(path, f"a damaged database: text that is not UTF-8 ({exc})")
    name = getattr(exc, "sqlite_errorname", "")
    if name == "SQLITE_NOTADB" or name.startswith("SQLITE_CORRUPT"):
        return JournalCorrupt(path, f"not a SQLite database, or a damaged or truncated one ({exc})")
    return JournalError(path, f"cannot be used ({exc})")
