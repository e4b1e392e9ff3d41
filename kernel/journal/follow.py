"""Follow a journal from another process: every committed event once, in order, live.

:func:`follow_journal` is for the CLI, a console, an MCP server or an exporter
that does not hold the journal open for writing. On PostgreSQL it LISTENs on
the channel each appending transaction notifies (``dirk_journal``) and reads
``seq > last`` in order, so a commit reaches a follower without polling; under
the writer's lease commits are serialized in seq order, so none is skipped. On
SQLite, which has no notifications, it reads again every ``poll_s`` on the clock.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncGenerator
from typing import Any

import anyio

from kernel.core.events import GENESIS_HASH, Event, decode_body, with_derived
from kernel.core.ports import Clock, SystemClock
from kernel.journal._subscription import READ_BATCH
from kernel.journal.codec import unpack
from kernel.journal.errors import JournalCorrupt, is_postgres
from kernel.journal.port import backend_for


async def follow_journal(
    location: str | os.PathLike[str],
    from_seq: int = 1,
    *,
    poll_s: float = 0.5,
    clock: Clock | None = None,
) -> AsyncGenerator[list[Event], None]:
    """Yield batches of committed events from ``from_seq`` on, forever (until cancelled).

    Args:
        location: The journal: a SQLite file or a ``postgresql://`` URL.
        from_seq: The first event to yield.
        poll_s: SQLite only: how long to wait on ``clock`` between reads once caught up.
        clock: SQLite only: the clock to wait on (the system clock by default).

    Raises:
        JournalError: The journal cannot be read; JournalCorrupt if an event does not decode.
    """
    location = os.fspath(location)
    opened = await backend_for(location).open_store(
        location, readonly=True, synchronous="FULL", chain_key=None
    )
    reader = opened.reader
    wake: Waiter = _Notifications(location) if is_postgres(location) else _Clock(clock, poll_s)
    try:
        await wake.start()  # before the first read: a commit after it is read or announced
        next_seq = max(from_seq, 1)
        while True:
            rows = await reader.events(next_seq, None, None, None, READ_BATCH)
            if rows:
                try:
                    batch = [
                        decode_body(unpack(body), GENESIS_HASH if seq == 1 else prev or b"", hash_)
                        for seq, body, hash_, prev in rows
                    ]
                except (ValueError, TypeError) as exc:
                    raise JournalCorrupt(location, f"an event does not decode ({exc})") from exc
                next_seq = batch[-1].seq + 1
                yield with_derived(batch)
                if len(rows) == READ_BATCH:
                    continue
            await wake.wait()
    finally:
        with anyio.CancelScope(shield=True):
            await wake.aclose()
            await reader.aclose()


class Waiter:
    """How a follower learns that something may have been committed."""

    async def start(self) -> None:
        """Get ready, before the first read."""

    async def wait(self) -> None:
        """Return when a commit may have happened since the last read."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release what :meth:`start` took."""


class _Clock(Waiter):
    def __init__(self, clock: Clock | None, poll_s: float) -> None:
        self._clock = clock or SystemClock()
        self._poll_s = poll_s

    async def wait(self) -> None:
        await self._clock.sleep(self._poll_s)


class _Notifications(Waiter):
    """LISTEN on the journal's channel, on a connection of its own."""

    def __init__(self, location: str) -> None:
        self._location = location
        self._limiter = anyio.CapacityLimiter(1)
        self._conn: Any = None

    async def start(self) -> None:
        from kernel.journal._postgres import listen

        self._conn = await anyio.to_thread.run_sync(listen, self._location)

    async def wait(self) -> None:
        from kernel.journal._postgres import notified

        # Short waits, so one abandoned on cancellation ends soon after.
        while not await anyio.to_thread.run_sync(
            notified, self._conn, self._location, 0.5, abandon_on_cancel=True, limiter=self._limiter
        ):
            pass

    async def aclose(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
