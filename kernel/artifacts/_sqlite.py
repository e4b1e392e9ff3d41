"""The SQLite artifact store: one table in a file of its own, beside the journal's.

The standard library's driver in a worker thread, one call at a time, as the
journal's writer works; WAL, so readers in other processes (``dirk verify``) never
wait for a put.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio

from kernel.artifacts.port import ArtifactStoreError, checked, is_ref, ref_of

SCHEMA = """
CREATE TABLE IF NOT EXISTS artifacts (
    ref TEXT PRIMARY KEY, size INTEGER NOT NULL, body BLOB NOT NULL
)
"""
T = TypeVar("T")


class SqliteArtifacts:
    """Artifacts in a SQLite file (see the module docstring)."""

    def __init__(self, location: str, conn: sqlite3.Connection) -> None:
        self.location = location
        self._conn = conn
        self._limiter = anyio.CapacityLimiter(1)

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(fn, self._conn, limiter=self._limiter)
        except sqlite3.Error as exc:
            raise ArtifactStoreError(self.location, f"cannot be used ({exc})") from None

    async def put(self, data: bytes) -> str:
        raw = checked(data)
        ref = ref_of(raw)

        def insert(conn: sqlite3.Connection) -> None:
            with conn:
                conn.execute(
                    "INSERT OR IGNORE INTO artifacts (ref, size, body) VALUES (?, ?, ?)",
                    (ref, len(raw), raw),
                )

        await self._run(insert)
        return ref

    async def get(self, ref: str) -> bytes | None:
        if not is_ref(ref):
            return None
        row = await self._run(
            lambda c: c.execute("SELECT body FROM artifacts WHERE ref = ?", (ref,)).fetchone()
        )
        return bytes(row[0]) if row is not None else None

    async def size(self, ref: str) -> int | None:
        if not is_ref(ref):
            return None
        row = await self._run(
            lambda c: c.execute("SELECT size FROM artifacts WHERE ref = ?", (ref,)).fetchone()
        )
        return int(row[0]) if row is not None else None

    async def delete(self, ref: str) -> bool:
        if not is_ref(ref):
            return False

        def remove(conn: sqlite3.Connection) -> bool:
            with conn:
                return conn.execute("DELETE FROM artifacts WHERE ref = ?", (ref,)).rowcount > 0

        return await self._run(remove)

    async def refs(self) -> list[str]:
        rows = await self._run(
            lambda c: c.execute("SELECT ref FROM artifacts ORDER BY ref").fetchall()
        )
        return [str(row[0]) for row in rows]

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._conn.close, limiter=self._limiter)


def _connect(location: str, readonly: bool) -> sqlite3.Connection:
    if readonly:
        if not Path(location).exists():
            raise ArtifactStoreError(location, "does not exist")
        conn = sqlite3.connect(f"file:{location}?mode=ro", uri=True, check_same_thread=False)
        return conn
    conn = sqlite3.connect(location, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(SCHEMA)
    return conn


async def open_store(location: str, readonly: bool) -> SqliteArtifacts:
    """Open (and create, unless ``readonly``) the SQLite artifact store at ``location``."""
    try:
        conn = await anyio.to_thread.run_sync(_connect, location, readonly)
    except sqlite3.Error as exc:
        raise ArtifactStoreError(location, f"cannot be opened ({exc})") from None
    return SqliteArtifacts(location, conn)
