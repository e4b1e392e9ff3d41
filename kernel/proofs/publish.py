"""Where signed checkpoints go besides the journal: a directory, PostgreSQL, NATS.

A checkpoint is public and self-authenticating, so publishing it anywhere is safe; what
matters is that it lands where the journal's writer cannot take it back, so that a
later truncation or a forked history shows against it (``dirk verify --checkpoint``,
``dirk witness``). Each place keeps every checkpoint and the latest per origin:

- a directory: ``<dir>/<hex SHA-256(origin)>/checkpoint`` (the latest, replaced
  atomically, the path tlog-witness monitors read) and ``checkpoint.<size>`` beside it;
- ``postgresql://...``: rows ``(origin, size, note)`` of ``dirk_checkpoints`` in that
  database (created if missing);
- ``nats://host:port/BUCKET``: the key ``checkpoint.<hex SHA-256(origin)>`` of a
  JetStream key-value bucket (created with history 64 if missing), one revision each.

A place that fails is logged and skipped: publishing never stops a kernel.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import anyio

log = logging.getLogger(__name__)

TABLE = "dirk_checkpoints"
KV_HISTORY = 64


class Publisher(Protocol):
    """One place checkpoints are published to."""

    where: str

    async def publish(self, origin: str, size: int, note: str) -> None:
        """Publish the checkpoint ``note`` of ``size`` events of ``origin``."""
        ...

    async def latest(self, origin: str) -> str | None:
        """Return the latest checkpoint published for ``origin``, or None."""
        ...

    async def aclose(self) -> None:
        """Let go of any connection."""
        ...


def origin_key(origin: str) -> str:
    """Return the hex SHA-256 of an origin: its name in paths and keys."""
    return hashlib.sha256(origin.encode()).hexdigest()


class DirectoryPublisher:
    """Checkpoints as files under a directory."""

    def __init__(self, root: str) -> None:
        self.where = root
        self._root = Path(root)

    async def publish(self, origin: str, size: int, note: str) -> None:
        await anyio.to_thread.run_sync(self._write, origin, size, note)

    def _write(self, origin: str, size: int, note: str) -> None:
        folder = self._root / origin_key(origin)
        folder.mkdir(parents=True, exist_ok=True)
        for name in (f"checkpoint.{size}", "checkpoint"):
            # Written aside, then renamed: a reader sees the old note or the new, never half.
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".checkpoint.")
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
                out.write(note)
            os.replace(tmp, folder / name)

    async def latest(self, origin: str) -> str | None:
        path = self._root / origin_key(origin) / "checkpoint"
        try:
            return await anyio.to_thread.run_sync(path.read_text, "utf-8")
        except FileNotFoundError:
            return None

    async def aclose(self) -> None:
        return None


class PostgresPublisher:
    """Checkpoints as rows of a PostgreSQL table (the ``dir-kernel[postgres]`` extra)."""

    def __init__(self, url: str) -> None:
        from kernel.journal.errors import redact

        self.where = redact(url)
        self._url = url
        self._conn: Any = None

    def _connect(self) -> Any:
        if self._conn is None:
            from kernel.journal._postgres import connect

            self._conn = connect(self._url)
            self._conn.execute(
                f"CREATE TABLE IF NOT EXISTS {TABLE} (origin TEXT NOT NULL, size BIGINT NOT NULL,"
                " note TEXT NOT NULL, PRIMARY KEY (origin, size))"
            )
        return self._conn

    async def publish(self, origin: str, size: int, note: str) -> None:
        def insert() -> None:
            self._connect().execute(
                f"INSERT INTO {TABLE} (origin, size, note) VALUES (%s, %s, %s)"
                " ON CONFLICT (origin, size) DO UPDATE SET note = excluded.note",
                (origin, size, note),
            )

        await anyio.to_thread.run_sync(insert)

    async def latest(self, origin: str) -> str | None:
        def select() -> str | None:
            row = (
                self._connect()
                .execute(
                    f"SELECT note FROM {TABLE} WHERE origin = %s ORDER BY size DESC LIMIT 1",
                    (origin,),
                )
                .fetchone()
            )
            return None if row is None else str(row[0])

        return await anyio.to_thread.run_sync(select)

    async def aclose(self) -> None:
        if self._conn is not None:
            await anyio.to_thread.run_sync(self._conn.close)


class NatsPublisher:
    """Checkpoints as revisions of a key in a NATS JetStream key-value bucket."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.where = f"{parts.scheme}://{parts.hostname}:{parts.port}{parts.path}"
        self._server = f"{parts.scheme}://{parts.netloc}"
        self._bucket = parts.path.strip("/") or "dirk-checkpoints"
        self._nc: Any = None
        self._kv: Any = None

    async def _store(self) -> Any:
        if self._kv is None:
            from nats.aio.client import Client
            from nats.js.errors import BucketNotFoundError

            nc = Client()
            try:
                await nc.connect(self._server, allow_reconnect=False, connect_timeout=5)
            except BaseException:
                # A refused login leaves nats.py's socket open: close it here, now.
                with anyio.CancelScope(shield=True):
                    await _abandon(nc)
                raise
            self._nc = nc
            js = self._nc.jetstream()
            try:
                self._kv = await js.key_value(self._bucket)
            except BucketNotFoundError:
                self._kv = await js.create_key_value(bucket=self._bucket, history=KV_HISTORY)
        return self._kv

    async def publish(self, origin: str, size: int, note: str) -> None:
        kv = await self._store()
        await kv.put(f"checkpoint.{origin_key(origin)}", note.encode())

    async def latest(self, origin: str) -> str | None:
        from nats.js.errors import KeyNotFoundError

        kv = await self._store()
        try:
            entry = await kv.get(f"checkpoint.{origin_key(origin)}")
        except KeyNotFoundError:
            return None
        return None if entry.value is None else bytes(entry.value).decode()

    async def aclose(self) -> None:
        if self._nc is not None:
            await self._nc.close()


async def _abandon(nc: Any) -> None:
    transport = getattr(nc, "_transport", None)
    with contextlib.suppress(Exception):
        await nc.close()
    if transport is not None:
        with contextlib.suppress(Exception):
            transport.close()
            await transport.wait_closed()


def publisher_for(where: str) -> Publisher:
    """Return the publisher of a place: a ``postgresql://`` or ``nats://`` URL, else a directory."""
    if where.startswith(("postgresql://", "postgres://")):
        return PostgresPublisher(where)
    if where.startswith(("nats://", "tls://")):
        return NatsPublisher(where)
    return DirectoryPublisher(where.removeprefix("file://"))


@contextlib.asynccontextmanager
async def open_publishers(places: Sequence[str]) -> AsyncIterator[list[Publisher]]:
    """Open a publisher for each place; close them all on exit."""
    publishers = [publisher_for(place) for place in places]
    try:
        yield publishers
    finally:
        with anyio.CancelScope(shield=True):
            for publisher in publishers:
                with contextlib.suppress(Exception):
                    await publisher.aclose()


async def publish_all(publishers: Sequence[Publisher], origin: str, size: int, note: str) -> None:
    """Publish a checkpoint everywhere; a place that fails is logged, never raised."""
    for publisher in publishers:
        try:
            with anyio.fail_after(10):
                await publisher.publish(origin, size, note)
        except Exception as exc:
            log.warning("checkpoint %d not published to %s: %r", size, publisher.where, exc)
