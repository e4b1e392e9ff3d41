"""The journal: the append-only, hash-chained event log on SQLite.

Every step of every DecisionFlow is appended here before anything acts on it
("record first", DESIGN.md section 4). One writer task owns every write and
commits in groups: whatever callers append while a transaction is in flight
goes into the next one, so the cost of a commit is shared by everyone who
waited for it. Each row keeps the event's canonical bytes and the SHA-256
chaining them to the row before (an HMAC-SHA256 when the journal has a chain
key), so :func:`kernel.journal.verify.verify_journal` can prove nothing was edited,
dropped or reordered. The same transaction that appends rows rewrites the head
record (the last seq and hash, in ``meta``), so a removed tail is caught on
open and by verify; docs/integrity.md says what that proves and what it does not.

Reads use a second connection (aiosqlite); with WAL they never wait for a
commit, and subscriptions follow live commits without ever slowing the writer.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import aiosqlite
import anyio
import msgspec

from kernel.core.events import (
    GENESIS_HASH,
    Draft,
    Event,
    canonical,
    chain,
    chain_key_id,
    decode_body,
    event_type,
    stamp,
)
from kernel.core.ports import Clock, SystemClock
from kernel.journal._subscription import READ_BATCH as _BATCH
from kernel.journal._subscription import Subscription
from kernel.journal.head import (
    CHAIN_KEY_ENV,
    KEYED_CHAIN,
    MIN_KEY_BYTES,
    head_problem,
    head_value,
    key_problem,
)

APPLICATION_ID = 0x44495231
"""``PRAGMA application_id`` of every journal ("DIR1"), so foreign SQLite files are recognised."""

SCHEMA_VERSION = "1"

_SCHEMA = f"""
PRAGMA application_id = {APPLICATION_ID};
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE events (
    seq INTEGER PRIMARY KEY, type TEXT NOT NULL, dfid TEXT, body BLOB NOT NULL, hash BLOB NOT NULL
);
CREATE INDEX events_dfid ON events (dfid) WHERE dfid IS NOT NULL;
CREATE INDEX events_type ON events (type);
"""
INBOX_SCHEMA = """
CREATE TABLE IF NOT EXISTS operator_inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, dfid TEXT NOT NULL, decision TEXT NOT NULL,
    created_ts INTEGER NOT NULL, taken_seq INTEGER
);
"""
"""The operator inbox: human decisions written by another process (``dirk decide``).

