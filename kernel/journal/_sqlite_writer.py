"""The one writer of a journal file, and the WAL's checkpoints beside it.

:class:`Writer` runs every transaction on a plain sqlite3 connection, one call at a
time in the journal writer's worker thread (kernel.journal.store). SQLite's own
checkpoint, run by whichever commit takes the WAL past 1,000 pages, is off for the
commits that sync nothing of their own (a read-only kind's, ``Storage.group_reads``):
it cost the call that reached it 3-6 ms (it syncs the WAL, copies the pages into the
database and syncs that), which was the whole p99 of such calls (docs/benchmarks.md,
issue 45). The journal runs :meth:`Writer.upkeep` for them instead, in a thread of
its own on a connection of its own: a passive checkpoint, which never holds the
writer up. A synced commit keeps SQLite's checkpoint: it waits on a sync anyway, and
a checkpoint syncing beside it slowed it more (P16's p99 1.6x).

What is durable stays exactly as before: a synced commit is on disk when ``append``
returns, an unsynced one once a later commit syncs the WAL, or a checkpoint does.
A checkpoint only moves committed pages into the database, syncing the WAL first
and the database after (at ``synchronous = NORMAL`` or above, as SQLite's own).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import uuid
from collections.abc import Sequence
from typing import Any

from kernel.core.events import GENESIS_HASH, chain_key_id
from kernel.core.merkle import Frontier, leaf_hash
from kernel.journal._meta import SCHEMA_VERSION
from kernel.journal._sqlite_errors import SQLITE_ERRORS, sqlite_error
from kernel.journal._sqlite_inbox import ensure_inbox
from kernel.journal.codec import BodyPacker, unpack
from kernel.journal.errors import JournalCorrupt, JournalError
from kernel.journal.head import KEYED_CHAIN, Row, head_value
from kernel.journal.tree import (
    TREE_MARK,
    Node,
    NodeKey,
    TreeBuilder,
    aligned,
    frontier_from,
    frontier_keys,
)

log = logging.getLogger(__name__)

APPLICATION_ID = 0x44495231
"""``PRAGMA application_id`` of every journal ("DIR1"), so foreign SQLite files are recognised."""

AUTOCHECKPOINT_PAGES = 1_000
"""SQLite's own checkpoint, run by the synced commit that takes the WAL past this many pages."""
CHECKPOINT_PAGES = 512
"""About this many WAL pages written by unsynced commits start upkeep's next checkpoint."""
RESTART_PAGES = 4_096
"""A WAL of this many pages that no checkpoint emptied is emptied by the writer itself."""
_TRIES = 4
"""Passive checkpoints in a row, each of what the writer committed during the one before."""

_SCHEMA = f"""
PRAGMA application_id = {APPLICATION_ID};
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE events (
    seq INTEGER PRIMARY KEY, type TEXT NOT NULL, dfid TEXT, body BLOB NOT NULL, hash BLOB NOT NULL
);
CREATE INDEX events_dfid ON events (dfid) WHERE dfid IS NOT NULL;
CREATE INDEX events_type ON events (type);
"""
# The Merkle tree's stored subtrees and the signed checkpoints (kernel.journal.tree).
TREE = """
CREATE TABLE IF NOT EXISTS tree_nodes (
    level INTEGER NOT NULL, idx INTEGER NOT NULL, hash BLOB NOT NULL, PRIMARY KEY (level, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tree_heads (size INTEGER PRIMARY KEY, note TEXT NOT NULL);
"""
_NODE = "INSERT OR REPLACE INTO tree_nodes (level, idx, hash) VALUES (?, ?, ?)"
# Snapshots of the projected state live beside the events, never in the hash chain: each
# is only trusted if it hashes to a ProjectionCheckpoint recorded in the chain.
_SNAPSHOTS = (
    "CREATE TABLE IF NOT EXISTS snapshots"
    " (seq INTEGER PRIMARY KEY, digest TEXT NOT NULL, body BLOB NOT NULL)"
)
_INSERT = "INSERT INTO events (seq, type, dfid, body, hash) VALUES (?, ?, ?, ?, ?)"
# The head record (kernel.journal.head), rewritten in each append's transaction.
_HEAD = "INSERT OR REPLACE INTO meta (key, value) VALUES ('head', ?)"
_CHECKPOINT = "PRAGMA wal_checkpoint(PASSIVE)"


