"""The PostgreSQL store: a journal other machines reach, one writer holding its lease.

The same rows, canonical bytes and chain as the SQLite store, in tables of the
connection's current schema (``events``, ``meta``, ``journal_head``,
``snapshots``, ``operator_inbox``). Needs the ``dir-kernel[postgres]`` extra
(psycopg 3); nothing imports this module until a ``postgresql://`` URL is opened.

- **The lease.** A writer first takes ``pg_advisory_lock`` on a connection of its
  own and holds it while it lives; a second kernel on the same journal waits
  there, as a standby, and takes over when the first is gone (its session ends:
  SIGKILL, a lost connection, or TCP keepalives giving up on a dead host).
- **The fence.** Taking the lease bumps ``journal_head.epoch``; every group
  commit is one transaction that COPYs the sealed rows and moves the head row by
  compare-and-set (``WHERE seq = expected AND epoch = mine``), which must report
  one row. A writer deposed without noticing gets none, rolls back and fails
  closed (:class:`~kernel.journal.errors.JournalFenced`): it can never fork the
  chain. ``seq`` is the primary key, a second fence.
- **Followers.** The appending transaction sends ``NOTIFY dirk_journal`` with
  the new head seq, so other processes can follow with ``LISTEN``.

The driver is psycopg 3, synchronous, in the writer's worker thread exactly as
the SQLite writer works, so the kernel stays free of one event loop (asyncpg
is asyncio-only; its COPY measured 1.1-1.8x faster, which a group commit of
hundreds of rows does not need). Connections per kernel: the lease, the writer,
the reader, and the inbox poller's (four); a read-only open uses one.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import anyio
import psycopg

from kernel.core.events import GENESIS_HASH, chain_key_id
from kernel.core.merkle import Frontier, leaf_hash
from kernel.journal._meta import SCHEMA_VERSION, check_meta, check_state
from kernel.journal._postgres_connect import connect as connect
from kernel.journal._postgres_connect import is_unreachable, pg_error, retake, revived, unreachable
from kernel.journal._postgres_follow import CHANNEL, TREE_SCHEMA
from kernel.journal._postgres_follow import add_tree_head as add_tree_head
from kernel.journal._postgres_follow import listen as listen
from kernel.journal._postgres_follow import notified as notified
from kernel.journal.codec import unpack
from kernel.journal.errors import (
    JournalError,
    JournalFenced,
    JournalForeign,
    JournalWriteFailed,
)
from kernel.journal.head import KEYED_CHAIN, Row, head_value
from kernel.journal.port import EventRow, Head, OpenedStore
from kernel.journal.tree import (
    TREE_MARK,
    Node,
    NodeKey,
    TreeBuilder,
    aligned,
    frontier_from,
    frontier_keys,
)

LEASE_CLASS = 0x44495231
"""The first key of the writer's advisory lock ("DIR1"); the second is the schema's hash."""

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE events (
    seq BIGINT PRIMARY KEY, type TEXT NOT NULL, dfid TEXT, body BYTEA NOT NULL,
    hash BYTEA NOT NULL
);
CREATE INDEX events_dfid ON events (dfid) WHERE dfid IS NOT NULL;
CREATE INDEX events_type ON events (type);
CREATE TABLE journal_head (
    id INT PRIMARY KEY CHECK (id = 1), seq BIGINT NOT NULL, value TEXT NOT NULL,
    epoch BIGINT NOT NULL
);
CREATE TABLE snapshots (seq BIGINT PRIMARY KEY, digest TEXT NOT NULL, body BYTEA NOT NULL);
CREATE TABLE operator_inbox (
    id BIGSERIAL PRIMARY KEY, request BYTEA NOT NULL,
    created_ts BIGINT NOT NULL, taken_seq BIGINT
);
"""
_NODE = (
    "INSERT INTO tree_nodes (level, idx, hash) VALUES (%s, %s, %s)"
    " ON CONFLICT (level, idx) DO UPDATE SET hash = excluded.hash"
)
OPERATOR_GRANTS = """
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role};
GRANT INSERT (request, created_ts) ON operator_inbox TO {role};
GRANT USAGE ON SEQUENCE operator_inbox_id_seq TO {role};
"""
"""What an operator role needs (run by the kernel's role, which owns the tables): read
everything, insert inbox rows (their request and time only: never an id or a taken
mark), nothing else. Only the kernel's role writes events. A row acts only if its
request is signed with a key in the kernel's keyring (kernel.inbox), which no
database role can write."""
_TABLES = frozenset({"meta", "events", "journal_head"})
_ROWS = "SELECT seq, type, dfid, body, hash FROM events"
_EVENTS = (
    "SELECT e.seq, e.body, e.hash, p.hash FROM events AS e"
    " LEFT JOIN events AS p ON p.seq = e.seq - 1 WHERE e.seq >= %s"
)
# The same rows without the join for the previous hash (NULL): what a scan reads
# (Journal.scan), which checks the chain through consecutive rows itself.
_BODIES = "SELECT e.seq, e.body, e.hash, NULL FROM events AS e WHERE e.seq >= %s"
_COPY = "COPY events (seq, type, dfid, body, hash) FROM STDIN (FORMAT BINARY)"
_COPY_TYPES = ["int8", "text", "text", "bytea", "bytea"]
_LEASE = f"SELECT pg_advisory_lock({LEASE_CLASS}, hashtext(current_schema()))"
_TRY_LEASE = f"SELECT pg_try_advisory_lock({LEASE_CLASS}, hashtext(current_schema()))"
T = TypeVar("T")


