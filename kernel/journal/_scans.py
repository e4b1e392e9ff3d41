"""The journal's scans: every event from a seq on, in batches, checked as they are read.

Part of :class:`~kernel.journal.store.Journal` (its base): :meth:`Scans.scan` yields
events with their hashes or, for a fold, without (:meth:`Scans.scan` ``hashes=False``,
which a helper process reads and checks for a long read: kernel.journal._helper);
:meth:`Scans.scan_checked` is what opening a kernel folds its tail through.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Collection
from contextlib import aclosing

from kernel.core.events import GENESIS_HASH, Event, with_derived
from kernel.journal._helper import HEAD_START, helped_scan, helps
from kernel.journal._rows import HistoryCheck, checked_page, folded
from kernel.journal._subscription import READ_BATCH as _BATCH
from kernel.journal.errors import JournalCorrupt
from kernel.journal.port import StoreReader


class Scans:
    """The scans of a :class:`~kernel.journal.store.Journal` (what it provides them with)."""

    _path: str
    _head_seq: int
    _reader: StoreReader
    _key: bytes | None
    _history: HistoryCheck

    _hashes_checked: bool
    _check_open: Callable[[], None]
    _corrupt: Callable[[str, int], JournalCorrupt]
    check_history: Callable[[], Awaitable[None]]
    _read: Callable[
        [int, int | None, str | None, Collection[str] | None, int | None],
        Awaitable[list[Event]],
    ]

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
            self._check_open()
            found = await self._reader.hash_at(start - 1)
            if not isinstance(found, bytes):
                raise self._corrupt(f"event {start - 1} is missing", start - 1)
            prev = found
        expected = start
        while expected <= head:
            self._check_open()
            rows = await self._reader.rows(expected, head, _BATCH)
            if not rows:
                raise self._corrupt(f"event {expected} is missing", expected)
            batch, problem, expected, prev = checked_page(
                rows, expected, prev, self._key, self._hashes_checked
            )
            if problem:
                raise self._corrupt(problem, expected)
            yield with_derived(batch)

    async def scan(
        self, start: int = 1, batch_size: int = _BATCH, *, hashes: bool = True
    ) -> AsyncIterator[list[Event]]:
        """Yield every event from ``start`` on, in seq-ordered batches of ``batch_size``.

        ``hashes`` False leaves each event's ``prev_hash`` and ``hash`` empty: what a
        fold of the projections reads (they use neither), for less work per event. The
        chain is checked through the rows read either way.

        Raises:
            JournalCorrupt: an event is missing, altered or out of place (with its seq).
        """
        pages = self._pages(start, batch_size) if hashes else self._folded(start, batch_size)
        async for batch in pages:
            yield batch

    async def _pages(self, start: int, batch_size: int) -> AsyncIterator[list[Event]]:
        """Read page by page, as :meth:`read` does (every event with its hashes)."""
        while True:
            batch = await self._read(start, None, None, None, batch_size)
            if batch:
                yield batch
            if len(batch) < batch_size:
                return
            start = batch[-1].seq + 1

    async def _folded(self, start: int, batch_size: int) -> AsyncIterator[list[Event]]:
        """Read the rows without building hashes, checking the chain through them."""
        start = max(start, 1)
        long = helps(self._head_seq - start + 1, self._path) and self._key is None
        if batch_size == _BATCH and long:
            async with aclosing(self._helped(start)) as pages:
                async for page in pages:
                    if isinstance(page, int):
                        start = page
                    else:
                        yield page
        async for batch in self._folded_from(start, await self._prev_of(start), batch_size):
            yield batch

    async def _helped(self, start: int) -> AsyncGenerator[list[Event] | int, None]:
        """Yield the events from ``start`` on as a helper process read them, then the seq
        to read on from (kernel.journal._helper).

        While the helper starts, the first :data:`HEAD_START` events are read here; it
        chains on from the last of them, whose stored hash they were checked against.
        """
        if start <= self._history.end:
            await self.check_history()
        ahead = start + HEAD_START
        async with aclosing(helped_scan(self._path, ahead, self._hashes_checked)) as helper:
            started = await anext(helper)
            reached = [start]
            prev = await self._prev_of(start)
            async for batch in self._folded_from(start, prev, _BATCH, ahead, reached):
                yield batch
            if reached[0] != ahead or isinstance(started, int):
                yield reached[0]
                return
            async for page in helper:
                yield page

    async def _folded_from(
        self,
        start: int,
        prev: bytes,
        batch_size: int,
        stop: int | None = None,
        reached: list[int] | None = None,
    ) -> AsyncIterator[list[Event]]:
        """Read events ``start``.. (before ``stop``) here, chained on ``prev``; ``reached``
        gets the seq after the last one read."""
        key, checked = self._key, self._hashes_checked
        while True:
            self._check_open()
            rows = await self._reader.events(start, stop, None, None, batch_size, False)
            if rows and start <= self._history.end:
                await self.check_history()
            batch, problem = folded(rows, start, prev, key, checked)
            if problem:
                raise self._corrupt(problem, start + len(batch))
            if batch:
                yield with_derived(batch)
            if rows:
                start, prev = start + len(rows), rows[-1][2]
            if reached is not None:
                reached[0] = start
            if len(rows) < batch_size:
                return

    async def _prev_of(self, start: int) -> bytes:
        """The stored hash of event ``start - 1`` (empty if missing: the check says so)."""
        if start <= 1:
            return GENESIS_HASH
        self._check_open()
        found = await self._reader.hash_at(start - 1)
        return found if isinstance(found, bytes) else b""