class Writer:
    """The one writer of a journal file (its methods run in a worker thread)."""

    def __init__(
        self, path: str, conn: sqlite3.Connection, compress: bool = True, synchronous: str = "FULL"
    ) -> None:
        self._path = path
        self._conn = conn
        self._packer = BodyPacker() if compress else None
        self._synchronous = synchronous
        # The checkpoints' connection, opened by the first; only upkeep() uses it.
        self._checkpoints: sqlite3.Connection | None = None
        # Each counter is moved by one thread only: the writer's, or upkeep's.
        self._commits = 0
        self._writing = False
        """In a transaction (its reads began before any checkpoint it overlaps)."""
        self._pages = 0
        """WAL pages written, estimated: the writer's thread moves it."""
        self._pages_checked = 0
        """``_pages`` when the last checkpoint began: upkeep's thread moves it."""
        self._restart = False
        """Set by upkeep when its checkpoints could not empty a long WAL."""

    def append_lazy(self, *args: Any) -> None:
        """:meth:`append` without a sync of its own (group commit, kernel.journal.port)."""
        self.append(*args, sync=False)

    def append(
        self,
        rows: Sequence[Row],
        expected_seq: int,
        head: str,
        injected: bool,
        nodes: Sequence[Node] = (),
        *,
        sync: bool = True,
    ) -> None:
        """Insert ``rows``, their tree ``nodes`` and the head record in one transaction.

        seq is the primary key, so a second writer on the same file fails here instead
        of forking the chain. ``sync=False``: WAL at ``synchronous = NORMAL`` for this
        commit, safe from a killed process, durable with the next synced commit.
        """
        conn = self._conn
        if self._restart:
            # What upkeep's checkpoints left: a few pages, after which this transaction
            # writes the WAL from its start again. Tried again next time if upkeep's own
            # checkpoint was running.
            self._restart = self._checkpoint(conn) is None
        lazy = not sync and self._synchronous in ("FULL", "EXTRA")
        stored = self._stored(rows)
        if lazy:
            # Nor SQLite's checkpoint, which the commit reaching 1,000 pages would run:
            # upkeep runs one beside. A synced commit keeps it (it waits on a sync anyway;
            # a checkpoint beside it, syncing too, slowed P16's p99 1.6x here).
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA wal_autocheckpoint = 0")
        self._writing = True
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(_INSERT, stored)
            if nodes:
                conn.executemany(_NODE, nodes)
            conn.execute(_HEAD, (head,))
            if injected:
                raise sqlite3.OperationalError("disk I/O error (injected by JournalFaults)")
            conn.execute("COMMIT")
        except BaseException:
            _roll_back(conn)
            raise
        finally:
            self._writing = False
            if lazy:
                conn.execute(f"PRAGMA synchronous = {self._synchronous}")
                conn.execute(f"PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT_PAGES}")
        self._commits += 1
        if lazy:
            # A page per row and per table or index a transaction touches, about.
            self._pages += 3 + len(rows) + len(nodes) // 16

    def _stored(self, rows: Sequence[Row]) -> Sequence[Row]:
        """``rows`` as stored: compressed here, in the writer's thread (the codecs let go
        of the GIL while they work)."""
        packer = self._packer
        if packer is None:
            return rows
        return [
            (seq, type_, dfid, packer.pack(body), hash_) for seq, type_, dfid, body, hash_ in rows
        ]

    @property
    def upkeep_due(self) -> bool:
        """Whether enough was written since the last checkpoint to run :meth:`upkeep`."""
        return self._pages - self._pages_checked >= CHECKPOINT_PAGES

    def upkeep(self) -> None:
        """Checkpoint the WAL on a connection of its own, without holding the writer up.

        A passive checkpoint copies what was committed when it began. What the writer
        committed meanwhile is copied by the next, shorter, up to a few times: once one
        copied the whole WAL while the writer stood still, the writer's next transaction
        writes the WAL from its beginning again (SQLite restarts a WAL wholly copied). A
        WAL still :data:`RESTART_PAGES` long after that is emptied by the writer: its
        next transaction checkpoints the few pages left first. Never raises: a failed
        checkpoint loses nothing (the WAL keeps every commit) and is tried again later.
        """
        if self._restart:
            return  # the writer's next transaction checkpoints: a second would stop it
        conn = self._checkpointing()
        if conn is None:
            return
        pages = 0
        for _ in range(_TRIES):
            commits, still = self._commits, not self._writing
            self._pages_checked = self._pages
            done = self._checkpoint(conn)
            if done is None:
                return  # the writer is checkpointing (or it failed): nothing to add
            copied, pages = done
            if copied and still and not self._writing and self._commits == commits:
                break
        if pages >= RESTART_PAGES:
            self._restart = True

    def _checkpointing(self) -> sqlite3.Connection | None:
        """Upkeep's own connection, opened the first time (None: it cannot be opened)."""
        if self._checkpoints is None:
            try:
                self._checkpoints = _checkpoint_connection(self._path, self._synchronous)
            except sqlite3.Error as exc:
                log.warning("the journal's WAL cannot be checkpointed: %s", exc)
        return self._checkpoints

    def _checkpoint(self, conn: sqlite3.Connection) -> tuple[bool, int] | None:
        """Run a passive checkpoint; return whether it copied the whole WAL, and its pages.

        None: another checkpoint was running, or this one failed.
        """
        try:
            busy, pages, copied = conn.execute(_CHECKPOINT).fetchone()
        except sqlite3.Error as exc:
            log.warning("the journal's WAL could not be checkpointed: %s", exc)
            return None
        return None if busy else (copied == pages, int(pages))

    def write_snapshot(self, seq: int, digest: str, body: bytes) -> None:
        try:
            self._conn.execute(
                "INSERT OR REPLACE INTO snapshots (seq, digest, body) VALUES (?, ?, ?)",
                (seq, digest, body),
            )
        except SQLITE_ERRORS as exc:
            raise sqlite_error(self._path, exc) from exc

    def drop_snapshots(self, seqs: list[int]) -> None:
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany("DELETE FROM snapshots WHERE seq = ?", [(seq,) for seq in seqs])
                conn.execute("COMMIT")
            except BaseException:
                _roll_back(conn)
                raise
        except SQLITE_ERRORS as exc:
            raise sqlite_error(self._path, exc) from exc

    def store_tree_head(self, size: int, note: str) -> None:
        try:
            self._conn.execute(
                "INSERT OR REPLACE INTO tree_heads (size, note) VALUES (?, ?)", (size, note)
            )
        except SQLITE_ERRORS as exc:
            raise sqlite_error(self._path, exc) from exc

    def adopt(self, journal_id: str) -> None:
        if not has_no_events(self._conn):
            raise JournalError(self._path, "holds events: its id is not changed")
        self._conn.execute("UPDATE meta SET value = ? WHERE key = 'journal_id'", (journal_id,))

    def close(self) -> None:
        # The journal ran its last upkeep before this (kernel.journal.opening).
        if self._checkpoints is not None:
            self._checkpoints.close()
        self._conn.close()


