"""Actors, their mailboxes and the Outbox they stage on.

An actor is a little state machine: some state, and ``handle(msg, out)``. It
never writes anything itself. It *stages* events and follow-up messages on
its :class:`Outbox`; the actor's runner commits everything one batch of
messages staged in one journal append, and only then delivers the follow-ups
and replies. That is "record first" by construction, and it turns a mailbox
full of messages into one transaction (the group commit is the lever: one
fsync for many decisions).

The supervisor that runs them is kernel.runtime.supervision.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import anyio
import msgspec
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from kernel.core import flow
from kernel.core.carrying import carrying, derived_chain
from kernel.core.events import (
    Draft,
    Event,
    Payload,
    ResourceReleased,
)
from kernel.core.flow import FLOW_EVENTS, FlowState
from kernel.core.ports import Clock
from kernel.state.projections import Projections

log = logging.getLogger(__name__)

M = TypeVar("M")
M_contra = TypeVar("M_contra", contravariant=True)
T = TypeVar("T")


class Append(Protocol):
    """The journal's append (kernel.journal.store.Journal.append)."""

    def __call__(
        self, drafts: Sequence[Draft], /, *, durable: bool = True
    ) -> Awaitable[list[Event]]: ...


Carrier = Callable[["Outbox"], Awaitable[bool]]
"""Records a batch's events in another actor's append, with what its early messages
produced; True once that append committed (``out.committed`` set), False to leave the
batch to its own append (kernel.api.answers: two commits per flow)."""


class Effects:
    """The task group adapter calls and guards run on, while the kernel runs.

    Handed to the parts that spawn effects (the adapter call pool, the guard runner);
    the kernel's lifetime opens the group (:attr:`tg`) and cancels it as it stops.
    Calling it runs ``fn`` there; once the group is cancelled nothing new starts
    (what was not called yet is recorded as started, and the next start resumes it:
    execution's Recover).
    """

    __slots__ = ("tg",)

    def __init__(self) -> None:
        self.tg: TaskGroup | None = None

    @property
    def running(self) -> bool:
        """Whether what is called now runs (the group is open and not cancelled)."""
        return self.tg is not None and not self.tg.cancel_scope.cancel_called

    def __call__(self, fn: Any) -> None:
        """Run ``fn`` on the effects task group (nothing once it is cancelled)."""
        tg = self.tg
        assert tg is not None, "effects spawned before the kernel started"
        if tg.cancel_scope.cancel_called:
            return
        tg.start_soon(fn)


class MailboxClosed(Exception):
    """The mailbox no longer accepts messages (the kernel is stopping)."""


class RestartIntensityExceeded(Exception):
    """Actors crashed more often than the supervisor allows; the kernel must stop."""