class _Session:
    """One connection used from worker threads one call at a time, errors translated.

    ``revives``: a connection the server dropped is replaced before the next call (the
    reader's, which holds no transaction across calls), so reads resume after an outage.
    """

    revives = False

    def __init__(self, location: str, conn: psycopg.Connection[Any]) -> None:
        self._location = location
        self._conn = conn
        self._limiter = anyio.CapacityLimiter(1)

    def _call(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        if self.revives:
            self._conn = revived(self._location, self._conn)
            try:
                return fn(self._conn)
            except psycopg.OperationalError:
                if not self._conn.broken:
                    raise
                # Dropped since its last use (the server restarted): once more, anew.
                self._conn = revived(self._location, self._conn)
        return fn(self._conn)

    async def run(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(self._call, fn, limiter=self._limiter)
        except psycopg.Error as exc:
            if is_unreachable(exc):
                raise unreachable(self._location, exc) from None
            raise pg_error(self._location, exc) from None

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._conn.close, limiter=self._limiter)


class _Reader(_Session):
    revives = True

    async def events(
        self,
        start: int,
        stop: int | None,
        dfid: str | None,
        types: Sequence[str] | None,
        limit: int | None,
        hashes: bool = True,
    ) -> list[EventRow]:
        sql, params = [_EVENTS if hashes else _BODIES], list[object]([start])
        if stop is not None:
            sql.append("AND e.seq < %s")
            params.append(stop)
        if dfid is not None:
            sql.append("AND e.dfid = %s")
            params.append(dfid)
        if types is not None:
            sql.append("AND e.type = ANY(%s)")
            params.append(list(types))
        sql.append("ORDER BY e.seq")
        if limit is not None:
            sql.append("LIMIT %s")
            params.append(limit)
        query = " ".join(sql)
        return await self.run(lambda conn: conn.execute(query, params).fetchall())

    async def rows(self, start: int, last: int, limit: int) -> list[Row]:
        sql = f"{_ROWS} WHERE seq >= %s AND seq <= %s ORDER BY seq LIMIT %s"
        return await self.run(lambda conn: conn.execute(sql, (start, last, limit)).fetchall())

    async def hash_at(self, seq: int) -> bytes | None:
        sql = "SELECT hash FROM events WHERE seq = %s"
        row = await self.run(lambda conn: conn.execute(sql, (seq,)).fetchone())
        return row[0] if row else None

    async def snapshot_seqs(self) -> list[int]:
        sql = "SELECT seq FROM snapshots ORDER BY seq"
        return [int(seq) for (seq,) in await self.run(lambda conn: conn.execute(sql).fetchall())]

    async def read_snapshot(self, seq: int) -> tuple[str, bytes] | None:
        sql = "SELECT digest, body FROM snapshots WHERE seq = %s"
        row = await self.run(lambda conn: conn.execute(sql, (seq,)).fetchone())
        return (str(row[0]), bytes(row[1])) if row else None

    async def tree_nodes(self, keys: Sequence[NodeKey]) -> dict[NodeKey, bytes]:
        if not keys:
            return {}
        levels, idxs = [k[0] for k in keys], [k[1] for k in keys]
        sql = (
            "SELECT n.level, n.idx, n.hash FROM tree_nodes AS n"
            " JOIN unnest(%s::int[], %s::bigint[]) AS k(level, idx)"
            " ON n.level = k.level AND n.idx = k.idx"
        )
        if not await self.run(lambda conn: _has_table(conn, "tree_nodes")):
            return {}
        rows = await self.run(lambda conn: conn.execute(sql, (levels, idxs)).fetchall())
        return {(int(lv), int(ix)): bytes(h) for lv, ix, h in rows}

    async def tree_heads(self) -> list[tuple[int, str]]:
        return await self.run(_tree_heads)


def _has_table(conn: psycopg.Connection[Any], name: str) -> bool:
    return name in _tables(conn)


def _tree_heads(conn: psycopg.Connection[Any]) -> list[tuple[int, str]]:
    if not _has_table(conn, "tree_heads"):
        return []
    rows = conn.execute("SELECT size, note FROM tree_heads ORDER BY size").fetchall()
    return [(int(size), str(note)) for size, note in rows]


class _Writer:
    """The one writer: its lease's connection and its own (methods run in a worker thread).

    No ``append_lazy``: every commit waits for the server's WAL flush. An asynchronous
    commit would be lost by a server restart, which the kernel rides out (its head would
    then be ahead of the journal's, and the journal fenced).
    """

    def __init__(
        self, location: str, lease: psycopg.Connection[Any], conn: psycopg.Connection[Any]
    ) -> None:
        self._location = location
        self._lease = lease
        self._conn = conn
        self.epoch = 0
        self.synchronous_off = False

    def append(
        self,
        rows: Sequence[Row],
        expected_seq: int,
        head: str,
        injected: bool,
        nodes: Sequence[Node] = (),
    ) -> None:
        try:
            self._append(rows, expected_seq, head, injected, nodes)
        except psycopg.Error as exc:
            if is_unreachable(exc):
                raise unreachable(self._location, exc) from None
            raise

    def probe(self) -> None:
        """Ask the server something, to learn while idle that it went away."""
        try:
            self._conn.execute("SELECT 1")
        except psycopg.Error as exc:
            raise unreachable(self._location, exc) from None

    def reconnect(self, expected_seq: int, pending: tuple[int, str] | None) -> bool:
        """Connect again and retake the lease; return whether ``pending`` had committed.

        Raises:
            JournalUnreachable: still away. JournalFenced: another kernel took the journal.
        """
        for each in (self._conn, self._lease):
            with contextlib.suppress(psycopg.Error):
                each.close()
        back = retake(self._location, _TRY_LEASE, self.epoch, expected_seq, pending)
        self._lease, self._conn, self.epoch = back.lease, back.conn, back.epoch
        if self.synchronous_off:
            self._conn.execute("SET synchronous_commit = off")
        return back.committed

    def _append(
        self,
        rows: Sequence[Row],
        expected_seq: int,
        head: str,
        injected: bool,
        nodes: Sequence[Node],
    ) -> None:
        new_seq = rows[-1][0]
        with self._conn.transaction(), self._conn.cursor() as cur:
            # The compare-and-set first: it also locks the head row for the transaction.
            cur.execute(
                "UPDATE journal_head SET seq = %s, value = %s"
                " WHERE id = 1 AND seq = %s AND epoch = %s",
                (new_seq, head, expected_seq, self.epoch),
            )
            if cur.rowcount != 1:
                raise JournalFenced(
                    self._location,
                    f"the head is no longer event {expected_seq} of epoch {self.epoch}:"
                    " another kernel took the journal's lease and wrote to it",
                )
            # Binary COPY: measured 1.4x text COPY and 2.1x executemany at 200 rows a batch.
            with cur.copy(_COPY) as copy:
                copy.set_types(_COPY_TYPES)
                for seq, type_, dfid, body, hash_ in rows:
                    # Bodies stay canonical JSON here, readable by SQL (a copy from SQLite
                    # brings compressed ones): see kernel.journal.codec.
                    copy.write_row((seq, type_, dfid, unpack(body), hash_))
            if nodes:
                cur.executemany(_NODE, nodes)
            cur.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(new_seq)))
            if injected:
                raise JournalWriteFailed(
                    self._location, "a write failed (injected by JournalFaults)"
                )

    def write_snapshot(self, seq: int, digest: str, body: bytes) -> None:
        try:
            self._conn.execute(
                "INSERT INTO snapshots (seq, digest, body) VALUES (%s, %s, %s)"
                " ON CONFLICT (seq) DO UPDATE SET digest = excluded.digest, body = excluded.body",
                (seq, digest, body),
            )
        except psycopg.Error as exc:
            raise pg_error(self._location, exc) from None

    def drop_snapshots(self, seqs: list[int]) -> None:
        try:
            self._conn.execute("DELETE FROM snapshots WHERE seq = ANY(%s)", (seqs,))
        except psycopg.Error as exc:
            raise pg_error(self._location, exc) from None

    def store_tree_head(self, size: int, note: str) -> None:
        try:
            self._conn.execute(
                "INSERT INTO tree_heads (size, note) VALUES (%s, %s)"
                " ON CONFLICT (size) DO UPDATE SET note = excluded.note",
                (size, note),
            )
        except psycopg.Error as exc:
            raise pg_error(self._location, exc) from None

    def adopt(self, journal_id: str) -> None:
        with self._conn.transaction():
            if self._conn.execute("SELECT 1 FROM events LIMIT 1").fetchone() is not None:
                raise JournalError(self._location, "holds events: its id is not changed")
            self._conn.execute("UPDATE meta SET value = %s WHERE key = 'journal_id'", (journal_id,))

    def close(self) -> None:
        self._conn.close()
        self._lease.close()  # the session ends: the lease is free for a standby


