"""The PostgreSQL artifact store: a table beside a PostgreSQL journal's events.

``artifacts (ref, size, body)`` in the connection's current schema, reached with
psycopg 3, synchronously, in a worker thread one call at a time, as the journal's own
PostgreSQL store works (the ``dir-kernel[postgres]`` extra; nothing imports this module
until a ``postgresql://`` location is opened). Its own connection: a put never waits
on the journal writer's lease or transactions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import psycopg

from kernel.artifacts.port import ArtifactStoreError, checked, is_ref, ref_of

SCHEMA = """
CREATE TABLE IF NOT EXISTS artifacts (
    ref TEXT PRIMARY KEY, size BIGINT NOT NULL, body BYTEA NOT NULL
)
"""
T = TypeVar("T")
_WHERE = "the PostgreSQL artifact store"
"""How errors name the store: never by its URL, which may hold a password."""


def _problem(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"cannot be used ({text})"


class PostgresArtifacts:
    """Artifacts in a PostgreSQL table (see the module docstring)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.location = _WHERE
        self._conn = conn
        self._limiter = anyio.CapacityLimiter(1)

    async def _run(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(fn, self._conn, limiter=self._limiter)
        except psycopg.Error as exc:
            raise ArtifactStoreError(_WHERE, _problem(exc)) from None

    async def put(self, data: bytes) -> str:
        raw = checked(data)
        ref = ref_of(raw)
        await self._run(
            lambda c: c.execute(
                "INSERT INTO artifacts (ref, size, body) VALUES (%s, %s, %s)"
                " ON CONFLICT (ref) DO NOTHING",
                (ref, len(raw), raw),
            )
        )
        return ref

    async def get(self, ref: str) -> bytes | None:
        if not is_ref(ref):
            return None
        row = await self._run(
            lambda c: c.execute("SELECT body FROM artifacts WHERE ref = %s", (ref,)).fetchone()
        )
        return bytes(row[0]) if row is not None else None

    async def size(self, ref: str) -> int | None:
        if not is_ref(ref):
            return None
        row = await self._run(
            lambda c: c.execute("SELECT size FROM artifacts WHERE ref = %s", (ref,)).fetchone()
        )
        return int(row[0]) if row is not None else None

    async def delete(self, ref: str) -> bool:
        if not is_ref(ref):
            return False
        return await self._run(
            lambda c: c.execute("DELETE FROM artifacts WHERE ref = %s", (ref,)).rowcount > 0
        )

    async def refs(self) -> list[str]:
        rows = await self._run(
            lambda c: c.execute("SELECT ref FROM artifacts ORDER BY ref").fetchall()
        )
        return [str(row[0]) for row in rows]

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._conn.close, limiter=self._limiter)


def _connect(location: str, readonly: bool) -> psycopg.Connection[Any]:
    conn = psycopg.connect(location, autocommit=True, connect_timeout=10)
    try:
        if readonly:
            found = conn.execute("SELECT to_regclass('artifacts')").fetchone()
            if found is None or found[0] is None:
                raise ArtifactStoreError(_WHERE, "holds no artifacts table")
        else:
            conn.execute(SCHEMA)
    except BaseException:
        conn.close()
        raise
    return conn


async def open_store(location: str, readonly: bool) -> PostgresArtifacts:
    """Open (and create the table, unless ``readonly``) the store at ``location``."""
    try:
        conn = await anyio.to_thread.run_sync(_connect, location, readonly)
    except psycopg.Error as exc:
        raise ArtifactStoreError(_WHERE, _problem(exc)) from None
    return PostgresArtifacts(conn)