It lives beside the events but outside the hash chain: a row is only a request.
What the kernel made of it is an event (HumanDecided or DecisionRefused naming
the row's id), which is what makes each row count exactly once; ``taken_seq``
is a marker for the poller, set after that event committed.
"""
# Snapshots of the projected state live beside the events, never in the hash chain: each
# is only trusted if it hashes to a ProjectionCheckpoint recorded in the chain.
_SNAPSHOTS = (
    "CREATE TABLE IF NOT EXISTS snapshots"
    " (seq INTEGER PRIMARY KEY, digest TEXT NOT NULL, body BLOB NOT NULL)"
)
_INSERT = "INSERT INTO events (seq, type, dfid, body, hash) VALUES (?, ?, ?, ?, ?)"
_ROWS = "SELECT seq, type, dfid, body, hash FROM events"
# prev_hash comes from the row before; a NULL there means seq 1 (genesis) or a missing row.
_EVENTS = (
    "SELECT e.seq, e.body, e.hash, p.hash FROM events AS e"
    " LEFT JOIN events AS p ON p.seq = e.seq - 1 WHERE e.seq >= ?"
)
# sqlite3 raises UnicodeDecodeError for a schema whose text was damaged.
_SQLITE_ERRORS = (sqlite3.Error, UnicodeDecodeError)
_SYNCHRONOUS = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
# The head record (kernel.journal.head), rewritten in each append's transaction.
_HEAD = "INSERT OR REPLACE INTO meta (key, value) VALUES ('head', ?)"

Listener = Callable[[Sequence[Event]], None]
GuardFactory = Callable[[], Callable[[Sequence[Event]], None]]
CommitObserver = Callable[[int, int], None]
"""Told of each committed transaction: (events written, nanoseconds it took to commit)."""
_Row = tuple[int, str, str | None, bytes, bytes]


class JournalError(Exception):
    """A journal could not be opened, read or written.

    Attributes:
        code: A short upper-case name of the condition, stable for logs and the CLI.
        path: The journal file.
        detail: What went wrong, without the path.
    """

    code = "JOURNAL_ERROR"

    def __init__(self, path: str, detail: str, *, seq: int | None = None) -> None:
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
    """The file is a SQLite database, but not a journal."""

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


class _Head(NamedTuple):
    journal_id: str
    seq: int
    hash: bytes


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


class _Batch:
    """The appends gathered for one transaction, and their outcomes."""

    __slots__ = ("done", "ready", "requests", "results")

    def __init__(self) -> None:
        self.requests: list[Sequence[Draft]] = []
        # Per request: its events, the exception its own drafts raised, or None if not written.
        self.results: list[list[Event] | Exception | None] = []
        self.ready = anyio.Event()  # the first append, or closing, wakes the writer
        self.done = anyio.Event()


class Journal:
    """An open journal; get one from :func:`open_journal`."""

    def __init__(
        self,
        path: str,
        reader: aiosqlite.Connection,
        writer: sqlite3.Connection | None,
        head: _Head,
        clock: Clock,
        faults: JournalFaults,
        key: bytes | None = None,
        keyed: bool = False,
    ) -> None:
        self._path = path
        # Never logged, never recorded: only chain() sees it.
        self._key = key
        self._keyed = keyed
        self._reader = reader
        self._writer = writer
        self._journal_id = head.journal_id
        self._head_seq, self._head_hash, self._head_hex = head.seq, head.hash, head.hash.hex()
        self._clock = clock
        self._faults = faults
        # Its own limiter, so the writer never queues behind other users of anyio's thread pool.
        self._limiter = anyio.CapacityLimiter(1)
        self._pending = _Batch()
        self._listeners: list[Listener] = []
        self._guard: GuardFactory | None = None
        self._subscriptions: set[Subscription] = set()
        self._closing = writer is None
        self._closed = False
        self._failure: Exception | None = None
        self._failure_what = ""
        self._attempts = self._appends = self._transactions = self._events = 0
        self._observer: CommitObserver | None = None
        self._observer_clock: Callable[[], int] = time.perf_counter_ns

    @property
    def path(self) -> str:
        """The journal file."""
        return self._path

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
    def keyed(self) -> bool:
        """True if the chain is keyed (its hashes are HMACs under a chain key)."""
        return self._keyed

    @property
    def failed(self) -> bool:
        """True once a write (or a listener) failed: the journal takes no more events."""
        return self._failure is not None

    def statistics(self) -> JournalStatistics:
        """Return what was committed since the journal was opened."""
        return JournalStatistics(
            appends=self._appends, transactions=self._transactions, events=self._events
        )

    async def append(self, drafts: Sequence[Draft]) -> list[Event]:
        """Record ``drafts`` as consecutive events; return once they are committed.

        Concurrent appends share transactions (group commit), but one call's
        events are always contiguous and committed together. Once called, the
        drafts are written even if the caller is cancelled while waiting.

        Args:
            drafts: The events to record, in order.

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
        index = len(batch.requests)
        batch.requests.append(drafts)
        batch.results.append(None)
        batch.ready.set()
        await batch.done.wait()
        result = batch.results[index]
        if isinstance(result, list):
            return result
        if result is not None:
            raise result
        self._raise_unwritable()

    def set_guard(self, guard: GuardFactory | None) -> None:
        """Check every append before it is written.

        ``guard`` is called once per transaction and returns a check that is
        called with each append's events (numbered and stamped, not yet written),
        in order; a check that raises refuses
        that append alone (its caller gets the exception, nothing of it is
        written) while the others in the transaction are written. The kernel
        uses it to make an illegal flow transition impossible on disk.
        """
        self._guard = guard

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

        Listeners run synchronously in the writer task, after the commit and
        before any appender wakes, so a projection fed by one is never behind
        an append that returned. They must be quick and must not raise: a
        listener that raises leaves the projections it feeds unreliable, so the
        journal fails as if a write had failed (the batch stays committed, but
        its callers and all later appends get :class:`JournalWriteFailed`).
        """
        self._listeners.append(listener)

    def subscribe(self, from_seq: int = 1, *, buffer: int = 64) -> Subscription:
        """Follow the journal from ``from_seq``: history first, then live commits.

        Use it as ``async with journal.subscribe() as sub: async for batch in sub``.
        A slow subscriber never slows the writer: when its ``buffer`` of batches
        is full it falls back to reading the database, so it still sees every
        event exactly once, in order, in bounded memory. Iteration ends when the
        journal closes.
        """
        if buffer < 1:
            raise ValueError("buffer must be at least 1")
        subscription = Subscription(self, from_seq, buffer)
        if not self._closed:
            self._subscriptions.add(subscription)
        return subscription

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
        sql, params = [_EVENTS], list[object]([start])
        if stop is not None:
            sql.append("AND e.seq < ?")
            params.append(stop)
        if dfid is not None:
            sql.append("AND e.dfid = ?")
            params.append(dfid)
        if types is not None:
            types = list(types)
            if not types:
                return []
            sql.append(f"AND e.type IN ({', '.join('?' * len(types))})")
            params += types
        sql.append("ORDER BY e.seq")
        if limit is not None:
            sql.append("LIMIT ?")
            params.append(limit)
        rows = await self._query(" ".join(sql), params)
        try:
            return [
                decode_body(body, GENESIS_HASH if seq == 1 else prev or b"", hash_)
                for seq, body, hash_, prev in rows
            ]
        except (ValueError, TypeError) as exc:
            # msgspec.DecodeError, or UnicodeDecodeError for bytes that are not UTF-8.
            raise JournalCorrupt(self._path, f"an event does not decode ({exc})") from exc

    async def check_chain(self, start: int = 1) -> None:
        """Check that events ``start``..head are whole and chain on from event ``start - 1``.

        Raises:
            JournalCorrupt: An event is missing, altered or out of place; ``seq`` names it.
        """
        async for _ in self.scan_checked(start):
            pass

    async def scan_checked(self, start: int = 1) -> AsyncIterator[list[Event]]:
        """Yield events ``start``..head like :meth:`scan`, checking that they chain on.

        Opening a kernel folds its tail through this, from its latest trusted
        snapshot on, so an edit anywhere after that snapshot is refused, at the
        cost of one hash per event. Without the key of a keyed journal (a
        read-only open) the hashes cannot be recomputed and only the rest is
        checked.

        Raises:
            JournalCorrupt: An event is missing, altered or out of place; ``seq`` names it.
        """
        head = self._head_seq
        start = max(start, 1)
        if start > head:
            return
        prev = GENESIS_HASH
        if start > 1:
            rows = list(await self._query("SELECT hash FROM events WHERE seq = ?", [start - 1]))
            if not rows or not isinstance(rows[0][0], bytes):
                raise self._corrupt(f"event {start - 1} is missing", start - 1)
            prev = rows[0][0]
        expected = start
        sql = f"{_ROWS} WHERE seq >= ? AND seq <= ? ORDER BY seq LIMIT ?"
        while expected <= head:
            rows = list(await self._query(sql, [expected, head, _BATCH]))
            if not rows:
                raise self._corrupt(f"event {expected} is missing", expected)
            batch: list[Event] = []
            for row in rows:
                problem, event = _check_row(row, expected, prev, self._key, self._hashes_checked)
                if event is None:
                    raise self._corrupt(problem, expected)
                batch.append(event)
                expected, prev = expected + 1, row[4]
            yield batch

    @property
    def _hashes_checked(self) -> bool:
        return self._key is not None or not self._keyed

    def _corrupt(self, problem: str, seq: int) -> JournalCorrupt:
        return JournalCorrupt(self._path, f"{problem} (run dirk verify)", seq=seq)

    async def scan(self, start: int = 1, batch_size: int = _BATCH) -> AsyncIterator[list[Event]]:
        """Yield every event from ``start`` on, in seq-ordered batches of ``batch_size``."""
        while True:
            batch = await self.read(start, limit=batch_size)
            if batch:
                yield batch
            if len(batch) < batch_size:
                return
            start = batch[-1].seq + 1

    async def flow_events(self, dfid: str) -> list[Event]:
        """Return the events of one DecisionFlow in seq order."""
        return await self.read(dfid=dfid)

    async def write_snapshot(self, seq: int, digest: str, body: bytes) -> None:
        """Store the projected state after event ``seq`` (replacing one stored before).

        Raises:
            JournalClosed: The journal is closing, closed or read-only.
            JournalError: The write failed (the events are untouched).
        """
        if self._writer is None or self._closing:
            self._raise_unwritable()
        writer = self._writer
        try:
            # The writer's limiter: this connection is used by one thread at a time.
            await anyio.to_thread.run_sync(
                _write_snapshot, writer, seq, digest, body, limiter=self._limiter
            )
        except _SQLITE_ERRORS as exc:
            raise _sqlite_error(self._path, exc) from exc

    async def snapshot_seqs(self) -> list[int]:
        """Return the seqs for which a snapshot is stored, oldest first."""
        try:
            rows = await self._query("SELECT seq FROM snapshots ORDER BY seq", [])
        except JournalError as exc:
            if "no such table" in exc.detail:
                return []
            raise
        return [int(seq) for (seq,) in rows]

    async def drop_snapshots(self, seqs: Collection[int]) -> None:
        """Delete the snapshots stored for ``seqs`` (their checkpoints stay in the chain).

        Raises:
            JournalClosed: The journal is closing, closed or read-only.
            JournalError: The delete failed (the events are untouched).
        """
        if not seqs:
            return
        if self._writer is None or self._closing:
            self._raise_unwritable()
        writer = self._writer
        try:
            await anyio.to_thread.run_sync(
                _drop_snapshots, writer, sorted(seqs), limiter=self._limiter
            )
        except _SQLITE_ERRORS as exc:
            raise _sqlite_error(self._path, exc) from exc

    async def read_snapshot(self, seq: int) -> tuple[str, bytes] | None:
        """Return the (digest, body) stored for ``seq``, or None (journals before snapshots too)."""
        try:
            rows = list(
                await self._query("SELECT digest, body FROM snapshots WHERE seq = ?", [seq])
            )
        except JournalError as exc:
            if "no such table" in exc.detail:
                return None
            raise
        return (str(rows[0][0]), bytes(rows[0][1])) if rows else None

    async def _query(self, sql: str, params: Sequence[Any]) -> Iterable[Any]:
        if self._closed:
            raise JournalClosed(self._path, "closed")
        try:
            return await self._reader.execute_fetchall(sql, params)
        except _SQLITE_ERRORS as exc:
            raise _sqlite_error(self._path, exc) from exc

    def _raise_unwritable(self) -> NoReturn:
        if self._failure is not None:
            raise JournalWriteFailed(
                self._path, f"{self._failure_what}; no more events are taken ({self._failure!r})"
            ) from self._failure
        raise JournalClosed(self._path, "closed" if self._writer else "opened read-only")

    async def _run_writer(self) -> None:
        """Commit what is pending, one transaction at a time, until the journal closes."""
        batch = self._pending
        try:
            while not (self._closing and not self._pending.requests):
                batch = self._pending
                await batch.ready.wait()
                if batch.requests:
                    self._pending = _Batch()
                    if self._failure is None:
                        await self._commit(batch)
                    batch.done.set()
        finally:
            # If cancelled, nobody may be left waiting for a transaction that will not come.
            self._closing = True
            batch.done.set()
            self._pending.done.set()

    async def _commit(self, batch: _Batch) -> None:
        """Write one batch in one transaction, then publish it; a failure fails the journal."""
        assert self._writer is not None
        ts = self._clock.now_ns()
        seq, prev = self._head_seq, self._head_hash
        rows: list[_Row] = []
        sealed: list[tuple[int, list[Event]]] = []
        check = self._guard() if self._guard is not None else None
        for index, drafts in enumerate(batch.requests):
            try:
                request_rows, events = _seal(drafts, seq, prev, ts, self._key)
                if check is not None:
                    check(events)
            except Exception as exc:
                # A draft that cannot be encoded fails its own caller, not the whole batch.
                batch.results[index] = exc
                continue
            rows += request_rows
            sealed.append((index, events))
            seq, prev = request_rows[-1][0], request_rows[-1][4]
        if not rows:
            return
        self._attempts += 1
        injected = self._attempts == self._faults.fail_transaction
        began = self._observer_clock() if self._observer is not None else 0
        try:
            # One hop per transaction. A plain sqlite3 connection, used only here, lets
            # BEGIN/executemany/COMMIT run as one call in a worker thread through public
            # APIs (aiosqlite needs two awaits, or its private _execute, for the same).
            # Measured per-transaction cost is the same either way (the fsync dominates);
            # the difference is that run_sync waits out a cancellation, so the writer
            # always learns whether the commit happened.
            await anyio.to_thread.run_sync(
                _write_rows, self._writer, rows, injected, self._key, limiter=self._limiter
            )
        except Exception as exc:
            self._fail("a write failed", exc)
            return
        committed = [event for _, events in sealed for event in events]
        self._head_seq, self._head_hash, self._head_hex = seq, prev, committed[-1].hash
        self._appends += len(sealed)
        self._transactions += 1
        self._events += len(committed)
        if self._observer is not None:
            try:
                self._observer(len(committed), self._observer_clock() - began)
            except Exception:
                # A measurement that fails costs the measurement, not the journal.
                self._observer = None
        try:
            for listener in self._listeners:
                listener(committed)
        except Exception as exc:
            self._fail("a listener raised", exc)
        for subscription in tuple(self._subscriptions):
            subscription._offer(committed)
        if self._failure is None:
            for index, events in sealed:
                batch.results[index] = events

    def _fail(self, what: str, exc: Exception) -> None:
        self._failure, self._failure_what = exc, what

    def _stop(self) -> None:
        self._closing = True
        self._pending.ready.set()

    def _close(self) -> None:
        self._stop()
        self._closed = True
        for subscription in self._subscriptions:
            subscription._send.close()
        self._subscriptions.clear()


@contextlib.asynccontextmanager
async def open_journal(
    path: str | os.PathLike[str],
    *,
    clock: Clock | None = None,
    synchronous: str = "FULL",
    readonly: bool = False,
    faults: JournalFaults | None = None,
    chain_key: bytes | None = None,
) -> AsyncIterator[Journal]:
    """Open the journal at ``path``, creating it if it does not exist.

    On exit, pending appends are committed, the writer stops and the file is closed.

    Args:
        path: The SQLite file.
        clock: Where event timestamps come from; the system clock by default.
        synchronous: SQLite's ``PRAGMA synchronous``; FULL makes every commit durable.
        readonly: Open for reading only (appends raise :class:`JournalClosed`).
        faults: Faults to inject, for tests.
        chain_key: The chain key (see :func:`chain_key_from`): a new journal is keyed
            with it; a keyed journal needs it to be appended to (reading does not).
            Only a journal without events can be given a key.

    Raises:
        JournalCorrupt: Not a SQLite database, or its last event does not check out, or
            the head record says its tail was removed or appended to.
        JournalKeyError: The key is missing (for writing), wrong, or the journal is unkeyed.
        JournalForeign: A SQLite database of something else.
        JournalVersionError: A journal of a schema version this kernel does not read.
        JournalError: The file cannot be opened at all.
    """
    synchronous = synchronous.upper()
    if synchronous not in _SYNCHRONOUS:
        raise ValueError(f"synchronous must be one of {sorted(_SYNCHRONOUS)}, not {synchronous!r}")
    path = os.fspath(path)
    reader = await _connect(path, readonly=readonly)
    writer: sqlite3.Connection | None = None
    journal: Journal | None = None
    try:
        try:
            # One read transaction: a kernel appending meanwhile moves rows and head record
            # together, so they are seen together. Ended before the writer may create the schema.
            await reader.execute("BEGIN")
            journal_id, head, keyed = await _read_state(reader, path, chain_key, readonly)
        except _SQLITE_ERRORS as exc:
            raise _sqlite_error(path, exc) from exc
        finally:
            with contextlib.suppress(*_SQLITE_ERRORS):
                await reader.rollback()
        if not readonly:
            try:
                writer, created_id = await anyio.to_thread.run_sync(
                    _open_writer, path, synchronous, journal_id, chain_key if keyed else None
                )
            except _SQLITE_ERRORS as exc:
                raise _sqlite_error(path, exc) from exc
            head = head._replace(journal_id=created_id)
        journal = Journal(
            path,
            reader,
            writer,
            head,
            clock or SystemClock(),
            faults or JournalFaults(),
            chain_key if keyed else None,
            keyed,
        )
        body_error: Exception | None = None
        async with anyio.create_task_group() as tg:
            if writer is not None:
                tg.start_soon(journal._run_writer)
            try:
                yield journal
            except Exception as exc:
                # Re-raised outside the task group, so the caller sees it and not an ExceptionGroup.
                body_error = exc
            finally:
                journal._stop()
        if body_error is not None:
            raise body_error
    finally:
        with anyio.CancelScope(shield=True):
            if journal is not None:
                journal._close()
            if writer is not None:
                await anyio.to_thread.run_sync(writer.close)
            await reader.close()


def _seal(
    drafts: Sequence[Draft], seq: int, prev: bytes, ts: int, key: bytes | None = None
) -> tuple[list[_Row], list[Event]]:
    """Number, stamp and chain one caller's drafts after event ``seq``, whose hash is ``prev``.

    A negative ``caused_by`` (-k: the event k places before, in this append) becomes a seq
    here. With a chain ``key`` each hash is an HMAC (see :func:`kernel.core.events.chain`).
    """
    rows: list[_Row] = []
    events: list[Event] = []
    prev_hex = prev.hex()
    for position, draft in enumerate(drafts):
        seq += 1
        if draft.caused_by is not None and draft.caused_by < 0:
            if -draft.caused_by > position:
                raise ValueError(f"caused_by={draft.caused_by} reaches outside its append")
            draft = msgspec.structs.replace(draft, caused_by=seq + draft.caused_by)
        event = stamp(draft, seq, ts)
        body = canonical(event)
        _check_round_trip(event, body)
        hash_ = chain(prev, body, key)
        hash_hex = hash_.hex()
        rows.append((seq, event_type(draft.payload), draft.dfid, body, hash_))
        events.append(msgspec.structs.replace(event, prev_hash=prev_hex, hash=hash_hex))
        prev, prev_hex = hash_, hash_hex
    return rows, events


def _check_round_trip(event: Event, body: bytes) -> None:
    """Refuse an event whose stored bytes would not read back as the same event.

    JSON writes ``nan`` as ``null`` and a tuple as a list; msgpack, which hashes the
    projections and stores snapshots, cannot hold an integer outside 64 bits. Any of
    these would leave a journal the next open cannot read, so the append fails instead
    (only its own caller: see ``Journal._commit``).

    Raises:
        EventUnreadable: the event does not survive encode, decode, compare.
    """
    try:
        back = _round_trip_decoder.decode(body)
        _msgpack_probe.encode(event.payload)
    except (msgspec.DecodeError, OverflowError, TypeError, ValueError) as exc:
        raise EventUnreadable(f"{event_type(event.payload)} would not read back: {exc}") from None
    if back != event:
        raise EventUnreadable(
            f"{event_type(event.payload)} would read back as another event"
            " (a non-finite float, a tuple or another type JSON does not keep)"
        )


class EventUnreadable(ValueError):
    """An event refused before it was staged: its canonical bytes do not decode back to it."""


_round_trip_decoder = msgspec.json.Decoder(Event)
_msgpack_probe = msgspec.msgpack.Encoder()


def _write_rows(
    conn: sqlite3.Connection, rows: list[_Row], injected: bool, key: bytes | None
) -> None:
    """Insert ``rows`` in one transaction, or none of them (runs in a worker thread).

    seq is the primary key, so a second writer on the same file fails here instead
    of forking the chain.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany(_INSERT, rows)
        conn.execute(_HEAD, (head_value(rows[-1][0], rows[-1][4], key),))
        if injected:
            raise sqlite3.OperationalError("disk I/O error (injected by JournalFaults)")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def _write_snapshot(conn: sqlite3.Connection, seq: int, digest: str, body: bytes) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO snapshots (seq, digest, body) VALUES (?, ?, ?)", (seq, digest, body)
    )


