"""The supervisor that keeps a kernel's actors running, Erlang/OTP style.

It runs its children in one task group: a child that crashes is replaced by a fresh
instance (which rebuilds its state from projections) after an exponential backoff;
the message it crashed on is delivered once more, and dead-lettered if it crashes
the actor a second time; more restarts than the intensity allows within the period
stop the kernel.

A batch whose events the journal refuses to seal (``EventUnreadable``: text that
is not UTF-8, a value JSON would not give back) was not recorded at all: its
messages are handled again one at a time by a fresh instance, and the one whose
events cannot be sealed is dead-lettered at once (sealing is deterministic, a
second try would fail the same way). Its caller gets a refusal; the kernel goes on.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import anyio
import msgspec

from kernel.core.events import (
    ActorRestarted,
    MessageDeadLettered,
)
from kernel.core.flow import IllegalTransition, StaleVerdict
from kernel.core.ports import Clock
from kernel.core.wall import visible
from kernel.journal.sealing import EventUnreadable
from kernel.runtime.actors import (
    Append,
    Carrier,
    Mailbox,
    MailboxClosed,
    Outbox,
    RestartIntensityExceeded,
    Waiting,
)
from kernel.state.projections import Projections

log = logging.getLogger("kernel.runtime.actors")

M = TypeVar("M")
M_contra = TypeVar("M_contra", contravariant=True)


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
        lazy: a batch whose every event is of flows marked lazy (:meth:`Outbox.commit_lazily`)
            commits without a sync of its own (``Storage.group_reads``); False: each syncs.
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
        lazy: bool = False,
    ) -> None:
        self._carry = carry
        self._lazy = lazy
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
            # A read-only flow's batch commits without a sync of its own (group reads).
            durable = not self._lazy or out.durable
            out.committed = await self._append(out.drafts, durable=durable)
        for effect, arg in out.effects:
            result = effect(arg)
            if result is None:
                continue
            if isinstance(result, Waiting) and self._tg is not None:
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
            taken, crash = await self._handle(actor, buffer, out, 1 if alone else spec.batch)
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
            suspect = await self._crashed(spec, buffer, crash, suspect)
            actor = spec.factory()

    async def _handle(
        self, actor: Any, buffer: deque[Any], out: Outbox, limit: int
    ) -> tuple[list[Any], BaseException | None]:
        """Stage up to ``limit`` messages of ``buffer``; return them and the crash, if any.

        A message that crashes the actor is rolled back and put back at the front.
        """
        taken: list[Any] = []
        while buffer and len(taken) < limit:
            msg = buffer.popleft()
            out.begin()
            try:
                await actor.handle(msg, out)
            except self._fatal:
                raise
            except Exception as exc:
                out.rollback()
                buffer.appendleft(msg)
                return taken, exc
            taken.append(msg)
        return taken, None

    async def _crashed(
        self, spec: ChildSpec[Any], buffer: deque[Any], crash: BaseException, suspect: Any
    ) -> Any:
        """Restart after a crash on ``buffer[0]``; return the message now suspect.

        A message that crashed the previous instance too is dead-lettered.
        """
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
        return suspect

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


def _describe(msg: Any) -> str:
    # Shown through visible(): a message may carry anything, its record may not.
    if isinstance(msg, msgspec.Struct):
        fields = {f: getattr(msg, f) for f in msg.__struct_fields__ if f != "reply"}
        text = f"{type(msg).__name__}({', '.join(f'{k}={v!r}' for k, v in fields.items())})"
        return visible(text[:500])
    return visible(repr(msg)[:500])


def _describe_error(exc: BaseException) -> str:
    return visible(f"{type(exc).__name__}: {exc}"[:500])


async def _wait(wait: Awaitable[None]) -> None:
    try:
        await wait
    except MailboxClosed:
        pass  # the kernel is stopping: the flow is recompiled by the next run