def _tables(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
    ).fetchall()
    return {str(name) for (name,) in rows}


def _read_meta(conn: psycopg.Connection[Any], location: str) -> dict[str, str] | None:
    """Return the journal's meta with its head record as ``head``; None for a blank schema."""
    tables = _tables(conn)
    if not tables:
        return None
    if not _TABLES <= tables:
        raise JournalForeign(
            location,
            f"a database schema of something else (tables {', '.join(sorted(tables)[:8])};"
            " a journal has meta, events and journal_head)",
        )
    meta: dict[str, Any] = {str(k): v for k, v in conn.execute("SELECT key, value FROM meta")}
    row = conn.execute("SELECT value FROM journal_head WHERE id = 1").fetchone()
    if row is not None:
        meta["head"] = row[0]
    return check_meta(meta, location)


def _last_rows(conn: psycopg.Connection[Any]) -> list[Any]:
    return conn.execute(f"{_ROWS} ORDER BY seq DESC LIMIT 2").fetchall()


def _open_writer(
    conn: psycopg.Connection[Any], location: str, chain_key: bytes | None, synchronous: str
) -> tuple[Head, bool, int, Frontier]:
    """Under the lease: create or check the journal, bump the epoch; return head, keyed, epoch."""
    if synchronous in ("OFF", "NORMAL"):
        conn.execute("SET synchronous_commit = off")
    with conn.transaction():
        meta = _read_meta(conn, location)
        if meta is None:
            journal_id = str(uuid.uuid4())
            conn.execute(SCHEMA)
            meta = {"schema_version": SCHEMA_VERSION, "journal_id": journal_id, "tree": TREE_MARK}
            for key, value in meta.items():
                conn.execute("INSERT INTO meta (key, value) VALUES (%s, %s)", (key, value))
            meta["head"] = head_value(0, GENESIS_HASH)
            conn.execute(
                "INSERT INTO journal_head (id, seq, value, epoch) VALUES (1, 0, %s, 0)",
                (meta["head"],),
            )
        last = _last_rows(conn)
        journal_id, head, keyed = check_state(meta, last, location, chain_key, readonly=False)
        # It is about to hold rows an older kernel cannot read (kernel.journal._meta).
        conn.execute(
            "UPDATE meta SET value = %s WHERE key = 'schema_version'"
            " AND value IN ('1', '2', '3', '4')",
            (SCHEMA_VERSION,),
        )
        if chain_key is not None and not last:
            # A journal without events: from its first event on, hashes are HMACs.
            for key, value in (("chain", KEYED_CHAIN), ("chain_key_id", chain_key_id(chain_key))):
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES (%s, %s)"
                    " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (key, value),
                )
            conn.execute(
                "UPDATE journal_head SET value = %s WHERE id = 1",
                (head_value(0, GENESIS_HASH, chain_key),),
            )
        # The fence: a writer of an earlier epoch can no longer move the head.
        row = conn.execute(
            "UPDATE journal_head SET epoch = epoch + 1 WHERE id = 1 RETURNING epoch, seq"
        ).fetchone()
        assert row is not None
        if int(row[1]) != head.seq:
            raise JournalFenced(location, "the head moved while the journal was opened")
        tree = _writer_tree(conn, location, meta, head.seq)
    return head, keyed, int(row[0]), tree