def _drop_snapshots(conn: sqlite3.Connection, seqs: list[int]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany("DELETE FROM snapshots WHERE seq = ?", [(seq,) for seq in seqs])
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def _open_writer(
    path: str, synchronous: str, journal_id: str | None, key: bytes | None
) -> tuple[sqlite3.Connection, str]:
    """Open the writer's connection, creating the schema if ``journal_id`` is None (blank file).

    ``key`` is the chain key of a keyed journal (checked against an existing one before).
    """
    # check_same_thread is off because anyio's worker threads take turns; only the
    # writer task ever uses this connection, one call at a time.
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        if journal_id is None:
            journal_id = str(uuid.uuid4())
            conn.executescript(
                f"BEGIN IMMEDIATE; {_SCHEMA} INSERT INTO meta (key, value) VALUES"
                f" ('schema_version', '{SCHEMA_VERSION}'), ('journal_id', '{journal_id}'),"
                f" ('head', '{head_value(0, GENESIS_HASH)}'); COMMIT;"
            )
        if key is not None and _has_no_events(conn):
            # A new journal, or one without events: from its first event on, hashes are HMACs.
            conn.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                [
                    ("chain", KEYED_CHAIN),
                    ("chain_key_id", chain_key_id(key)),
                    ("head", head_value(0, GENESIS_HASH, key)),
                ],
            )
        # Journals created before the inbox existed get it the first time a kernel opens them.
        conn.executescript(INBOX_SCHEMA)
        conn.execute(_SNAPSHOTS)
    except BaseException:
        conn.close()
        raise
    return conn, journal_id


