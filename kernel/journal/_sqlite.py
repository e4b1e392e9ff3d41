"""The SQLite store: a journal in one file, the default and the README's first command.

One writer connection (plain sqlite3, used from the writer's worker thread,
:mod:`kernel.journal._sqlite_writer`) and one reader (aiosqlite); with WAL, reads never
wait for a commit. seq is the primary key, so a second writer on the same file fails at
its insert instead of forking the chain. The head record is ``meta.head``.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite
import anyio

from kernel.core.events import GENESIS_HASH
from kernel.core.merkle import Frontier
from kernel.journal._meta import check_meta, check_state
from kernel.journal._sqlite_errors import BUSY_TIMEOUT_S, SQLITE_ERRORS, sqlite_error
from kernel.journal._sqlite_writer import APPLICATION_ID, TREE, Writer, open_writer
from kernel.journal.errors import JournalError, JournalForeign
from kernel.journal.head import Row
from kernel.journal.port import EventRow, Head, OpenedStore
from kernel.journal.tree import TREE_MARK, Node, NodeKey

__all__ = ["APPLICATION_ID", "SYNCHRONOUS", "add_tree_head", "open_snapshot", "open_store"]

SYNCHRONOUS = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
"""The values ``open_journal(synchronous=)`` takes (SQLite's ``PRAGMA synchronous``)."""

ROWS = "SELECT seq, type, dfid, body, hash FROM events"
# prev_hash comes from the row before; a NULL there means seq 1 (genesis) or a missing row.
_EVENTS = (
    "SELECT e.seq, e.body, e.hash, p.hash FROM events AS e"
    " LEFT JOIN events AS p ON p.seq = e.seq - 1 WHERE e.seq >= ?"
)
# The same rows without the join for the previous hash (NULL): what a scan reads
# (Journal.scan), which checks the chain through consecutive rows itself.
_BODIES = "SELECT e.seq, e.body, e.hash, NULL FROM events AS e WHERE e.seq >= ?"


class _Reader:
    """The reads of a journal file, on one aiosqlite connection."""

    def __init__(self, path: str, db: aiosqlite.Connection) -> None:
        self._path = path
        self._db = db

    async def _query(self, sql: str, params: Sequence[Any]) -> Iterable[Any]:
        try:
            return await self._db.execute_fetchall(sql, params)
        except SQLITE_ERRORS as exc:
            raise sqlite_error(self._path, exc) from exc

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
            sql.append("AND e.seq < ?")
            params.append(stop)
        if dfid is not None:
            sql.append("AND e.dfid = ?")
            params.append(dfid)
        if types is not None:
            sql.append(f"AND e.type IN ({', '.join('?' * len(types))})")
            params += types
        sql.append("ORDER BY e.seq")
        if limit is not None:
            sql.append("LIMIT ?")
            params.append(limit)
        return list(await self._query(" ".join(sql), params))

    async def rows(self, start: int, last: int, limit: int) -> list[Row]:
        sql = f"{ROWS} WHERE seq >= ? AND seq <= ? ORDER BY seq LIMIT ?"
        return list(await self._query(sql, [start, last, limit]))

    async def hash_at(self, seq: int) -> bytes | None:
        rows = list(await self._query("SELECT hash FROM events WHERE seq = ?", [seq]))
        return rows[0][0] if rows and isinstance(rows[0][0], bytes) else None

    async def snapshot_seqs(self) -> list[int]:
        try:
            rows = await self._query("SELECT seq FROM snapshots ORDER BY seq", [])
        except JournalError as exc:
            if "no such table" in exc.detail:
                return []
            raise
        return [int(seq) for (seq,) in rows]

    async def read_snapshot(self, seq: int) -> tuple[str, bytes] | None:
        try:
            rows = list(
                await self._query("SELECT digest, body FROM snapshots WHERE seq = ?", [seq])
            )
        except JournalError as exc:
            if "no such table" in exc.detail:
                return None
            raise
        return (str(rows[0][0]), bytes(rows[0][1])) if rows else None

    async def tree_nodes(self, keys: Sequence[NodeKey]) -> dict[NodeKey, bytes]:
        return await tree_nodes_of(self._query, keys)

    async def tree_heads(self) -> list[tuple[int, str]]:
        return await tree_heads_of(self._query)

    async def aclose(self) -> None:
        await self._db.close()


async def tree_nodes_of(query: Any, keys: Sequence[NodeKey]) -> dict[NodeKey, bytes]:
    """Return the stored tree nodes among ``keys`` (absent ones are left out)."""
    found: dict[NodeKey, bytes] = {}
    for at in range(0, len(keys), 200):
        chunk = keys[at : at + 200]
        where = " OR ".join("(level = ? AND idx = ?)" for _ in chunk)
        params = [x for key in chunk for x in key]
        try:
            rows = await query(f"SELECT level, idx, hash FROM tree_nodes WHERE {where}", params)
        except JournalError as exc:
            if "no such table" in exc.detail:
                return found
            raise
        found.update({(int(lv), int(ix)): bytes(h) for lv, ix, h in rows})
    return found


async def tree_heads_of(query: Any) -> list[tuple[int, str]]:
    """Return the stored signed checkpoints (size, note), smallest first."""
    try:
        rows = await query("SELECT size, note FROM tree_heads ORDER BY size", [])
    except JournalError as exc:
        if "no such table" in exc.detail:
            return []
        raise
    return [(int(size), str(note)) for size, note in rows]


async def open_store(
    location: str,
    *,
    readonly: bool,
    synchronous: str,
    chain_key: bytes | None,
    compress: bool = True,
) -> OpenedStore:
    """Open the journal file at ``location`` (see :func:`kernel.journal.opening.open_journal`)."""
    path = location
    db = await connect(path, readonly=readonly)
    writer: Writer | None = None
    try:
        try:
            # One read transaction: a kernel appending meanwhile moves rows and head record
            # together, so they are seen together. Ended before the writer may create the schema.
            await db.execute("BEGIN")
            journal_id, head, keyed, tree_built = await _read_state(db, path, chain_key, readonly)
        except SQLITE_ERRORS as exc:
            raise sqlite_error(path, exc) from exc
        finally:
            with contextlib.suppress(*SQLITE_ERRORS):
                await db.rollback()
        tree: Frontier | None = None
        if not readonly:
            try:
                conn, created_id, tree = await anyio.to_thread.run_sync(
                    open_writer,
                    path,
                    synchronous,
                    journal_id,
                    chain_key if keyed else None,
                    head.seq,
                )
            except SQLITE_ERRORS as exc:
                raise sqlite_error(path, exc) from exc
            writer = Writer(path, conn, compress, synchronous.upper())
            head = head._replace(journal_id=created_id)
            tree_built = True
    except BaseException:
        with anyio.CancelScope(shield=True):
            await db.close()
        raise
    return OpenedStore(_Reader(path, db), writer, head, keyed, tree, tree_built)


def _sqlite_connect(path: str, readonly: bool) -> sqlite3.Connection:
    target = Path(path).absolute().as_uri() + "?mode=ro" if readonly else path
    return sqlite3.connect(target, uri=readonly, check_same_thread=False)


async def connect(path: str, *, readonly: bool) -> aiosqlite.Connection:
    """Open an aiosqlite connection for reading ``path``."""
    try:
        conn = await anyio.to_thread.run_sync(_sqlite_connect, path, readonly)
    except SQLITE_ERRORS as exc:
        raise sqlite_error(path, exc) from exc
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
    except SQLITE_ERRORS as exc:
        raise sqlite_error(path, exc) from exc
    return check_meta(meta, path)


async def _read_state(
    db: aiosqlite.Connection, path: str, chain_key: bytes | None, readonly: bool
) -> tuple[str | None, Head, bool, bool]:
    """Return the journal's id (None: a blank file), checked head, whether it is keyed, and
    whether it keeps a Merkle tree."""
    meta = await _inspect(db, path)
    if meta is None:
        if readonly:
            raise JournalForeign(path, "an empty database, not a journal")
        return None, Head("", 0, GENESIS_HASH), chain_key is not None, True
    try:
        last = list(await db.execute_fetchall(f"{ROWS} ORDER BY seq DESC LIMIT 2"))
    except SQLITE_ERRORS as exc:
        raise sqlite_error(path, exc) from exc
    journal_id, head, keyed = check_state(meta, last, path, chain_key, readonly)
    return journal_id, head, keyed, meta.get("tree") == TREE_MARK


class _Snapshot:
    """One read transaction over a journal file, for verify and copy."""

    def __init__(self, path: str, db: aiosqlite.Connection) -> None:
        self._path = path
        self._db = db

    async def meta(self) -> dict[str, str] | None:
        return await _inspect(self._db, self._path)

    async def rows_from(self, start: int, limit: int) -> list[Row]:
        query = f"{ROWS} WHERE seq >= ? ORDER BY seq LIMIT ?"
        try:
            return list(await self._db.execute_fetchall(query, (start, limit)))  # type: ignore[arg-type]
        except SQLITE_ERRORS as exc:
            raise sqlite_error(self._path, exc) from exc

    async def _query(self, sql: str, params: Sequence[Any]) -> Iterable[Any]:
        try:
            return await self._db.execute_fetchall(sql, params)
        except SQLITE_ERRORS as exc:
            raise sqlite_error(self._path, exc) from exc

    async def tree_nodes_from(self, level: int, after: int, limit: int) -> list[Node]:
        """Return stored nodes of ``level`` with index > ``after``, in order."""
        sql = (
            "SELECT level, idx, hash FROM tree_nodes WHERE level = ? AND idx > ?"
            " ORDER BY idx LIMIT ?"
        )
        try:
            rows = await self._query(sql, [level, after, limit])
        except JournalError as exc:
            if "no such table" in exc.detail:
                return []
            raise
        return [(int(lv), int(ix), bytes(h)) for lv, ix, h in rows]

    async def tree_levels(self) -> list[int]:
        """Return the levels that hold stored nodes."""
        try:
            rows = await self._query("SELECT DISTINCT level FROM tree_nodes ORDER BY level", [])
        except JournalError as exc:
            if "no such table" in exc.detail:
                return []
            raise
        return [int(lv) for (lv,) in rows]

    async def tree_heads(self) -> list[tuple[int, str]]:
        return await tree_heads_of(self._query)


@contextlib.asynccontextmanager
async def open_snapshot(location: str) -> AsyncIterator[_Snapshot]:
    """Open the journal file at ``location`` read-only, in one read transaction."""
    db = await connect(location, readonly=True)
    try:
        try:
            # One read transaction: rows and head record as of one moment, even while a
            # kernel appends.
            await db.execute("BEGIN")
        except SQLITE_ERRORS as exc:
            raise sqlite_error(location, exc) from exc
        yield _Snapshot(location, db)
    finally:
        with anyio.CancelScope(shield=True):
            await db.close()


def add_tree_head(location: str, size: int, note: str) -> None:
    """Keep a signed checkpoint beside the journal's events, from outside its writer.

    ``dirk checkpoint`` and ``dirk witness`` do this while a kernel may be running: only
    the ``tree_heads`` table is written (never an event), so its writer is not
    disturbed. A checkpoint of a size already kept gets the new signature lines added.

    Raises:
        JournalError: the file cannot be written.
        NoteError: ``note`` signs another checkpoint than the one kept for ``size``.
    """
    from kernel.core.notes import merge

    try:
        with contextlib.closing(
            sqlite3.connect(location, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        ) as conn:
            conn.executescript(TREE)  # a journal no kernel of this version opened yet
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute("SELECT note FROM tree_heads WHERE size = ?", (size,)).fetchone()
            merged = note if row is None else merge(str(row[0]), note)
            conn.execute(
                "INSERT OR REPLACE INTO tree_heads (size, note) VALUES (?, ?)", (size, merged)
            )
            conn.execute("COMMIT")
    except SQLITE_ERRORS as exc:
        raise sqlite_error(location, exc) from exc
