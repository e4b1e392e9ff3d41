"""Verify a journal's hash chain from genesis on, without trusting anything in the file.

``dirk verify`` runs this first, then replays the projections
(:func:`kernel.replay.verify_projections`). It opens its own read-only
connection and never raises for a bad file: whatever is wrong is reported
with the seq of the first bad event.
"""

from __future__ import annotations

import os
import sqlite3

import anyio
import msgspec

from kernel.events import GENESIS_HASH
from kernel.journal import (
    _ROWS,
    JournalError,
    _connect,
    _inspect,
    _row_problem,
    _sqlite_error,
)
from kernel.subscription import READ_BATCH


class VerifyReport(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of :func:`verify_journal`.

    Attributes:
        ok: True if every event checked out.
        events: Events that checked out (all of them when ``ok``).
        head: Hex hash of the last event that checked out.
        first_bad_seq: Seq of the first bad or missing event; None when ok or
            when the problem is with the file rather than a row.
        problem: What is wrong, empty when ok.
    """

    ok: bool
    events: int
    head: str
    first_bad_seq: int | None = None
    problem: str = ""


async def verify_journal(path: str | os.PathLike[str]) -> VerifyReport:
    """Check every event of the journal at ``path`` from genesis on; never raise for a bad file.

    Recomputes each hash, checks seqs run 1..N without gaps and that each body
    decodes to its own seq, type and DecisionFlow.
    """
    path = os.fspath(path)
    events, prev = 0, GENESIS_HASH

    def report(problem: str = "", first_bad_seq: int | None = None) -> VerifyReport:
        return VerifyReport(
            ok=not problem,
            events=events,
            head=prev.hex(),
            first_bad_seq=first_bad_seq,
            problem=problem,
        )

    try:
        db = await _connect(path, readonly=True)
        try:
            if await _inspect(db, path) is None:
                return report("an empty database, not a journal")
            start = -(2**63)  # rows below seq 1 would be forgeries: look at them too
            while True:
                query = f"{_ROWS} WHERE seq >= ? ORDER BY seq LIMIT ?"
                rows = list(await db.execute_fetchall(query, (start, READ_BATCH)))
                for row in rows:
                    problem = _row_problem(row, events + 1, prev)
                    if problem:
                        return report(problem, min(row[0], events + 1))
                    events, prev = events + 1, row[4]
                if len(rows) < READ_BATCH:
                    return report()
                start = events + 1
        finally:
            with anyio.CancelScope(shield=True):
                await db.close()
    except sqlite3.Error as exc:
        return report(_sqlite_error(path, exc).detail)
    except JournalError as exc:
        return report(exc.detail)