def _sqlite_connect(path: str, readonly: bool) -> sqlite3.Connection:
    target = Path(path).absolute().as_uri() + "?mode=ro" if readonly else path
    return sqlite3.connect(target, uri=readonly, check_same_thread=False)


async def _connect(path: str, *, readonly: bool) -> aiosqlite.Connection:
    """Open an aiosqlite connection for reading ``path``."""
    try:
        conn = await anyio.to_thread.run_sync(_sqlite_connect, path, readonly)
    except _SQLITE_ERRORS as exc:
        raise _sqlite_error(path, exc) from exc
    # Opened here rather than by aiosqlite.connect: when that fails, it leaves its thread
    # reporting to an event loop that may be gone (omnilib/aiosqlite#241).
    return await aiosqlite.Connection(lambda: conn, iter_chunk_size=64)


async def _inspect(db: aiosqlite.Connection, path: str) -> dict[str, str] | None:
    """Check ``db`` holds a journal this kernel reads; return its meta, or None if it is blank."""
    try:
        ((application_id,),) = await db.execute_fetchall("PRAGMA application_id")
        tables = {
            name
            for (name,) in await db.execute_fetchall(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
            )
        }
        if application_id == 0 and not tables:
            return None
        if application_id != APPLICATION_ID or not {"meta", "events"} <= tables:
            raise JournalForeign(
                path,
                f"a SQLite database of something else (application_id {application_id:#x},"
                f" a journal has {APPLICATION_ID:#x} and tables meta and events)",
            )
        rows = await db.execute_fetchall("SELECT key, value FROM meta")
        meta: dict[Any, Any] = dict(rows)  # type: ignore[arg-type]
    except _SQLITE_ERRORS as exc:
        raise _sqlite_error(path, exc) from exc
    version = meta.get("schema_version")
    if version != SCHEMA_VERSION:
        raise JournalVersionError(
            path, f"schema version {version!r}; this kernel reads version {SCHEMA_VERSION!r}"
        )
    if not isinstance(meta.get("journal_id"), str):
        raise JournalCorrupt(path, "the meta table has no journal_id")
    if meta.get("chain", KEYED_CHAIN) != KEYED_CHAIN:
        raise JournalVersionError(path, f"a chain of kind {meta['chain']!r}, unknown here")
    return {str(k): v for k, v in meta.items()}