class Mailbox(Generic[M]):
    """A bounded queue of messages for one actor.

    Senders wait when it is full (backpressure, never unbounded growth); the
    receiver takes whole batches: one wait, then everything already there.
    """

    def __init__(self, name: str, capacity: int = 4096) -> None:
        self.name = name
        send, receive = anyio.create_memory_object_stream[M](capacity)
        self._send: MemoryObjectSendStream[M] = send
        self._receive: MemoryObjectReceiveStream[M] = receive
        self.direct: Callable[[M], bool] | None = None
        """A receiver that takes a message where it is delivered (run to completion: no
        task waits for it, no hop through the scheduler); it returns False to leave the
        message to the mailbox. kernel.hosting sets it for agents that decide synchronously."""

    async def send(self, msg: M) -> None:
        """Deliver ``msg``, waiting while the mailbox is full.

        With room it returns without a trip through the scheduler (anyio's ``send``
        yields once even then); the sender's next wait is its checkpoint.
        """
        if self.direct is not None and self.direct(msg):
            return
        try:
            self._send.send_nowait(msg)
            return
        except anyio.WouldBlock:
            pass
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            raise MailboxClosed(self.name) from exc
        try:
            await self._send.send(msg)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            raise MailboxClosed(self.name) from exc

    def offer(self, msg: M) -> Awaitable[None] | None:
        """Deliver ``msg`` without waiting if there is room; else return the wait for room.

        Actors hand many messages over per batch: skipping the scheduler round trip
        of ``send`` when the mailbox has room is most of the cost of a hand-over.
        """
        if self.direct is not None and self.direct(msg):
            return None
        try:
            self._send.send_nowait(msg)
        except anyio.WouldBlock:
            return self.send(msg)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            raise MailboxClosed(self.name) from exc
        return None

    def send_nowait(self, msg: M) -> None:
        """Deliver ``msg`` now; raise ``anyio.WouldBlock`` when the mailbox is full."""
        try:
            self._send.send_nowait(msg)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            raise MailboxClosed(self.name) from exc

    async def receive(self) -> M:
        """Wait for one message (several tasks may wait on one mailbox).

        A message already there is taken without a trip through the scheduler.
        """
        try:
            return self._receive.receive_nowait()
        except anyio.WouldBlock:
            return await self._receive.receive()

    async def receive_batch(self, limit: int) -> list[M]:
        """Wait for at least one message, then take up to ``limit`` without waiting."""
        try:
            batch = [self._receive.receive_nowait()]
        except anyio.WouldBlock:
            batch = [await self._receive.receive()]
        while len(batch) < limit:
            try:
                batch.append(self._receive.receive_nowait())
            except anyio.WouldBlock:
                break
        return batch

    def close(self) -> None:
        """Refuse further messages and drop the ones still waiting."""
        self._send.close()
        self._receive.close()

    def pending(self) -> int:
        """Return how many messages wait in the mailbox."""
        return self._receive.statistics().current_buffer_used


class Reply(Generic[T]):
    """A one-shot answer to a message, set after the answer's events committed."""

    __slots__ = ("_done", "_value")

    def __init__(self) -> None:
        # asyncio's own Event: the kernel runs on asyncio, and anyio.Event() looks up the
        # running backend on every creation (one Reply per trigger and per proposal).
        self._done = asyncio.Event()
        self._value: T | None = None

    def set(self, value: T) -> None:
        """Answer; only the first answer counts."""
        if not self._done.is_set():
            self._value = value
            self._done.set()

    async def wait(self) -> T:
        """Wait for the answer."""
        await self._done.wait()
        return self._value  # type: ignore[return-value]


