"""What a journal store can go wrong with, and the small records every store shares.

The errors are the same whatever holds the journal (a SQLite file, a PostgreSQL
database): each has a stable ``code`` for logs and the CLI, and names the journal
by its location with any password removed (:func:`redact`), never the secret.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import NoReturn

import msgspec

from kernel.journal.head import CHAIN_KEY_ENV, MIN_KEY_BYTES


class JournalError(Exception):
    """A journal could not be opened, read or written.

    Attributes:
        code: A short upper-case name of the condition, stable for logs and the CLI.
        path: The journal file, or its database URL without a password.
        detail: What went wrong, without the path.
    """

    code = "JOURNAL_ERROR"

    def __init__(self, path: str, detail: str, *, seq: int | None = None) -> None:
        path = redact(path)
        super().__init__(f"journal {path}: {detail}")
        self.path = path
        self.detail = detail
        self.seq = seq


class JournalCorrupt(JournalError):
    """The file is not a readable SQLite database, or its events do not check out."""

    code = "JOURNAL_CORRUPT"


class JournalKeyError(JournalError):
    """The chain key is missing, wrong, too short, or given for a journal that has none."""

    code = "JOURNAL_KEY"


class JournalForeign(JournalError):
    """The file (or database) holds something, but not a journal."""

    code = "JOURNAL_FOREIGN"


class JournalVersionError(JournalError):
    """The journal was written with a schema version this kernel does not read."""

    code = "JOURNAL_VERSION"


class JournalClosed(JournalError):
    """The journal is closed, or was opened read-only, and takes no appends."""

    code = "JOURNAL_CLOSED"


class JournalWriteFailed(JournalError):
    """A write failed; the journal takes no more events until it is reopened."""

    code = "JOURNAL_WRITE_FAILED"


class JournalFenced(JournalWriteFailed):
    """The head moved under this writer (another kernel took the journal): it stops writing.

    The compare-and-set on the head row found another seq than the one this
    writer last committed, so the rows it was writing were rolled back; a
    writer that lost its lease can never fork the chain.
    """

    code = "JOURNAL_FENCED"


class JournalUnreachable(JournalError):
    """The journal's store cannot be reached (its server stopped, the network or mount is gone).

    Not a failure of the journal: nothing was lost and the chain is intact. The writer
    rides it out (:mod:`kernel.journal.outage`): it reconnects, learns whether its last
    transaction committed, and carries on; meanwhile appends wait and the store's state
    says it is away, so a caller can decide without it (``kernel.api.outage``).
    """

    code = "JOURNAL_UNREACHABLE"


class JournalFaults(msgspec.Struct, frozen=True, kw_only=True):
    """Faults to inject, a seam for tests; production code never passes one.

    Attributes:
        fail_transaction: The Nth write transaction (1-based) fails after its
            rows were written and before commit, as if the disk had failed.
    """

    fail_transaction: int | None = None


class JournalStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What a journal committed since it was opened."""

    appends: int
    transactions: int
    events: int
    unsynced: int = 0
    """Transactions committed without a sync of their own (``append(durable=False)``)."""


def chain_key_from(value: bytes | str | None, path: str = "-") -> bytes | None:
    """Return a chain key as bytes (None: no key); refuse one too short to be a secret.

    Raises:
        JournalKeyError: The key is shorter than 16 bytes (the message never shows it).
    """
    if value is None:
        return None
    key = value.encode() if isinstance(value, str) else bytes(value)
    if len(key) < MIN_KEY_BYTES:
        raise JournalKeyError(path, f"a chain key needs at least {MIN_KEY_BYTES} bytes")
    return key


def chain_key_from_env(environ: Mapping[str, str] | None = None, path: str = "-") -> bytes | None:
    """Return the chain key ``DIRK_CHAIN_KEY`` holds (None when unset or empty)."""
    value = (os.environ if environ is None else environ).get(CHAIN_KEY_ENV, "")
    return chain_key_from(value, path) if value else None


_URL_PASSWORD = re.compile(r"^(postgres(?:ql)?://[^:/@?#]*):[^@/?#]*@", re.IGNORECASE)
_PARAM_PASSWORD = re.compile(r"(password=)[^&]*", re.IGNORECASE)


def is_postgres(location: str) -> bool:
    """True if ``location`` is a PostgreSQL URL (``postgresql://`` or ``postgres://``)."""
    return location[:13].lower().startswith(("postgresql://", "postgres://"))


def redact(location: str) -> str:
    """Return ``location`` fit for a message: a database URL loses its password."""
    if not is_postgres(location):
        return location
    return _PARAM_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1:***@", location))


def raise_unwritable(path: str, failure: Exception | None, what: str, writer: bool) -> NoReturn:
    """Raise why the journal at ``path`` takes no more events.

    ``failure`` is what failed it (None: nothing did), ``what`` says what failed, and
    ``writer`` is whether it was opened for writing (else it is read-only).
    """
    if isinstance(failure, JournalFenced):
        raise JournalFenced(path, f"{failure.detail}; no more events are taken") from failure
    if failure is not None:
        raise JournalWriteFailed(
            path, f"{what}; no more events are taken ({failure!r})"
        ) from failure
    raise JournalClosed(path, "closed" if writer else "opened read-only")