def _writer_tree(
    conn: psycopg.Connection[Any], location: str, meta: dict[str, str], size: int
) -> Frontier:
    """Return the tree's frontier at ``size`` events, building an old journal's tree first."""
    conn.execute(TREE_SCHEMA)
    if meta.get("tree") != TREE_MARK:
        # A journal from before trees: built once, from every event, under the lease.
        builder = TreeBuilder()
        conn.execute("DELETE FROM tree_nodes")
        with conn.cursor(name="tree_build") as cur:
            cur.execute("SELECT body FROM events ORDER BY seq")
            for (body,) in cur:
                builder.add(unpack(bytes(body)))
        if builder.nodes:
            with conn.cursor() as cur:
                cur.executemany(_NODE, builder.nodes)
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('tree', %s)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (TREE_MARK,),
        )
        return builder.frontier
    keys = frontier_keys(size)
    nodes: dict[NodeKey, bytes] = {}
    for level, idx in keys:
        found = conn.execute(
            "SELECT hash FROM tree_nodes WHERE level = %s AND idx = %s", (level, idx)
        ).fetchone()
        if found is not None:
            nodes[(level, idx)] = bytes(found[0])
    tail = [
        leaf_hash(unpack(bytes(body)))
        for (body,) in conn.execute(
            "SELECT body FROM events WHERE seq > %s ORDER BY seq", (aligned(size),)
        ).fetchall()
    ]
    try:
        return frontier_from(size, nodes, tail)[0]
    except LookupError as exc:
        raise JournalError(
            location, f"its Merkle tree is damaged: {exc} (run dirk verify)"
        ) from None