def _checkpoint_connection(path: str, synchronous: str) -> sqlite3.Connection:
    # Its synchronous is the writer's: it is what syncs the WAL and the database around
    # the copy (OFF: neither, as the writer's own commits).
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    return conn


def open_writer(
    path: str, synchronous: str, journal_id: str | None, key: bytes | None, size: int
) -> tuple[sqlite3.Connection, str, Frontier]:
    """Open the writer's connection, creating the schema if ``journal_id`` is None (blank file).

    ``key`` is the chain key of a keyed journal (checked against an existing one before).
    """
    # check_same_thread is off because anyio's worker threads take turns; only the
    # writer task ever uses this connection, one call at a time.
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        # SQLite's default cache_spill stays: a group commit past the page cache (2 MiB) spills
        # into the WAL and may read frames back to rewrite their checksums (P1: ~0.5 KB a
        # flow, page-cache hits, no CPU measured). Not spilling removed those reads but held
        # every dirty page of the largest transaction in memory: P8's RSS growth 0.03-0.05
        # -> 0.09 (docs/benchmarks.md, lever 6).
        if journal_id is None:
            journal_id = str(uuid.uuid4())
            conn.executescript(
                f"BEGIN IMMEDIATE; {_SCHEMA} INSERT INTO meta (key, value) VALUES"
                f" ('schema_version', '{SCHEMA_VERSION}'), ('journal_id', '{journal_id}'),"
                f" ('head', '{head_value(0, GENESIS_HASH)}'), ('tree', '{TREE_MARK}'); COMMIT;"
            )
        else:
            # It is about to hold rows an older kernel cannot read (kernel.journal._meta).
            conn.execute(
                "UPDATE meta SET value = ? WHERE key = 'schema_version'"
                " AND value IN ('1', '2', '3', '4')",
                (SCHEMA_VERSION,),
            )
        if key is not None and has_no_events(conn):
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
        ensure_inbox(conn)
        conn.execute(_SNAPSHOTS)
        tree = _writer_tree(conn, size)
    except BaseException:
        conn.close()
        raise
    return conn, journal_id, tree


