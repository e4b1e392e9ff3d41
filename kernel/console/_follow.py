"""Following a journal read-only: the console's projections, kept current by cheap polling.

The console never writes events. It folds the journal once, then every
``poll_s`` asks SQLite for the events after the last it folded (an indexed
range query that returns nothing most of the time) and for the inbox's
untaken rows, and bumps :attr:`Follower.version` when either changed. Open
pages wait on :meth:`Follower.wait_changed` (the server-sent events stream).
"""

from __future__ import annotations

import logging
import sqlite3
from contextlib import closing
from pathlib import Path

import anyio

from kernel.inbox import BUSY_TIMEOUT_S
from kernel.journal.store import Journal, JournalError
from kernel.state.projections import Projections

log = logging.getLogger(__name__)

_BATCH = 2000


class Follower:
    """The journal's projections as of its last poll, and a way to wait for the next change."""

    def __init__(self, db: str, poll_s: float) -> None:
        self.db = db
        self.poll_s = poll_s
        self.projections = Projections()
        self.version = 0
        """Grows by one each time the journal or the inbox changed."""
        self.queued: set[str] = set()
        """DFIDs with a decision in the inbox that the kernel has not taken yet."""
        self._inbox_mark: tuple[int, int] = (0, 0)
        self._changed = anyio.Event()

    async def catch_up(self, journal: Journal) -> bool:
        """Fold the events appended since the last call and re-read the inbox; whether any."""
        moved = False
        while True:
            batch = await journal.read(self.projections.last_seq + 1, limit=_BATCH)
            if batch:
                self.projections.apply(batch)
                moved = True
            if len(batch) < _BATCH:
                break
        mark, queued = await anyio.to_thread.run_sync(_inbox_state, self.db)
        if mark != self._inbox_mark:
            self._inbox_mark, self.queued = mark, queued
            moved = True
        if moved:
            self.version += 1
            self._changed.set()
            self._changed = anyio.Event()
        return moved

    async def run(self, journal: Journal) -> None:
        """Poll the journal for ever (cancel to stop); a failed round is tried again."""
        while True:
            try:
                await self.catch_up(journal)
            except (JournalError, sqlite3.Error) as exc:
                log.warning("console: reading %s: %s; trying again", self.db, exc)
            await anyio.sleep(self.poll_s)

    async def wait_changed(self, seen: int) -> int:
        """Wait until :attr:`version` is past ``seen``; return it."""
        while self.version <= seen:
            await self._changed.wait()
        return self.version


def _inbox_state(db: str) -> tuple[tuple[int, int], set[str]]:
    """The inbox's (newest row id, untaken rows) as a change mark, and the untaken DFIDs."""
    uri = Path(db).absolute().as_uri() + "?mode=ro"
    with closing(sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)) as conn:
        try:
            rows = conn.execute(
                "SELECT id, dfid, taken_seq FROM operator_inbox WHERE taken_seq IS NULL"
                " OR id = (SELECT max(id) FROM operator_inbox)"
            ).fetchall()
        except sqlite3.OperationalError:
            return (0, 0), set()  # no kernel of this version opened it yet: no inbox
    untaken = [(id_, dfid) for id_, dfid, taken in rows if taken is None]
    newest = max((id_ for id_, _, _ in rows), default=0)
    return (newest, len(untaken)), {dfid for _, dfid in untaken}