class Outbox:
    """What one batch of messages stages: events to record, then messages to send.

    Flow events are folded through :func:`kernel.core.flow.apply` as they are staged,
    against the projections plus everything staged before them, so an illegal
    transition raises here and is never recorded.
    """

    def __init__(self, projections: Projections, clock: Clock) -> None:
        self._projections = projections
        self._clock = clock
        self.drafts: list[Draft] = []
        # Effects as (function, argument) pairs: a closure per effect (a function and its
        # cells) was a third of the young objects the cyclic GC walks in P1.
        self.effects: list[tuple[Callable[[Any], Awaitable[None] | None], Any]] = []
        self.committed: list[Event] = []
        """The staged events as the journal recorded them (numbered), once committed."""
        self.scratch: dict[str, Any] = {}
        """Whatever else an actor stages for this batch (derived, never recorded)."""
        self.early: list[tuple[int, Mailbox[Any], Any]] = []
        """Messages that may be delivered before the staged events commit, as (index in
        ``effects``, mailbox, message): see :meth:`send_early`."""
        # Per flow staged in this batch: its state and the index of its last event.
        self._overlay: dict[str, tuple[FlowState, int]] = {}
        self._opened: list[str] = []
        self._undo: dict[str, tuple[FlowState, int] | None] = {}
        self._mark = (0, 0, 0)
        self._lazy: list[str] = []

    def last_staged(self, dfid: str) -> Payload | None:
        """The payload of the batch's last draft if it is flow ``dfid``'s last event, else None."""
        staged = self._overlay.get(dfid)
        if staged is None or staged[1] != len(self.drafts) - 1:
            return None
        return self.drafts[-1].payload

    def travel_with(self, dfid: str, payload: Payload) -> int | None:
        """Let flow ``dfid``'s last staged row stand for ``payload`` too; return its index.

        One row where two events travel together with nothing recorded between them
        (:func:`~kernel.core.events.carrying`: a FlowCreated and its first context, a
        submission and its acceptance, an acceptance and its start). None: the batch's
        last draft is not the flow's, or cannot carry ``payload``; emit it instead.
        """
        last = self.last_staged(dfid)
        row = carrying(last, payload) if last is not None else None
        if row is None:
            return None
        self.restage(dfid, row, payload)
        return len(self.drafts) - 1

    def restage(self, dfid: str, row: Payload, carried: Payload) -> None:
        """Stage ``row`` in place of flow ``dfid``'s last event (:meth:`last_staged`).

        The same event, its row now standing for ``carried`` too
        (:func:`~kernel.core.events.carrying`, which adds one event to what a row stands
        for): ``carried`` is folded here as the derived event every reader will see last
        after the row (its seq, its cause the row's own seq).
        """
        state, index = self._overlay[dfid]
        draft = self.drafts[index]
        self.drafts[index] = msgspec.structs.replace(draft, payload=row)
        derived = Event(
            seq=state.last_seq,
            ts=self._clock.now_ns(),
            payload=carried,  # type: ignore[arg-type]
            dfid=state.dfid,
            parent_dfid=draft.parent_dfid,
            caused_by=state.last_seq,
            agent_id=draft.agent_id,
        )
        self._overlay[dfid] = (flow.apply(state, derived), index)

    def commit_lazily(self, dfid: str) -> None:
        """Let flow ``dfid``'s events of this batch commit without a sync of their own.

        For a flow that changes nothing in the world (a read-only kind's): safe from a
        killed process, durable with the next synced commit (group commit). The batch
        still syncs if it stages any other event (:attr:`durable`).
        """
        self._lazy.append(dfid)

    @property
    def durable(self) -> bool:
        """Whether the staged events want a sync of their own (any not marked lazy)."""
        if not self._lazy:
            return True
        lazy = set(self._lazy)
        return any(draft.dfid not in lazy for draft in self.drafts)

    def flow(self, dfid: str) -> FlowState | None:
        """Return the flow as it will be once the staged events commit."""
        staged = self._overlay.get(dfid)
        return staged[0] if staged is not None else self._projections.flows.get(dfid)

    def emit(
        self,
        payload: Payload,
        *,
        dfid: str | None = None,
        parent_dfid: str | None = None,
        caused_by: int | None = None,
        agent_id: str | None = None,
        after: int | None = None,
    ) -> int:
        """Stage an event and return its index in this batch.

        Flow events default their envelope fields from the flow, and their cause
        to the flow's previous event. ``after`` names the index of an event staged
        earlier in this batch as the cause; its seq is not known until the journal
        assigns it, so it is recorded as a relative (negative) reference that the
        journal resolves.
        """
        index = len(self.drafts)
        ended: FlowState | None = None
        if dfid is not None and type(payload) in FLOW_EVENTS:
            staged = self._overlay.get(dfid)
            current = staged[0] if staged else self._projections.flows.get(dfid)
            if current is not None:
                parent_dfid, agent_id, caused_by, after = _defaults(
                    current, staged, parent_dfid, agent_id, caused_by, after
                )
            state = self._fold(dfid, payload, parent_dfid, agent_id, staged, current, index)
            if current is None:
                # A FlowCreated: the flow is new (CREATED, which no flow ends in).
                self._opened.append(dfid)
            elif state.terminal and not current.terminal:
                ended = state
        if after is not None:
            caused_by = after - index
        self.drafts.append(
            Draft(
                payload=payload,  # type: ignore[arg-type]
                dfid=dfid,
                parent_dfid=parent_dfid,
                caused_by=caused_by,
                agent_id=agent_id,
            )
        )
        if ended is not None:
            self._release(ended, index)
        return index

    def _fold(
        self,
        dfid: str,
        payload: Payload,
        parent_dfid: str | None,
        agent_id: str | None,
        staged: tuple[FlowState, int] | None,
        current: FlowState | None,
        index: int,
    ) -> FlowState:
        """Fold a staged flow event into the overlay at ``index``; return the flow after it.

        An illegal transition raises before anything is staged.
        """
        provisional = Event(
            seq=current.last_seq if current else 0,
            ts=self._clock.now_ns(),
            payload=payload,  # type: ignore[arg-type]
            dfid=dfid,
            parent_dfid=parent_dfid,
            agent_id=agent_id,
        )
        # What to restore should the message crash: the flow as before its first event.
        self._undo.setdefault(dfid, staged)
        state = flow.apply(current, provisional)
        for derived in derived_chain(provisional):
            # The events its row stands for, which every reader will see after it.
            state = flow.apply(state, derived)
        self._overlay[dfid] = (state, index)
        return state

    def _release(self, ended: FlowState, index: int) -> None:
        # Whoever records the end of a flow releases what it held, in the same append:
        # a reservation can then never outlive its flow, on any path to an end.
        held = self._projections.reservations.get(ended.dfid)
        if held is None:
            return
        for pool, amount in sorted(held.items()):
            self.drafts.append(
                Draft(
                    payload=ResourceReleased(pool=pool, amount=amount, reason=ended.status),
                    dfid=ended.dfid,
                    agent_id=ended.agent_id,
                    caused_by=index - len(self.drafts),
                )
            )

    def send(self, mailbox: Mailbox[M], msg: M) -> None:
        """Deliver ``msg`` once the staged events have committed."""
        self.effects.append((mailbox.offer, msg))

    def post(self, mailbox: Mailbox[M], msg: M) -> None:
        """Deliver ``msg`` once the staged events have committed, never waiting for room.

        For a message to an actor that may itself be waiting on this one (the DIM's
        recompile requests to the compiler, which waits for the DIM's append of its
        carried batch): a full mailbox gets it from a task of its own, so neither waits
        on the other. One such message per flow at most, so they stay bounded.
        """
        self.effects.append((_Post(mailbox), msg))

    def send_early(self, mailbox: Mailbox[M], msg: M) -> None:
        """Deliver ``msg`` once the staged events have committed, or earlier if a carrier can.

        A carrier (:data:`Carrier`) may hand the message over before the commit, when
        what it leads to is recorded in the same append as these events (nothing acts on
        it before that append); otherwise it is sent after the commit, as :meth:`send`.
        """
        self.early.append((len(self.effects), mailbox, msg))
        self.effects.append((mailbox.offer, msg))

    def taken_early(self, index: int) -> None:
        """Mark the early message whose effect is at ``index`` as delivered already."""
        self.effects[index] = (_nothing, None)

    @property
    def opened(self) -> dict[str, tuple[FlowState, int]]:
        """The flows this batch opens (FlowCreated staged), as staged, with their last index."""
        return {d: self._overlay[d] for d in self._opened if d in self._overlay}

    def carry(self, drafts: Sequence[Draft], opened: Mapping[str, tuple[FlowState, int]]) -> int:
        """Stage another batch's drafts, unchanged and contiguous; return the first's index.

        Their relative causes stay valid (the block keeps its order). What this batch
        stages next sees their flows: a flow they open (``opened``: the other batch's
        :attr:`opened`) as that batch staged it, since no one else can have touched a
        flow that did not exist; any other flow event is folded again here, against the
        flow as committed since (an illegal transition raises, as in :meth:`emit`).
        Ends of flows among them brought their releases with them.
        """
        start = len(self.drafts)
        fresh = {
            dfid: state
            for dfid, state in opened.items()
            if dfid not in self._overlay and dfid not in self._projections.flows
        }
        for offset, draft in enumerate(drafts):
            dfid = draft.dfid
            if dfid is None or dfid in fresh or type(draft.payload) not in FLOW_EVENTS:
                continue
            staged = self._overlay.get(dfid)
            current = staged[0] if staged else self._projections.flows.get(dfid)
            self._fold(
                dfid,
                draft.payload,
                draft.parent_dfid,
                draft.agent_id,
                staged,
                current,
                start + offset,
            )
        for dfid, (state, index) in fresh.items():
            self._undo.setdefault(dfid, None)
            self._overlay[dfid] = (state, start + index)
        self.drafts.extend(drafts)
        return start

    def reply(self, reply: Reply[Any] | None, value: Any) -> None:
        """Answer ``reply`` once the staged events have committed."""
        if reply is not None:
            self.effects.append((reply.set, value))

    def reply_events(self, reply: Reply[Any] | None, indices: Sequence[int]) -> None:
        """Answer ``reply`` with the events staged at ``indices``, as committed (with seqs)."""
        if reply is not None:
            self.effects.append((self._answer_events, (reply, tuple(indices))))

    def _answer_events(self, arg: tuple[Reply[Any], tuple[int, ...]]) -> None:
        reply, indices = arg
        reply.set([self.committed[i] for i in indices])

    def after_commit(self, fn: Callable[[], Awaitable[None] | None]) -> None:
        """Run ``fn`` once the staged events have committed."""
        self.effects.append((_run, fn))

    def after_commit_with(self, fn: Callable[[T], Awaitable[None] | None], arg: T) -> None:
        """Run ``fn(arg)`` once the staged events have committed (no closure needed)."""
        self.effects.append((fn, arg))

    # --- per-message staging, used by the runner -----------------------------

    def begin(self) -> None:
        """Start staging one message."""
        self._mark = (len(self.drafts), len(self.effects), len(self._lazy))
        self._undo = {}

    def rollback(self) -> None:
        """Forget what the current message staged (it crashed)."""
        drafts, effects, lazy = self._mark
        del self.drafts[drafts:]
        del self.effects[effects:]
        del self._lazy[lazy:]
        self.early = [e for e in self.early if e[0] < effects]
        for dfid, previous in self._undo.items():
            if previous is None:
                self._overlay.pop(dfid, None)
            else:
                self._overlay[dfid] = previous
        self._undo = {}


