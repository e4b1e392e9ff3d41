"""Subscriptions: follow a journal's commits, falling back to reads when behind.

The journal's writer hands each committed batch to every live subscription
without waiting (:meth:`Subscription.offer`); a subscription whose buffer is
full stops being live and reads the missed events from the database instead,
so a slow subscriber never slows the writer and still sees every event once.

A subscription knows the journal only as :class:`Followed` (its head and its
reads) and is told by the journal when it closes (:meth:`Subscription.end`), so
this module imports nothing of the store's.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_left
from collections.abc import Callable
from typing import Protocol

import anyio

from kernel.core.events import Event

READ_BATCH = 5000
"""Events per read when a subscription (or a scan) reads from the database."""


class Followed(Protocol):
    """What a subscription follows: a journal's head and its committed events."""

    @property
    def head_seq(self) -> int:
        """Seq of the last committed event."""
        ...

    async def read(
        self, start: int = 1, stop: int | None = None, *, limit: int | None = None
    ) -> list[Event]:
        """Return committed events in seq order."""
        ...


class Subscription:
    """Batches of committed events in seq order; see :meth:`Journal.subscribe`."""

    def __init__(
        self,
        followed: Followed,
        from_seq: int,
        buffer: int,
        forget: Callable[[Subscription], None],
    ) -> None:
        """Follow ``followed`` from ``from_seq``; ``forget`` is called once it stops."""
        self._followed = followed
        self._forget = forget
        self._ended = False
        self._next_seq = max(from_seq, 1)
        # Live means the writer hands batches over; otherwise the next ones come from the database.
        self._live = False
        self._send, self._receive = anyio.create_memory_object_stream[list[Event]](buffer)

    @property
    def lagging(self) -> bool:
        """True while the subscription reads from the database instead of following live."""
        return not self._live

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop following the journal."""
        self._forget(self)
        self._send.close()
        self._receive.close()

    def end(self) -> None:
        """End the subscription once what was handed over is taken: the journal closed."""
        self._ended = True
        self._send.close()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> list[Event]:
        try:
            while True:
                batch = await self._next_batch()
                # A live batch may overlap the last read from the database.
                if batch and batch[0].seq < self._next_seq:
                    # By seq, not by position: a row and the event it stands for share one.
                    batch = batch[bisect_left(batch, self._next_seq, key=_seq) :]
                if batch:
                    self._next_seq = batch[-1].seq + 1
                    return batch
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            await self.aclose()
            raise StopAsyncIteration from None

    async def _next_batch(self) -> list[Event]:
        # Batches handed over before a lag come first: they precede whatever was missed.
        with contextlib.suppress(anyio.WouldBlock):
            return self._receive.receive_nowait()
        if self._live:
            return await self._receive.receive()
        if self._ended:
            raise anyio.EndOfStream
        events = await self._followed.read(self._next_seq, limit=READ_BATCH)
        # No await between this check and going live, so no commit can slip past unseen.
        if (events[-1].seq if events else self._next_seq - 1) >= self._followed.head_seq:
            self._live = True
        return events

    def offer(self, events: list[Event]) -> None:
        """Hand a committed batch over without waiting; on a full buffer, fall behind instead."""
        if not self._live:
            return
        try:
            self._send.send_nowait(list(events))
        except anyio.WouldBlock:
            self._live = False
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._forget(self)


def _seq(event: Event) -> int:
    return event.seq
