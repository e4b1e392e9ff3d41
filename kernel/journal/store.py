"""The journal: the append-only, hash-chained event log, whatever store holds it.

Every step of every DecisionFlow is appended here before anything acts on it ("record first",
DESIGN.md section 4). One writer task owns every write and commits in groups: whatever callers
append while a transaction is in flight goes into the next one, so the cost of a commit is
shared by everyone who waited for it. Each row keeps the event's canonical bytes and the
SHA-256 chaining them to the row before (an HMAC-SHA256 when the journal has a chain key), so
:func:`kernel.journal.verify.verify_journal` can prove nothing was edited, dropped or
reordered. The same transaction that appends rows rewrites the head record (the last seq and
hash), so a removed tail is caught on open and by verify; docs/integrity.md says what that
proves and what it does not.

What is read is what was verified, each event against its stored hash and the one before
(:mod:`kernel.journal._rows` says how).

All of that is the same for every store; what a database must do is the port in
:mod:`kernel.journal.port`. :func:`open_journal` takes a SQLite file (the default,
:mod:`kernel.journal._sqlite`) or a ``postgresql://`` URL (:mod:`kernel.journal._postgres`, the
``dir-kernel[postgres]`` extra). Reads use a connection of their own and never wait for a
commit; subscriptions follow live commits without ever slowing the writer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from typing import NoReturn

import anyio

from kernel.core.events import Draft, Event, with_derived
from kernel.core.merkle import Frontier
from kernel.core.ports import Clock
from kernel.journal._batch import Batch, Write, lazy_append, seal_requests
from kernel.journal._meta import SCHEMA_VERSION
from kernel.journal._publish import Listener, Publisher
from kernel.journal._rows import (
    HistoryCheck,
    asked_for,
    leaves_read,
    read_rows,
    storable,
    unaskable,
)
from kernel.journal._scans import Scans
from kernel.journal._sqlite import APPLICATION_ID
from kernel.journal._sqlite_inbox import INBOX_SCHEMA
from kernel.journal._subscription import Subscription
from kernel.journal.errors import (
    JournalClosed,
    JournalCorrupt,
    JournalError,
    JournalFaults,
    JournalFenced,
    JournalForeign,
    JournalKeyError,
    JournalStatistics,
    JournalVersionError,
    JournalWriteFailed,
    chain_key_from,
    chain_key_from_env,
    raise_unwritable,
    redact,
)
from kernel.journal.head import head_value
from kernel.journal.outage import StoreWatch
from kernel.journal.port import Head, StoreReader, StoreWriter
from kernel.journal.sealing import EventUnreadable
from kernel.journal.tree import TreeReader

__all__ = [
    "APPLICATION_ID",
    "INBOX_SCHEMA",
    "SCHEMA_VERSION",
    "CommitObserver",
    "EventUnreadable",
    "Journal",
    "JournalClosed",
    "JournalCorrupt",
    "JournalError",
    "JournalFaults",
    "JournalFenced",
    "JournalForeign",
    "JournalKeyError",
    "JournalStatistics",
    "JournalVersionError",
    "JournalWriteFailed",
    "Listener",
    "TransitionCheck",
    "chain_key_from",
    "chain_key_from_env",
]

TransitionCheck = Callable[[], Callable[[Sequence[Event]], None]]
CommitObserver = Callable[[int, int], None]
"""Told of each committed transaction: (events written, nanoseconds it took to commit)."""


class Journal(Scans):
    """An open journal; get one from :func:`open_journal`."""

    def __init__(
        self,
        path: str,
        reader: StoreReader,
        writer: StoreWriter | None,
        head: Head,
        clock: Clock,
        faults: JournalFaults,
        key: bytes | None = None,
        keyed: bool = False,
        tree: Frontier | None = None,
        tree_built: bool = False,
        grace_s: float = 5.0,
        probe_s: float = 1.0,
    ) -> None:
        self._path = path
        # The Merkle tree's right edge, moved with each commit (kernel.journal.tree).
        self._tree = tree
        self._tree_built = tree_built
        # Never logged, never recorded: only chain() sees it.
        self._key = key
        self._keyed = keyed
        # A keyed chain read without its key cannot have its hashes recomputed.
        self._hashes_checked = key is not None or not keyed
        self._reader = reader
        self._writer = writer
        self._journal_id = head.journal_id
        self._head_seq, self._head_hash, self._head_hex = head.seq, head.hash, head.hash.hex()
        self._clock = clock
        self._faults = faults
        # Its own limiter, so the writer never queues behind other users of anyio's thread pool.
        self._limiter = anyio.CapacityLimiter(1)
        self._watch = StoreWatch(writer, self._limiter, grace_s=grace_s, heartbeat_s=probe_s)
        self._pending = Batch()
        # Set when the store's writer has upkeep to run beside the commits (run_upkeep).
        self._upkeep = anyio.Event()
        self._transition_check: TransitionCheck | None = None
        self._publisher = Publisher()
        self._closing = writer is None
        self._closed = False
        self._failure: Exception | None = None
        self._failure_what = ""
        self._attempts = self._appends = self._transactions = self._events = self._unsynced = 0
        self._observer: CommitObserver | None = None
        self._observer_clock: Callable[[], int] = time.perf_counter_ns
        # Events 1..end were not checked when the journal was opened (restore() folded a
        # snapshot and checked only the tail after it): check_history() does.
        self._history = HistoryCheck()

    @property
    def path(self) -> str:
        """The journal file, or its database URL (which may hold a password: never log it)."""
        return self._path

    @property
    def location(self) -> str:
        """The journal file, or its database URL without a password: fit for messages."""
        return redact(self._path)

    @property
    def journal_id(self) -> str:
        """The UUID this journal was given when it was created."""
        return self._journal_id

    @property
    def head_seq(self) -> int:
        """Seq of the last committed event; 0 when the journal is empty."""
        return self._head_seq

    @property
    def head_hash(self) -> str:
        """Hex hash of the last committed event (the genesis hash when empty)."""
        return self._head_hex

    @property
    def tree_root(self) -> bytes | None:
        """The Merkle root of events 1..head (None when opened read-only: see :meth:`trees`)."""
        return None if self._tree is None else self._tree.root()

    def trees(self) -> TreeReader:
        """Return roots and inclusion and consistency proofs for any size up to the head."""
        return TreeReader(self._reader.tree_nodes, self._leaves, self._tree_built)

    async def _leaves(self, start: int, stop: int) -> list[bytes]:
        self._check_open()
        return await leaves_read(self._reader.rows, start, stop, self._corrupt)

    async def tree_heads(self) -> list[tuple[int, str]]:
        """Return the signed checkpoints stored beside the events: (tree size, note)."""
        self._check_open()
        return await self._reader.tree_heads()

    async def store_tree_head(self, size: int, note: str) -> None:
        """Keep a signed checkpoint of the tree of ``size`` events beside the events.

        Raises JournalClosed (closing, closed or read-only) or JournalError (a failed write).
        """
        if self._writer is None or self._closed:
            self._raise_unwritable()
        store = self._writer.store_tree_head
        await anyio.to_thread.run_sync(store, size, note, limiter=self._limiter)

    @property
    def keyed(self) -> bool:
        """True if the chain is keyed (its hashes are HMACs under a chain key)."""
        return self._keyed

    @property
    def store(self) -> StoreWatch:
        """Whether the store can be reached now (an outage is ridden out: kernel.journal.outage)."""
        return self._watch

    @property
    def failed(self) -> bool:
        """True once a write (or a listener) failed: the journal takes no more events."""
        return self._failure is not None

    def statistics(self) -> JournalStatistics:
        """Return what was committed since the journal was opened."""
        return JournalStatistics(
            appends=self._appends,
            transactions=self._transactions,
            events=self._events,
            unsynced=self._unsynced,
        )

    async def append(self, drafts: Sequence[Draft], *, durable: bool = True) -> list[Event]:
        """Record ``drafts`` as consecutive events; return once they are committed.

        Concurrent appends share transactions (group commit), but one call's
        events are always contiguous and committed together. Once called, the
        drafts are written even if the caller is cancelled while waiting.

        Args:
            drafts: The events to record, in order.
            durable: False: a transaction of only such appends may skip its sync (append_lazy).

        Returns:
            The committed events, numbered, stamped and chained.

        Raises:
            JournalWriteFailed: This or an earlier transaction failed, or a listener raised.
            JournalClosed: The journal is closing, closed or read-only.
        """
        if self._closing or self._failure is not None:
            self._raise_unwritable()
        if not drafts:
            return []
        batch = self._pending
        index = batch.add(drafts, durable)
        await batch.done.wait()
        result = batch.results[index]
        if isinstance(result, list):
            return result
        if result is not None:
            raise result
        self._raise_unwritable()

    def set_transition_check(self, check: TransitionCheck | None) -> None:
        """Check every append before it is written.

        ``check`` is called once per transaction and returns a function that is
        called with each append's events (numbered and stamped, not yet written),
        in order; one that raises refuses
        that append alone (its caller gets the exception, nothing of it is
        written) while the others in the transaction are written. The kernel
        uses it to make an illegal flow transition impossible on disk.
        """
        self._transition_check = check

    def observe_commits(
        self, observer: CommitObserver | None, clock: Callable[[], int] = time.perf_counter_ns
    ) -> None:
        """Tell ``observer`` of each committed transaction: its events and how long it took.

        A port for measurements that are not events (telemetry's commit latency): the
        time is this process's, from ``clock`` (monotonic ns), never the kernel's clock,
        and is recorded nowhere. An observer that raises is dropped, never the journal.
        """
        self._observer, self._observer_clock = observer, clock

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener`` with every committed batch of events, in commit order.

        Listeners run synchronously in the writer task, after the commit and before any
        appender wakes, so a projection fed by one is never behind an append that returned.
        They must be quick and must not raise: a listener that raises leaves the projections
        it feeds unreliable, so the journal fails as if a write had failed (the batch stays
        committed, but its callers and all later appends get :class:`JournalWriteFailed`).
        """
        self._publisher.listeners.append(listener)

    def subscribe(self, from_seq: int = 1, *, buffer: int = 64) -> Subscription:
        """Follow the journal from ``from_seq``: history first, then live commits.

        Use it as ``async with journal.subscribe() as sub: async for batch in sub``.
        A slow subscriber never slows the writer: when its ``buffer`` of batches is full it
        falls back to reading the database, so it still sees every event exactly once, in
        order, in bounded memory. Iteration ends when the journal closes.
        """
        if buffer < 1:
            raise ValueError("buffer must be at least 1")
        return self._publisher.subscribe(self, from_seq, buffer, closed=self._closed)

    async def read(
        self,
        start: int = 1,
        stop: int | None = None,
        *,
        dfid: str | None = None,
        types: Collection[str] | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """Return committed events in seq order.

        Args:
            start: The first seq to return.
            stop: The seq to stop before (exclusive); None for no bound.
            dfid: Only events of this DecisionFlow.
            types: Only events of these types.
            limit: At most this many events.
        """
        return await self._read(start, stop, dfid, types, limit)

    async def _read(
        self,
        start: int,
        stop: int | None,
        dfid: str | None,
        types: Collection[str] | None,
        limit: int | None,
    ) -> list[Event]:
        wanted = None if types is None else [t for t in types if storable(t)]
        if unaskable(wanted, dfid):
            # No event can carry a name that is not UTF-8 text: nothing to ask the store.
            return []
        self._check_open()
        asked = asked_for(wanted)
        rows = await self._reader.events(start, stop, dfid, asked, limit, True)
        if rows and rows[0][0] <= self._history.end:
            await self.check_history()
        events, problem, seq = read_rows(rows, dfid, asked, self._key, self._hashes_checked)
        if problem:
            raise self._corrupt(problem, seq)
        # A page may end up longer than ``limit`` by the events derived from its rows: never
        # cut between a row and what it stands for (a reader goes on from the last seq + 1).
        derived = with_derived(events)
        if wanted is not None and (derived is not events or asked is not wanted):
            # Only the types wanted: neither what a row wanted stands for, nor a row asked
            # for what it may stand for that stood for nothing this time.
            derived = [event for event in derived if event.type in wanted]
        return derived

    async def check_history(self) -> None:
        """Check the chain from event 1 up to where opening began to check it, once.

        The events :meth:`defer_history` left (see :class:`~kernel.journal._rows.HistoryCheck`);
        later calls return at once, or raise again what the first found.

        Raises:
            JournalCorrupt: an event before the snapshot is missing or altered (with its seq).
        """
        await self._history.check(
            self._reader.rows, self._check_open, self._corrupt, self._key, self._hashes_checked
        )

    def defer_history(self, last: int) -> None:
        """Leave events 1..``last`` to :meth:`check_history`; until it ran, reads wait for it."""
        self._history.defer(last)

    def _corrupt(self, problem: str, seq: int) -> JournalCorrupt:
        return JournalCorrupt(self._path, f"{problem} (run dirk verify)", seq=seq)

    async def flow_events(self, dfid: str) -> list[Event]:
        """Return the events of one DecisionFlow in seq order."""
        return await self.read(dfid=dfid)

    async def write_snapshot(self, seq: int, digest: str, body: bytes) -> None:
        """Store the projected state after event ``seq`` (replacing one stored before).

        Raises JournalClosed (closing, closed or read-only) or JournalError (a failed write).
        """
        if self._writer is None or self._closing:
            self._raise_unwritable()
        # The writer's limiter: its connection is used by one thread at a time.
        write = self._writer.write_snapshot
        await anyio.to_thread.run_sync(write, seq, digest, body, limiter=self._limiter)

    async def snapshot_seqs(self) -> list[int]:
        """Return the seqs for which a snapshot is stored, oldest first."""
        self._check_open()
        return await self._reader.snapshot_seqs()

    async def drop_snapshots(self, seqs: Collection[int]) -> None:
        """Delete the snapshots stored for ``seqs`` (their checkpoints stay in the chain).

        Raises JournalClosed (closing, closed or read-only) or JournalError (a failed delete).
        """
        if not seqs:
            return
        if self._writer is None or self._closing:
            self._raise_unwritable()
        drop = self._writer.drop_snapshots
        await anyio.to_thread.run_sync(drop, sorted(seqs), limiter=self._limiter)

    async def read_snapshot(self, seq: int) -> tuple[str, bytes] | None:
        """Return the (digest, body) stored for ``seq``, or None (journals before snapshots too)."""
        self._check_open()
        return await self._reader.read_snapshot(seq)

    def _check_open(self) -> None:
        if self._closed:
            raise JournalClosed(self._path, "closed")

    def _raise_unwritable(self) -> NoReturn:
        raise_unwritable(self._path, self._failure, self._failure_what, bool(self._writer))

    async def run_writer(self) -> None:
        """Commit what is pending, one transaction at a time, until the journal closes.

        The task :func:`~kernel.journal.opening.open_journal` runs beside the body.
        """
        batch = self._pending
        try:
            while not (self._closing and not self._pending.requests):
                batch = self._pending
                lost = await self._watch.idle(batch.ready, self._head_seq)
                if lost is not None and self._failure is None:
                    self._failure, self._failure_what = lost, "the store was lost"
                if batch.requests:
                    self._pending = Batch()
                    if self._failure is None:
                        await self._commit(batch)
                    batch.done.set()
        finally:
            # If cancelled, nobody may be left waiting for a transaction that will not come.
            self._closing = True
            batch.done.set()
            self._pending.done.set()

    async def run_upkeep(self) -> None:
        """Run the store writer's upkeep whenever it is due, beside the commits, until closing.

        A writer may offer ``upkeep`` (run in a thread of its own, never the writer's) and
        ``upkeep_due``, asked after each commit: SQLite checkpoints its WAL so
        (kernel.journal._sqlite_writer), which no commit then waits on.
        """
        upkeep = getattr(self._writer, "upkeep", None)
        if upkeep is None:
            return
        limiter = anyio.CapacityLimiter(1)
        while True:
            await self._upkeep.wait()
            if self._closing:
                return
            self._upkeep = anyio.Event()
            await anyio.to_thread.run_sync(upkeep, limiter=limiter)

    async def _commit(self, batch: Batch) -> None:
        """Write one batch in one transaction, then publish it; a failure fails the journal."""
        assert self._writer is not None
        ts = self._clock.now_ns()
        check = self._transition_check() if self._transition_check is not None else None
        rows, sealed = seal_requests(batch, self._head_seq, self._head_hash, ts, self._key, check)
        if not rows:
            return
        seq, prev = rows[-1][0], rows[-1][4]
        self._attempts += 1
        injected = self._attempts == self._faults.fail_transaction
        head = head_value(seq, prev, self._key)
        lazy = lazy_append(self._writer, batch)
        append = lazy or self._writer.append
        write = Write(append, self._tree, rows, self._head_seq, head, injected)
        began = self._observer_clock() if self._observer is not None else 0
        try:
            # One hop per transaction: the store's writer (a plain sqlite3 or psycopg
            # connection, used only here) grows the tree and runs BEGIN, the rows, the
            # head and COMMIT as one call in a worker thread. run_sync waits out a
            # cancellation, so the writer always learns whether the commit happened (after
            # an outage too: its head row says, kernel.journal.outage).
            await self._watch.write(write, self._head_seq, (seq, head))
        except Exception as exc:
            self._failure, self._failure_what = exc, "a write failed"
            return
        committed = [event for _, events in sealed for event in events]
        self._head_seq, self._head_hash, self._head_hex = seq, prev, committed[-1].hash
        self._tree = write.grown_tree()
        self._appends += len(sealed)
        self._transactions += 1
        self._unsynced += lazy is not None
        self._events += len(committed)
        self._observe(len(committed), began)
        if getattr(self._writer, "upkeep_due", False):
            self._upkeep.set()
        # What readers see: each closing success followed by the FlowClosed it stands for.
        failure = self._publisher.publish(with_derived(committed))
        if failure is not None:
            self._failure, self._failure_what = failure, "a listener raised"
        if self._failure is None:
            for index, events in sealed:
                batch.results[index] = events

    def _observe(self, events: int, began: int) -> None:
        if self._observer is not None:
            try:
                self._observer(events, self._observer_clock() - began)
            except Exception:
                # A measurement that fails costs the measurement, not the journal.
                self._observer = None

    def stop_writer(self) -> None:
        """Let the writer commit what is pending and end (appends after it fail)."""
        self._closing = True
        self._pending.ready.set()
        self._upkeep.set()

    def close(self) -> None:
        """Stop the writer and close the journal: reads fail, subscriptions end."""
        self.stop_writer()
        self._closed = True
        self._publisher.end()