def _read_state(
    conn: psycopg.Connection[Any], location: str, chain_key: bytes | None
) -> tuple[Head, bool, bool]:
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        meta = _read_meta(conn, location)
        if meta is None:
            raise JournalForeign(location, "an empty database, not a journal")
        _, head, keyed = check_state(meta, _last_rows(conn), location, chain_key, readonly=True)
    return head, keyed, meta.get("tree") == TREE_MARK


async def _take_lease(location: str) -> psycopg.Connection[Any]:
    """Connect and wait for the journal's writer lease (a standby waits here)."""
    lease = await anyio.to_thread.run_sync(connect, location)
    try:
        await anyio.to_thread.run_sync(lease.execute, _LEASE, abandon_on_cancel=True)
    except psycopg.Error as exc:
        lease.close()
        raise pg_error(location, exc) from None
    except BaseException:
        # Cancelled while waiting: end the wait in the server, then the session.
        with contextlib.suppress(psycopg.Error):
            lease.cancel_safe()
        lease.close()
        raise
    return lease


async def open_store(
    location: str,
    *,
    readonly: bool,
    synchronous: str,
    chain_key: bytes | None,
    compress: bool = True,
) -> OpenedStore:
    """Open the journal at the URL ``location`` (see ``open_journal``); bodies stay JSON."""
    reader_conn = await anyio.to_thread.run_sync(connect, location)
    reader = _Reader(location, reader_conn)
    lease: psycopg.Connection[Any] | None = None
    conn: psycopg.Connection[Any] | None = None
    try:
        if readonly:
            head, keyed, built = await reader.run(lambda c: _read_state(c, location, chain_key))
            return OpenedStore(reader, None, head, keyed, None, built)
        lease = await _take_lease(location)
        conn = await anyio.to_thread.run_sync(connect, location)
        writer = _Writer(location, lease, conn)
        writer.synchronous_off = synchronous in ("OFF", "NORMAL")
        session = _Session(location, conn)
        head, keyed, writer.epoch, tree = await session.run(
            lambda c: _open_writer(c, location, chain_key, synchronous)
        )
        return OpenedStore(reader, writer, head, keyed, tree, True)
    except BaseException:
        with anyio.CancelScope(shield=True):
            for each in (conn, lease):
                if each is not None:
                    await anyio.to_thread.run_sync(each.close)
            await reader.aclose()
        raise