async def _read_state(
    reader: aiosqlite.Connection, path: str, chain_key: bytes | None, readonly: bool
) -> tuple[str | None, _Head, bool]:
    """Return the journal's id (None: a blank file), checked head, and whether it is keyed."""
    meta = await _inspect(reader, path)
    if meta is None:
        if readonly:
            raise JournalForeign(path, "an empty database, not a journal")
        return None, _Head("", 0, GENESIS_HASH), chain_key is not None
    journal_id = meta["journal_id"]
    # Reading a keyed journal needs no key (its hashes then go unchecked); writing does.
    problem = key_problem(meta, chain_key, events=0, need_key=not readonly)
    if problem:
        raise JournalKeyError(path, problem)
    keyed = meta.get("chain") == KEYED_CHAIN
    checked = chain_key is not None or not keyed
    key = chain_key if keyed else None
    head = _Head(journal_id, *await _read_head(reader, path, meta, key, checked))
    # A key given to an unkeyed journal: refused once it has events (a read-only open
    # cannot key it either); a journal without events is keyed from its first on.
    events = head.seq if not readonly else max(head.seq, 1)
    problem = key_problem(meta, chain_key, events=events, need_key=False)
    if problem:
        raise JournalKeyError(path, problem)
    return journal_id, head, keyed or chain_key is not None


