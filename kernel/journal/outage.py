"""The journal's store, reachable or not: an outage is ridden out, never a failed journal.

A store that cannot be reached (a PostgreSQL server stopped or restarting, a network
gone) is not a fault of the journal: nothing was lost and the chain is intact. The
writer learns of it from a commit that raised
:class:`~kernel.journal.errors.JournalUnreachable`, or, idle, from a probe every
``heartbeat_s``. It then reconnects every ``retry_s`` until the store answers; the head
row says whether the transaction in flight committed (kept) or not (written again), and
another kernel having taken the journal meanwhile fences this one, as ever.

Meanwhile the journal's :attr:`StoreWatch.state` says where it stands, for whoever must
answer a caller without the journal (``kernel.api.outage``): RETRYING for the first
``grace_s`` (a short outage: wait and be judged normally), then UNREACHABLE (decide by
the tenant's fail mode). Appends are not refused: they wait, and commit in order once
the store is back, so nothing the kernel does is ever unrecorded.

A store without ``probe`` and ``reconnect`` (SQLite) keeps its old behaviour: a
failed write fails the journal. The timing here is the process's own (anyio's clock),
as any I/O retry: no decision reads it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any

import anyio

from kernel.journal.errors import JournalUnreachable

log = logging.getLogger(__name__)


class StoreState(StrEnum):
    """Whether the journal's store can be reached."""

    REACHABLE = "reachable"
    RETRYING = "retrying"
    """Lost for less than the grace: appends and callers wait for it."""
    UNREACHABLE = "unreachable"
    """Lost for longer: callers are answered by their tenant's fail mode."""


class StoreWatch:
    """The writer's view of its store, and the loop that rides an outage out.

    Args:
        writer: the store's writer (None read-only); ``probe`` and ``reconnect`` are
            looked up on it, and a store without them never reports an outage.
        limiter: the writer's limiter (its connection is used by one thread at a time).
        grace_s: how long a lost store is retried before it is reported UNREACHABLE.
        retry_s: the pause between reconnection attempts.
        heartbeat_s: how often an idle writer probes its store.
    """

    def __init__(
        self,
        writer: Any,
        limiter: anyio.CapacityLimiter,
        *,
        grace_s: float = 5.0,
        retry_s: float = 0.2,
        heartbeat_s: float = 1.0,
    ) -> None:
        self._probe: Callable[[], None] | None = getattr(writer, "probe", None)
        self._reconnect: Callable[[int, tuple[int, str] | None], bool] | None = getattr(
            writer, "reconnect", None
        )
        self._limiter = limiter
        self._grace_s = grace_s
        self._retry_s = retry_s
        self._heartbeat_s = heartbeat_s
        self._state = StoreState.REACHABLE
        self._changed = anyio.Event()
        self.outages = 0
        """How many outages were ridden out (or are being) since the journal opened."""
        self._hooks: list[Callable[[], Awaitable[object]]] = []
        self._kick = anyio.Event()
        self._stopped = False

    def on_back(self, hook: Callable[[], Awaitable[object]]) -> None:
        """Run ``hook`` now (the store is reachable at open) and each time the store is back.

        A hook that raises is logged and run again at the next return; it must not wait
        for the store itself to be away (it runs beside the writer, never in it).
        """
        self._hooks.append(hook)
        self._kick.set()

    async def run_hooks(self) -> None:
        """Run the :meth:`on_back` hooks whenever the store is reachable again, until stopped."""
        while not self._stopped:
            await self._kick.wait()
            self._kick = anyio.Event()
            if self._stopped or self._state is not StoreState.REACHABLE:
                continue
            for hook in tuple(self._hooks):
                try:
                    await hook()
                except Exception as exc:
                    log.warning("after the journal's store came back: %r", exc)

    def stop_hooks(self) -> None:
        """End :meth:`run_hooks` (the journal is closing)."""
        self._stopped = True
        self._kick.set()

    @property
    def state(self) -> StoreState:
        """Where the store stands now."""
        return self._state

    @property
    def rides_out(self) -> bool:
        """Whether this store's outages are ridden out (False: a lost store fails the journal)."""
        return self._reconnect is not None

    async def until(self, *states: StoreState) -> StoreState:
        """Wait until the store is in one of ``states``; return the state."""
        while self._state not in states:
            await self._changed.wait()
        return self._state

    async def settled(self) -> StoreState:
        """Wait out the grace: return REACHABLE or UNREACHABLE, never RETRYING."""
        return await self.until(StoreState.REACHABLE, StoreState.UNREACHABLE)

    def _set(self, state: StoreState) -> None:
        if state is not self._state:
            self._state = state
            changed, self._changed = self._changed, anyio.Event()
            changed.set()
            if state is StoreState.REACHABLE:
                self._kick.set()

    async def write(
        self, append: Callable[[], None], expected_seq: int, pending: tuple[int, str]
    ) -> None:
        """Run one transaction (``append``), riding out the store's absence.

        ``expected_seq`` is the head before it, ``pending`` the head seq and record it
        moves to. Returns once it committed, whether before or after an outage.

        Raises:
            Exception: what else failed (the journal fails as before).
        """
        while True:
            try:
                await anyio.to_thread.run_sync(append, limiter=self._limiter)
                return
            except JournalUnreachable:
                if self._reconnect is None:
                    raise
            if await self._ride_out(expected_seq, pending):
                return

    async def idle(self, ready: anyio.Event, head_seq: int) -> Exception | None:
        """Wait for ``ready``, probing the store every heartbeat meanwhile.

        Returns what failed the journal while idle (another kernel took it), else None.
        """
        if self._probe is None or self._reconnect is None:
            await ready.wait()
            return None
        while not ready.is_set():
            with anyio.move_on_after(self._heartbeat_s):
                await ready.wait()
                return None
            try:
                await anyio.to_thread.run_sync(self._probe, limiter=self._limiter)
            except JournalUnreachable:
                try:
                    await self._ride_out(head_seq, None)
                except Exception as exc:
                    return exc
        return None

    async def _ride_out(self, expected_seq: int, pending: tuple[int, str] | None) -> bool:
        """Reconnect until the store answers; return whether ``pending`` had committed."""
        assert self._reconnect is not None
        self.outages += 1
        self._set(StoreState.RETRYING)
        lost = anyio.current_time()
        while True:
            try:
                committed = await anyio.to_thread.run_sync(
                    self._reconnect, expected_seq, pending, limiter=self._limiter
                )
            except JournalUnreachable:
                if anyio.current_time() - lost >= self._grace_s:
                    self._set(StoreState.UNREACHABLE)
                await anyio.sleep(self._retry_s)
                continue
            except BaseException:
                self._set(StoreState.REACHABLE)  # failed, not away: the journal says why
                raise
            self._set(StoreState.REACHABLE)
            return committed