class _Snapshot(_Session):
    async def meta(self) -> dict[str, str] | None:
        return await self.run(lambda conn: _read_meta(conn, self._location))

    async def rows_from(self, start: int, limit: int) -> list[Row]:
        sql = f"{_ROWS} WHERE seq >= %s ORDER BY seq LIMIT %s"
        return await self.run(lambda conn: conn.execute(sql, (start, limit)).fetchall())

    async def tree_levels(self) -> list[int]:
        def levels(conn: psycopg.Connection[Any]) -> list[int]:
            if not _has_table(conn, "tree_nodes"):
                return []
            rows = conn.execute("SELECT DISTINCT level FROM tree_nodes ORDER BY level")
            return [int(lv) for (lv,) in rows.fetchall()]

        return await self.run(levels)

    async def tree_nodes_from(self, level: int, after: int, limit: int) -> list[Node]:
        sql = (
            "SELECT level, idx, hash FROM tree_nodes WHERE level = %s AND idx > %s"
            " ORDER BY idx LIMIT %s"
        )
        rows = await self.run(lambda conn: conn.execute(sql, (level, after, limit)).fetchall())
        return [(int(lv), int(ix), bytes(h)) for lv, ix, h in rows]

    async def tree_heads(self) -> list[tuple[int, str]]:
        return await self.run(_tree_heads)


@contextlib.asynccontextmanager
async def open_snapshot(location: str) -> AsyncIterator[_Snapshot]:
    """Open one repeatable-read, read-only transaction on the journal at ``location``."""
    conn = await anyio.to_thread.run_sync(lambda: connect(location, autocommit=False))
    snapshot = _Snapshot(location, conn)
    try:
        await snapshot.run(
            lambda c: c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        )
        yield snapshot
    finally:
        with anyio.CancelScope(shield=True):
            await snapshot.aclose()