def _writer_tree(conn: sqlite3.Connection, size: int) -> Frontier:
    """Return the tree's frontier at ``size`` events, building the tree of an old journal first."""
    conn.executescript(TREE)
    marked = conn.execute("SELECT 1 FROM meta WHERE key = 'tree' AND value = ?", (TREE_MARK,))
    if marked.fetchone() is None:
        # A journal from before trees: built once, from every event, in one transaction.
        builder = TreeBuilder()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM tree_nodes")
            for (body,) in conn.execute("SELECT body FROM events ORDER BY seq"):
                builder.add(unpack(body))
            conn.executemany(_NODE, builder.nodes)
            conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('tree', ?)", (TREE_MARK,)
            )
            conn.execute("COMMIT")
        except BaseException:
            _roll_back(conn)
            raise
        if builder.frontier.size != size:
            raise JournalCorrupt(path_of(conn), "its events changed while its tree was built")
        return builder.frontier
    keys = frontier_keys(size)
    nodes: dict[NodeKey, bytes] = {}
    for level, idx in keys:
        row = conn.execute(
            "SELECT hash FROM tree_nodes WHERE level = ? AND idx = ?", (level, idx)
        ).fetchone()
        if row is not None:
            nodes[(level, idx)] = bytes(row[0])
    tail = [
        leaf_hash(unpack(body))
        for (body,) in conn.execute(
            "SELECT body FROM events WHERE seq > ? ORDER BY seq", (aligned(size),)
        )
    ]
    try:
        return frontier_from(size, nodes, tail)[0]
    except LookupError as exc:
        raise JournalCorrupt(
            path_of(conn), f"its Merkle tree is damaged: {exc} (run dirk verify)"
        ) from None


def path_of(conn: sqlite3.Connection) -> str:
    """Return the file a connection is open on."""
    row = conn.execute("PRAGMA database_list").fetchone()
    return str(row[2]) if row else "?"


def has_no_events(conn: sqlite3.Connection) -> bool:
    """Whether the journal ``conn`` is open on holds no event."""
    return conn.execute("SELECT 1 FROM events LIMIT 1").fetchone() is None


def _roll_back(conn: sqlite3.Connection) -> None:
    """Roll back a transaction a failure left open (a failing rollback adds nothing)."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
