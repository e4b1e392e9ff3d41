"""Actors, mailboxes and the supervisor that keeps them running.

An actor is a little state machine: some state, and ``handle(msg, out)``. It
never writes anything itself. It *stages* events and follow-up messages on
its :class:`Outbox`; the actor's runner commits everything one batch of
messages staged in one journal append, and only then delivers the follow-ups
and replies. That is "record first" by construction, and it turns a mailbox
full of messages into one transaction (the group commit is the lever: one
fsync for many decisions).

The supervisor runs its children in one task group, Erlang/OTP style: a child
that crashes is replaced by a fresh instance (which rebuilds its state from
projections) after an exponential backoff; the message it crashed on is
delivered once more, and dead-lettered if it crashes the actor a second time;
more restarts than the intensity allows within the period stop the kernel.

A batch whose events the journal refuses to seal (``EventUnreadable``: text that
is not UTF-8, a value JSON would not give back) was not recorded at all: its
messages are handled again one at a time by a fresh instance, and the one whose
events cannot be sealed is dead-lettered at once (sealing is deterministic, a
second try would fail the same way). Its caller gets a refusal; the kernel goes on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import anyio
import msgspec
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from kernel.core import flow
from kernel.core.events import (
    ActorRestarted,
    Draft,
    Event,
    MessageDeadLettered,
    Payload,
    ResourceReleased,
    closes_flow,
    closing_of,
)
from kernel.core.flow import FLOW_EVENTS, FlowState, IllegalTransition, StaleVerdict
from kernel.core.ports import Clock
from kernel.core.wall import visible
from kernel.journal.sealing import EventUnreadable
from kernel.state.projections import Projections

log = logging.getLogger(__name__)

M = TypeVar("M")
M_contra = TypeVar("M_contra", contravariant=True)
T = TypeVar("T")

Append = Callable[[Sequence[Draft]], Awaitable[list[Event]]]
Carrier = Callable[["Outbox"], Awaitable[bool]]
"""Records a batch's events in another actor's append, with what its early messages
produced; True once that append committed (``out.committed`` set), False to leave the
batch to its own append (kernel.api: two commits per flow)."""


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
        self._mark = (0, 0)

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
                parent_dfid = parent_dfid or current.parent_dfid
                agent_id = agent_id or current.agent_id
                if after is None and caused_by is None:
                    if staged is not None:
                        after = staged[1]
                    else:
                        caused_by = current.last_seq
            provisional = Event(
                seq=current.last_seq if current else 0,
                ts=self._clock.now_ns(),
                payload=payload,  # type: ignore[arg-type]
                dfid=dfid,
                parent_dfid=parent_dfid,
                agent_id=agent_id,
            )
            if dfid not in self._undo:
                self._undo[dfid] = staged
            state = flow.apply(current, provisional)
            if current is None:
                self._opened.append(dfid)
            if closes_flow(provisional):
                # The FlowClosed it stands for, which every reader will see after it.
                state = flow.apply(state, closing_of(provisional))
            self._overlay[dfid] = (state, index)
            if state.terminal and (current is None or not current.terminal):
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
        if ended is not None and ended.dfid in self._projections.reservations:
            self._release(ended, index)
        return index

    def _release(self, ended: FlowState, index: int) -> None:
        # Whoever records the end of a flow releases what it held, in the same append:
        # a reservation can then never outlive its flow, on any path to an end.
        held = self._projections.reservations[ended.dfid]
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
            provisional = Event(
                seq=current.last_seq if current else 0,
                ts=self._clock.now_ns(),
                payload=draft.payload,
                dfid=dfid,
                parent_dfid=draft.parent_dfid,
                agent_id=draft.agent_id,
            )
            if dfid not in self._undo:
                self._undo[dfid] = staged
            state = flow.apply(current, provisional)
            if closes_flow(provisional):
                state = flow.apply(state, closing_of(provisional))
            self._overlay[dfid] = (state, start + offset)
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
        self._mark = (len(self.drafts), len(self.effects))
        self._undo = {}

    def rollback(self) -> None:
        """Forget what the current message staged (it crashed)."""
        drafts, effects = self._mark
        del self.drafts[drafts:]
        del self.effects[effects:]
        self.early = [e for e in self.early if e[0] < effects]
        for dfid, previous in self._undo.items():
            if previous is None:
                self._overlay.pop(dfid, None)
            else:
                self._overlay[dfid] = previous
        self._undo = {}


class Actor(Protocol[M_contra]):
    """A kernel actor: state plus one ``handle`` of the messages its mailbox carries."""

    async def handle(self, msg: M_contra, out: Outbox) -> None:
        """React to one message by staging events and follow-ups on ``out``."""
        ...


@dataclass(frozen=True)
class ChildSpec(Generic[M]):
    """How to start (and restart) one supervised actor, and the mailbox it reads."""

    name: str
    factory: Callable[[], Actor[M]]
    mailbox: Mailbox[M]
    batch: int = 512


DeadLetterHandler = Callable[[str, Any, BaseException, Outbox], None]


@dataclass
class SupervisorStatistics:
    """Counters since the supervisor started."""

    restarts: int = 0
    dead_letters: int = 0
    batches: int = 0
    messages: int = 0
    restart_times: deque[float] = field(default_factory=deque)


class Supervisor:
    """Runs child actors in one task group, restarting them within a bounded intensity.

    Args:
        specs: the children, started in order.
        append: the journal's append (group commit).
        projections: the state the actors read.
        clock: the kernel's clock, for the provisional times of staged events.
        on_dead_letter: stages what a dead-lettered message entails (abort its flow).
        max_restarts: restarts allowed within ``period_s`` before giving up.
        backoff_s: the first restart delay; each further restart in the period doubles it.
        max_backoff_s: the ceiling of the delay.
        fatal: exception types that are not actor crashes but reasons to stop (journal failure).
        carry: records a batch with early messages (:meth:`Outbox.send_early`) in another
            actor's append when it can; without it they wait for the batch's own commit.
    """

    def __init__(
        self,
        specs: Sequence[ChildSpec[Any]],
        *,
        append: Append,
        projections: Projections,
        clock: Clock,
        on_dead_letter: DeadLetterHandler,
        max_restarts: int = 3,
        period_s: float = 5.0,
        backoff_s: float = 0.01,
        max_backoff_s: float = 1.0,
        fatal: tuple[type[BaseException], ...] = (),
        carry: Carrier | None = None,
    ) -> None:
        self._carry = carry
        self._tg: anyio.abc.TaskGroup | None = None
        self._specs = list(specs)
        self._append = append
        self._projections = projections
        self._clock = clock
        self._on_dead_letter = on_dead_letter
        self._max_restarts = max_restarts
        self._period_s = period_s
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._fatal = fatal
        self.stats = SupervisorStatistics()

    async def run(self) -> None:
        """Run every child until cancelled; raise RestartIntensityExceeded or a fatal error."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for spec in self._specs:
                    tg.start_soon(self._run_child, spec, name=f"actor:{spec.name}")
        except BaseExceptionGroup as group:
            # One child's failure stops them all; report that failure, not the group.
            raise group.exceptions[0] from None

    async def _commit(self, out: Outbox) -> None:
        carried = False
        if out.early and self._carry is not None:
            carried = await self._carry(out)
        if out.drafts and not carried:
            out.committed = await self._append(out.drafts)
        for effect, arg in out.effects:
            result = effect(arg)
            if result is None:
                continue
            if isinstance(result, _Waiting) and self._tg is not None:
                self._tg.start_soon(_wait, result.wait)
            else:
                await result

    async def _run_child(self, spec: ChildSpec[Any]) -> None:
        actor = spec.factory()
        buffer: deque[Any] = deque()
        suspect: Any = None  # the message that crashed the previous instance
        alone = 0  # messages still to handle one per batch, to find one that cannot be sealed
        while True:
            if not buffer:
                buffer.extend(await spec.mailbox.receive_batch(spec.batch))
            out = Outbox(self._projections, self._clock)
            taken: list[Any] = []
            crash: BaseException | None = None
            while buffer and len(taken) < (1 if alone else spec.batch):
                msg = buffer.popleft()
                out.begin()
                try:
                    await actor.handle(msg, out)
                except self._fatal:
                    raise
                except Exception as exc:
                    out.rollback()
                    buffer.appendleft(msg)
                    crash = exc
                    break
                taken.append(msg)
            self.stats.batches += 1
            self.stats.messages += len(taken)
            alone = max(0, alone - len(taken))
            try:
                await self._commit(out)
            except StaleVerdict:
                # The DIM judged against less than precedes its verdict in the journal:
                # nothing was recorded; the same messages are judged again, on what committed.
                buffer.extendleft(reversed(taken))
                actor = spec.factory()
                continue
            except IllegalTransition as conflict:
                # Another actor moved one of these flows first: nothing of this batch was
                # recorded, so a fresh instance handles the same messages again.
                buffer.extendleft(reversed(taken))
                await self._restart(spec, conflict)
                actor = spec.factory()
                continue
            except EventUnreadable as unsealable:
                # Nothing of this batch was recorded, and the instance's state has moved as
                # if it had been: a fresh one takes the messages again. Not a crash of the
                # actor (no restart is counted): input the wall let through, or a bug.
                actor = spec.factory()
                if len(taken) > 1:
                    buffer.extendleft(reversed(taken))
                    alone = len(taken)
                    continue
                await self._dead_letter(spec, taken[0], unsealable)
                continue
            if crash is None:
                continue

            msg = buffer[0]
            log.warning("actor %s crashed on %s: %r", spec.name, type(msg).__name__, crash)
            out = Outbox(self._projections, self._clock)
            if msg is suspect:
                buffer.popleft()
                suspect = None
                self.stats.dead_letters += 1
                out.emit(
                    MessageDeadLettered(
                        actor=spec.name, message=_describe(msg), error=_describe_error(crash)
                    )
                )
                self._on_dead_letter(spec.name, msg, crash, out)
            else:
                suspect = msg
            await self._restart(spec, crash, out)
            actor = spec.factory()

    async def _dead_letter(self, spec: ChildSpec[Any], msg: Any, error: BaseException) -> None:
        """Dead-letter ``msg``: record it, end its flow, answer its caller."""
        log.warning("actor %s could not record %s: %r", spec.name, type(msg).__name__, error)
        self.stats.dead_letters += 1
        out = Outbox(self._projections, self._clock)
        out.emit(
            MessageDeadLettered(
                actor=spec.name, message=_describe(msg), error=_describe_error(error)
            )
        )
        self._on_dead_letter(spec.name, msg, error, out)
        await self._commit(out)

    async def _restart(
        self, spec: ChildSpec[Any], crash: BaseException, out: Outbox | None = None
    ) -> None:
        """Record a restart, enforce the intensity, and back off."""
        out = out or Outbox(self._projections, self._clock)
        restarts = self._count_restart()
        out.emit(ActorRestarted(actor=spec.name, error=_describe_error(crash), restarts=restarts))
        await self._commit(out)
        if restarts > self._max_restarts:
            raise RestartIntensityExceeded(
                f"{restarts} restarts within {self._period_s}s (allowed {self._max_restarts});"
                f" last: actor {spec.name}: {_describe_error(crash)}"
            ) from crash
        await anyio.sleep(min(self._max_backoff_s, self._backoff_s * math.pow(2, restarts - 1)))

    def _count_restart(self) -> int:
        # Intensity is operational, not a decision: real monotonic time is right here.
        now = time.monotonic()
        times = self.stats.restart_times
        times.append(now)
        while times and now - times[0] > self._period_s:
            times.popleft()
        self.stats.restarts += 1
        return len(times)


def _run(fn: Callable[[], Awaitable[None] | None]) -> Awaitable[None] | None:
    return fn()


def _nothing(_: Any) -> None:
    return None


@dataclass(frozen=True)
class _Waiting:
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
        return _Waiting(wait) if wait is not None else None


async def _wait(wait: Awaitable[None]) -> None:
    try:
        await wait
    except MailboxClosed:
        pass  # the kernel is stopping: the flow is recompiled by the next run


def _describe(msg: Any) -> str:
    # Shown through visible(): a message may carry anything, its record may not.
    if isinstance(msg, msgspec.Struct):
        fields = {f: getattr(msg, f) for f in msg.__struct_fields__ if f != "reply"}
        text = f"{type(msg).__name__}({', '.join(f'{k}={v!r}' for k, v in fields.items())})"
        return visible(text[:500])
    return visible(repr(msg)[:500])


def _describe_error(exc: BaseException) -> str:
    return visible(f"{type(exc).__name__}: {exc}"[:500])