def _defaults(
    current: FlowState,
    staged: tuple[FlowState, int] | None,
    parent_dfid: str | None,
    agent_id: str | None,
    caused_by: int | None,
    after: int | None,
) -> tuple[str | None, str | None, int | None, int | None]:
    """A flow event's envelope defaulted from its flow: parent, agent, and its cause.

    With no cause given, it is the flow's previous event: staged in this batch (``after``,
    an index) or committed (``caused_by``, a seq).
    """
    parent_dfid = parent_dfid or current.parent_dfid
    agent_id = agent_id or current.agent_id
    if after is None and caused_by is None:
        if staged is not None:
            after = staged[1]
        else:
            caused_by = current.last_seq
    return parent_dfid, agent_id, caused_by, after


def _run(fn: Callable[[], Awaitable[None] | None]) -> Awaitable[None] | None:
    return fn()


def _nothing(_: Any) -> None:
    return None


@dataclass(frozen=True)
class Waiting:
    """A posted message's wait for room, run beside the actor rather than by it."""

    wait: Awaitable[None]

    def __await__(self) -> Any:
        return self.wait.__await__()


@dataclass(frozen=True)
class _Post:
    """The effect of :meth:`Outbox.post`: deliver now, or hand the wait for room on."""

    mailbox: Mailbox[Any]

    def __call__(self, msg: Any) -> Awaitable[None] | None:
        wait = self.mailbox.offer(msg)
        return Waiting(wait) if wait is not None else None
