"""Following a journal read-only: the console's projections, kept current.

The console never writes events. It folds the journal once, then follows it:

- **SQLite** has no notifications: every ``poll_s`` it asks for the events after the
  last it folded (an indexed range query that returns nothing most of the time) and
  for the inbox's untaken rows.
- **PostgreSQL**: it follows the journal with :func:`kernel.journal.follow.follow_journal`
  (LISTEN on the channel each appending transaction notifies) and LISTENs on the
  inbox's channel, which every insert notifies; nothing is read until one of them
  says something changed. No polling.

Either way :attr:`Follower.version` grows by one when the journal or the inbox
changed, and open pages wait on :meth:`Follower.wait_changed` (the server-sent
events stream). A row counts as queued until the kernel has taken it: untaken in
the inbox and named by no event folded yet (the kernel marks a row taken just
after it records what it made of it, so the journal may say so first).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Iterable, Sequence

import anyio

from kernel.core.events import Event
from kernel.inbox.requests import DecideRequest, decode_row
from kernel.journal.errors import JournalError, is_postgres, redact
from kernel.journal.follow import follow_journal
from kernel.journal.inbox_store import InboxStore, StoredRow, open_inbox
from kernel.journal.store import Journal
from kernel.state.projections import Projections

log = logging.getLogger(__name__)

_BATCH = 2000
_LISTEN_S = 0.5
"""How long one wait for an inbox notification lasts (a cancelled wait ends within it)."""

Untaken = tuple[tuple[int, str], ...]
"""The inbox's untaken rows: (row id, DFID), by id."""


class Follower:
    """The journal's projections as last read, and a way to wait for the next change."""

    def __init__(self, db: str, poll_s: float) -> None:
        self.db = db
        self.poll_s = poll_s
        """SQLite only: how often to read the journal and the inbox again."""
        self.projections = Projections()
        self.version = 0
        """Grows by one each time the journal or the inbox changed."""
        self.last_ts = 0
        """The time of the last event folded: the journal's clock, which the pages'
        ages and deadlines are measured on (a simulated day's journal keeps its day)."""
        self.queued: set[str] = set()
        """DFIDs with a decision in the inbox that the kernel has not taken yet."""
        self._inbox_mark: object = None
        self._untaken: Untaken = ()
        self._changed = anyio.Event()
        self._reader: InboxStore | None = None
        """PostgreSQL: the connection the inbox is read on, kept between reads."""
        self._reading = anyio.Lock()

    @property
    def on_server(self) -> bool:
        """Whether the journal is on PostgreSQL (followed by notifications, not polling)."""
        return is_postgres(self.db)

    def _fold(self, batch: Iterable[Event]) -> bool:
        """Fold the events of ``batch`` not folded yet (two readers may overlap); whether any."""
        fresh = [event for event in batch if event.seq > self.projections.last_seq]
        if fresh:
            self.projections.apply(fresh)
            self.last_ts = max(self.last_ts, max(event.ts for event in fresh))
        return bool(fresh)

    def _queue(self, untaken: Untaken) -> None:
        taken = self.projections.inbox_taken
        self._untaken = untaken
        self.queued = {dfid for row_id, dfid in untaken if row_id not in taken}

    def _bump(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = anyio.Event()

    async def _read_inbox(self) -> bool:
        """Read the inbox's untaken rows again; whether they changed."""
        if self.on_server:
            async with self._reading:
                mark, untaken = await anyio.to_thread.run_sync(self._server_inbox_state)
        else:
            mark, untaken = await anyio.to_thread.run_sync(_inbox_state, self.db)
        moved = mark != self._inbox_mark
        self._inbox_mark = mark
        self._queue(untaken)
        return moved

    async def catch_up(self, journal: Journal) -> bool:
        """Fold the events appended since the last call and re-read the inbox; whether any."""
        moved = False
        while True:
            batch = await journal.read(self.projections.last_seq + 1, limit=_BATCH)
            moved |= self._fold(batch)
            if len(batch) < _BATCH:
                break
        if await self._read_inbox():
            moved = True
        elif moved:
            self._queue(self._untaken)  # the events may have taken a row
        if moved:
            self._bump()
        return moved

    async def run(self, journal: Journal) -> None:
        """Follow the journal for ever (cancel to stop); a failed round is tried again."""
        if self.on_server:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._follow_events)
                tg.start_soon(self._follow_inbox)
            return
        while True:
            try:
                await self.catch_up(journal)
            except (JournalError, sqlite3.Error) as exc:
                log.warning("console: reading %s: %s; trying again", redact(self.db), exc)
            await anyio.sleep(self.poll_s)

    async def _follow_events(self) -> None:
        """PostgreSQL: fold each batch the journal's notifications bring, as it commits."""
        while True:
            try:
                start = self.projections.last_seq + 1
                async with contextlib.aclosing(follow_journal(self.db, start)) as batches:
                    async for batch in batches:
                        if self._fold(batch):
                            await self._read_inbox()
                            self._bump()
            except JournalError as exc:
                log.warning("console: following %s: %s; trying again", redact(self.db), exc)
            await anyio.sleep(self.poll_s)  # only after a failure: a pause before reconnecting

    async def _follow_inbox(self) -> None:
        """PostgreSQL: read the inbox again when an insert announces a row."""
        while True:
            store: InboxStore | None = None
            limiter = anyio.CapacityLimiter(1)
            try:
                store = await anyio.to_thread.run_sync(open_inbox, self.db)
                await anyio.to_thread.run_sync(store.wait, 0)  # LISTEN before the first read
                if await self._read_inbox():
                    self._bump()
                while True:
                    if (
                        await anyio.to_thread.run_sync(
                            store.wait, _LISTEN_S, abandon_on_cancel=True, limiter=limiter
                        )
                        and await self._read_inbox()
                    ):
                        self._bump()
            except JournalError as exc:
                log.warning("console: the inbox of %s: %s; trying again", redact(self.db), exc)
            finally:
                if store is not None:
                    with contextlib.suppress(Exception):
                        store.close()
            await anyio.sleep(self.poll_s)

    def _server_inbox_state(self) -> tuple[object, Untaken]:
        """PostgreSQL: the inbox's untaken rows (their ids are the change mark)."""
        if self._reader is None:
            self._reader = open_inbox(self.db)
        try:
            untaken = _untaken(self._reader.rows(pending=True))
        except JournalError:
            reader, self._reader = self._reader, None
            with contextlib.suppress(Exception):
                reader.close()
            raise
        return untaken, untaken

    def close(self) -> None:
        """Close the connection the inbox is read on, if any."""
        if self._reader is not None:
            with contextlib.suppress(Exception):
                self._reader.close()
            self._reader = None

    async def wait_changed(self, seen: int) -> int:
        """Wait until :attr:`version` is past ``seen``; return it."""
        while self.version <= seen:
            await self._changed.wait()
        return self.version


def _untaken(rows: Sequence[StoredRow]) -> Untaken:
    """The decisions among untaken rows: (row id, DFID); other requests have no flow to mark."""
    found = []
    for row in rows:
        try:
            request = decode_row(row.body).request
        except ValueError:
            continue  # the kernel refuses it when it reads it
        found.append((row.id, request.dfid if isinstance(request, DecideRequest) else ""))
    return tuple(sorted(found))


def _inbox_state(db: str) -> tuple[object, Untaken]:
    """SQLite: the inbox's (newest row id, untaken rows) as a change mark, and its untaken rows."""
    with open_inbox(db, readonly=True) as store:
        untaken = _untaken(store.rows(pending=True))
        newest = store.last_id()
    return (newest, len(untaken)), untaken
