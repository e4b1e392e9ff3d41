"""What every part of a Kernel shares: calls into the actors, and the flows waited on.

The embedding code never touches an actor. Each of its calls is a message to an
actor's mailbox and a wait for the actor's answer, which comes once what the
actor staged is durable (:class:`Calls`). What it waits for besides (a flow
reaching a status, a quiet kernel, room for new flows) is fed by every commit
(:class:`Flows`). When the kernel stops, :meth:`Calls.stop` releases every
caller and every waiter at once, each raising why the kernel stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

import anyio

from kernel.core.errors import KernelShutdown
from kernel.core.events import Event
from kernel.core.flow import FLOW_EVENTS, FlowState, FlowStatus
from kernel.core.reasons import StopReason
from kernel.journal.store import Journal, JournalError
from kernel.runtime.actors import Mailbox, Reply
from kernel.state.projections import Projections, fold
from kernel.state.snapshots import Checkpointer

M = TypeVar("M")
T = TypeVar("T")

STOPPED = object()
"""What a pending reply gets when the kernel stops: the caller then raises why."""


class Calls:
    """Calls into the actors that wait for a durable answer, and the stop that ends them."""

    def __init__(self) -> None:
        self._pending: set[Reply[Any]] = set()
        self._stop_reason: KernelShutdown | None = None
        self._on_stop: list[Callable[[], None]] = []

    @property
    def stopped(self) -> KernelShutdown | None:
        """Why the kernel stopped, or None while it runs."""
        return self._stop_reason

    def on_stop(self, release: Callable[[], None]) -> None:
        """Call ``release`` once, when the kernel stops (it wakes the waiters it keeps)."""
        self._on_stop.append(release)

    def stop(self, reason: StopReason, detail: str = "") -> KernelShutdown:
        """Stop accepting work and release everyone waiting; return why it stopped.

        The first reason stands: a later stop returns it unchanged.
        """
        if self._stop_reason is not None:
            return self._stop_reason
        stopped = self._stop_reason = KernelShutdown(reason, detail)
        for reply in list(self._pending):
            reply.set(STOPPED)
        for release in self._on_stop:
            release()
        return stopped

    def raise_if_stopped(self) -> None:
        """Raise why the kernel stopped, if it did.

        Raises:
            KernelShutdown: the kernel stopped.
        """
        if self._stop_reason is not None:
            raise self._stop_reason

    async def call(self, mailbox: Mailbox[M], msg: M, reply: Reply[T]) -> T:
        """Send ``msg`` and return the actor's answer once it is durable.

        Raises:
            KernelShutdown: the kernel stopped before the answer came.
            Exception: the actor answered with a refusal (raised as it is).
        """
        self.raise_if_stopped()
        self._pending.add(reply)
        try:
            await mailbox.send(msg)
            answer = await reply.wait()
        finally:
            self._pending.discard(reply)
        return self._answered(answer)

    async def wait(self, reply: Reply[T]) -> T:
        """Return the answer to a message sent already (or on its way), once it is durable.

        Raises:
            KernelShutdown: the kernel stopped before the answer came.
            Exception: the actor answered with a refusal (raised as it is).
        """
        self.raise_if_stopped()
        self._pending.add(reply)
        try:
            answer = await reply.wait()
        finally:
            self._pending.discard(reply)
        return self._answered(answer)

    def _answered(self, answer: T) -> T:
        if answer is STOPPED:
            self.raise_if_stopped()
        if isinstance(answer, Exception):
            raise answer
        return answer


class Flows:
    """What the embedding code waits for, fed by every commit: flows, quiet, room.

    Args:
        journal: where a forgotten finished flow is read back from.
        projections: the kernel's projections, applied here for every commit.
        calls: raises when the kernel stopped; its stop wakes every waiter here.
        max_in_flight: the flows admitted at once (room is waited for beyond it).
        checkpointer: told of every commit, when checkpoints are taken.
    """

    def __init__(
        self,
        journal: Journal,
        projections: Projections,
        calls: Calls,
        max_in_flight: int,
        checkpointer: Checkpointer | None = None,
    ) -> None:
        self._journal = journal
        self._projections = projections
        self._calls = calls
        self._max_in_flight = max_in_flight
        self.checkpointer = checkpointer
        self._admitting = 0
        self._room: anyio.Event | None = None
        self._quiet: anyio.Event | None = None
        self._waiters: dict[str, list[tuple[frozenset[FlowStatus], anyio.Event]]] = {}
        self._watched: dict[str | None, list[Event]] = {}
        calls.on_stop(self._release)

    def on_commit(self, events: Sequence[Event]) -> None:
        """Apply a committed batch to the projections and wake whoever waits on it.

        The journal calls it for every commit, before any appender wakes.
        """
        projections = self._projections
        projections.apply(events)
        if self.checkpointer is not None:
            self.checkpointer.observe(projections)
        watched = self._watched
        if watched:
            for event in events:
                seen = watched.get(event.dfid)
                if seen is not None:
                    seen.append(event)
        if self._waiters:
            self._wake(events)
        moving = len(projections.moving)
        if self._quiet is not None and not moving:
            self._quiet.set()
            self._quiet = None
        if self._room is not None and moving + self._admitting < self._max_in_flight:
            self._room.set()
            self._room = None

    def watch(self, dfid: str) -> list[Event]:
        """Keep the events of flow ``dfid`` as they commit, from now until :meth:`unwatch`.

        A call watches the flow it is about to open: its answer is then built from
        what committed (kernel.api.decisions), never read back from the journal.
        """
        return self._watched.setdefault(dfid, [])

    def unwatch(self, dfid: str) -> None:
        """Stop keeping the events of flow ``dfid``."""
        self._watched.pop(dfid, None)

    def _wake(self, events: Sequence[Event]) -> None:
        for event in events:
            if event.dfid is None or type(event.payload) not in FLOW_EVENTS:
                continue
            waiters = self._waiters.get(event.dfid)
            if not waiters:
                continue
            current = self._projections.flows.get(event.dfid)
            if current is None:
                continue  # a note on a finished flow the index forgot
            keep = []
            for targets, wake in waiters:
                if current.status in targets:
                    wake.set()
                else:
                    keep.append((targets, wake))
            if keep:
                self._waiters[event.dfid] = keep
            else:
                del self._waiters[event.dfid]

    def _release(self) -> None:
        for waiters in self._waiters.values():
            for _, wake in waiters:
                wake.set()
        self._waiters.clear()
        for event in (self._quiet, self._room):
            if event is not None:
                event.set()

    async def recall(self, dfid: str) -> FlowState | None:
        """Read a finished flow the projections forgot back from the journal, and keep it.

        Requests naming an old flow (a repeated submission, a late decision) are
        then answered from its record exactly as while it was kept. Returns the
        flow if it finished, else None (an open flow is always in memory).
        """
        self._calls.raise_if_stopped()
        if dfid in self._projections.flows:
            return None
        try:
            events = await self._journal.flow_events(dfid)
        except JournalError:
            return None  # the request goes on, and is refused or finds the kernel stopped
        if not events:
            return None  # never opened (a new key): no state to build for it
        folded = fold(events)
        state = folded.flows.get(dfid)
        if state is None or not state.terminal:
            return None
        self._projections.recall(state, folded.approvals.get(dfid))
        return state

    async def wait_flow(self, dfid: str, until: Collection[FlowStatus]) -> FlowState:
        """Wait until flow ``dfid`` is in one of the ``until`` statuses, and return it."""
        targets = frozenset(until)
        while True:
            current = self._projections.flows.get(dfid)
            if current is None:
                current = await self.recall(dfid)
                if current is not None and current.status in targets:
                    return current
                current = self._projections.flows.get(dfid)  # it may have moved meanwhile
            if current is not None and current.status in targets:
                return current
            self._calls.raise_if_stopped()
            wake = anyio.Event()
            self._waiters.setdefault(dfid, []).append((targets, wake))
            await wake.wait()

    async def wait_quiet(self) -> None:
        """Wait until no flow moves on its own (every flow ended or waits for a human)."""
        while self._projections.moving:
            self._calls.raise_if_stopped()
            self._quiet = self._quiet or anyio.Event()
            await self._quiet.wait()

    async def admit(self, flows: int) -> None:
        """Wait for room for ``flows`` new flows and hold it (give it back with :meth:`release`).

        The backpressure starts at the kernel's edge: when ``max_in_flight`` flows
        are already moving, a trigger (or a proposal) waits here. A single request
        wider than the limit still goes through, alone.
        """
        moving = self._projections.moving
        while self._admitting + len(moving) + flows > self._max_in_flight:
            if self._admitting + len(moving) == 0:
                break
            self._calls.raise_if_stopped()
            self._room = self._room or anyio.Event()
            await self._room.wait()
        self._admitting += flows

    def release(self, flows: int) -> None:
        """Give back the room :meth:`admit` held, once the flows are open (or were not)."""
        self._admitting -= flows