def _has_no_events(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM events LIMIT 1").fetchone() is None


async def _read_head(
    db: aiosqlite.Connection,
    path: str,
    meta: Mapping[str, str],
    key: bytes | None,
    hashes_checked: bool,
) -> tuple[int, bytes]:
    """Return the last event's seq and hash, after checking it against the head record
    and that it chains to the one before."""
    try:
        rows = list(await db.execute_fetchall(f"{_ROWS} ORDER BY seq DESC LIMIT 2"))
    except _SQLITE_ERRORS as exc:
        raise _sqlite_error(path, exc) from exc
    last_seq = int(rows[0][0]) if rows else 0
    last_hash = rows[0][4] if rows and isinstance(rows[0][4], bytes) else None
    problem, seq = head_problem(meta, last_seq, last_hash, key if hashes_checked else None)
    if problem:
        raise JournalCorrupt(path, f"{problem} (run dirk verify)", seq=seq)
    if not rows:
        return 0, GENESIS_HASH
    before = rows[1] if len(rows) == 2 else None
    expected = before[0] + 1 if before else 1
    prev = before[4] if before and isinstance(before[4], bytes) else GENESIS_HASH
    problem, _ = _check_row(rows[0], expected, prev, key, hashes_checked)
    if problem:
        raise JournalCorrupt(
            path, f"{problem} (run dirk verify to find the first bad event)", seq=expected
        )
    return rows[0][0], rows[0][4]


def _row_problem(
    row: Any, expected_seq: int, prev: bytes, key: bytes | None = None, hashes_checked: bool = True
) -> str:
    """Return what is wrong with a row; "" if it is event ``expected_seq`` chained to ``prev``.

    ``key`` is the chain key of a keyed journal; ``hashes_checked`` False skips the
    hash (a keyed journal read without its key).
    """
    return _check_row(row, expected_seq, prev, key, hashes_checked)[0]


def _check_row(
    row: Any, expected_seq: int, prev: bytes, key: bytes | None, hashes_checked: bool
) -> tuple[str, Event | None]:
    """Return ("", the event) if the row is event ``expected_seq`` chained to ``prev``,
    else (what is wrong, None)."""
    seq, type_, dfid, body, hash_ = row
    if seq != expected_seq:
        if seq > expected_seq:
            return f"event {expected_seq} is missing (the next row is event {seq})", None
        return f"unexpected row with seq {seq}", None
    if not isinstance(body, bytes) or not isinstance(hash_, bytes):
        return f"event {seq} is not stored as bytes", None
    try:
        event = decode_body(body, prev, hash_)
    except (ValueError, TypeError) as exc:
        # msgspec.DecodeError, or UnicodeDecodeError for bytes that are not UTF-8.
        return f"event {seq} does not decode ({exc})", None
    if event.seq != seq:
        return f"event {seq} records seq {event.seq} in its body", None
    if hashes_checked and hash_ != chain(prev, body, key):
        return f"event {seq} does not match its hash: its body or hash was altered", None
    if type_ != event.type or dfid != event.dfid:
        return f"event {seq} has type or dfid columns that differ from its body", None
    return "", event


def _sqlite_error(path: str, exc: sqlite3.Error | UnicodeDecodeError) -> JournalError:
    """Translate a sqlite3 error met on ``path`` into a JournalError."""
    if isinstance(exc, UnicodeDecodeError):
        # SQLite read text that is not UTF-8 (a damaged schema), before any row.
        return JournalCorrupt(path, f"a damaged database: text that is not UTF-8 ({exc})")
    name = getattr(exc, "sqlite_errorname", "")
    if name == "SQLITE_NOTADB" or name.startswith("SQLITE_CORRUPT"):
        return JournalCorrupt(path, f"not a SQLite database, or a damaged or truncated one ({exc})")
    return JournalError(path, f"cannot be used ({exc})")
