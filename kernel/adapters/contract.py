"""The adapter contract: how accepted intents reach brokers, booking systems and databases.

An adapter is registered with the kernel by name (``adapters={"broker": b}``),
holds its own credentials, and is reachable only from the execution engine:
agent code never sees it. The engine calls it with an :class:`ExecutionIntent`
minted by the kernel from an accepted (or human-approved) proposal.

The contract every adapter keeps:

1. **The key.** Every call carries ``intent.key`` (a hash of dfid, action and
   step). The engine may call ``execute`` more than once with the same key: a
   retry after a transient error, or a resumption after a crash between the
   call and the recorded result. The adapter must therefore either *honour the
   key* (the system behind it deduplicates on it, and a repeated call returns
   the first call's receipt) or offer ``async lookup(key) -> Receipt | None``,
   which the engine asks before any repeated call; an adapter may do both.
2. **Errors are classified.** A failure raises :class:`AdapterError`;
   ``transient=True`` means a retry could succeed (a timeout, a 5xx, a
   throttle), ``transient=False`` means it cannot and that *no effect
   happened* (a refusal, a validation error). ``outcome_unknown`` says whether
   the call may have taken effect (default: ``transient``). Any other exception
   counts as terminal with an unknown outcome. The engine retries transient
   errors with backoff up to the adapter's :class:`RetryPolicy`; an unknown
   outcome is looked up, retried within the intent's validity, or handed to a
   human (OUTCOME_UNKNOWN: reconcile or retry); agents never retry side effects.
3. **Optional live state.** ``async quote(intent) -> Quote`` returns the price
   and market state now; the engine checks the intent's bounds against it just
   before the first call of a key (see :mod:`kernel.adapters.constraints`).
4. **Sagas.** A step's compensation arrives as an intent with
   ``compensation=True``, the same ``step`` and its own key; it obeys the same
   rules (idempotent on its key, classified errors).
5. **Retry budget.** An optional ``retry_policy`` attribute overrides the
   kernel's default :class:`RetryPolicy` for this adapter.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

import msgspec

from kernel.core.events import ExecutionIntent
from kernel.core.text import id_problem
from kernel.core.wall import MAX_DETAIL, InputInvalid, check_value, clip


class Receipt(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """What an adapter returns for an effect it carried out."""

    external_id: str
    detail: dict[str, Any] = {}


def recordable(receipt: Any) -> Receipt:
    """Return an adapter's receipt as the journal can hold it.

    A receipt comes from outside the kernel, like any input: its detail may hold
    a NaN, a huge integer or an object. The effect it reports did happen, so the
    kernel records the success either way; what cannot be recorded is replaced by
    a note saying why, never written as bytes that would not read back.

    Raises:
        TypeError: the adapter returned something other than a Receipt.
    """
    if not isinstance(receipt, Receipt):
        # Whether anything happened is not known: the engine treats this as it treats
        # an exception that is not an AdapterError (outcome unknown).
        raise TypeError(clip(f"the adapter returned {receipt!r}, not a Receipt", 500))
    problem = ""
    try:
        check_value(msgspec.to_builtins(receipt.detail), "$.detail")
    except InputInvalid as exc:
        problem = f"{exc.field}: {exc.detail}"
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        problem = f"not plain data: {exc}"
    external_id = receipt.external_id
    if not isinstance(external_id, str) or len(external_id) > 256 or id_problem(external_id):
        # Recorded with its controls or lone surrogates escaped: the effect did happen.
        external_id = clip(external_id)
    if not problem and external_id is receipt.external_id:
        return receipt
    detail = (
        receipt.detail
        if not problem
        else {
            "unrecorded": clip(f"the receipt's detail could not be recorded: {problem}", MAX_DETAIL)
        }
    )
    # The same type, whatever else it carries (the memory executor's records).
    return msgspec.structs.replace(receipt, external_id=external_id, detail=detail)


class Quote(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """The world as an adapter sees it now: price as a decimal string, market state."""

    price: str | None = None
    market_state: str | None = None


class AdapterError(Exception):
    """An adapter call that failed; ``transient`` says whether a retry could succeed.

    ``outcome_unknown`` says whether the call may have reached the system and
    taken effect (a timeout, a lost connection, a 5xx after the request was
    sent). It defaults to ``transient``: the engine cannot tell a timeout after
    the effect from one before it, so a transient error counts as an unknown
    outcome unless the adapter knows nothing happened (a throttle, a 503 from a
    gateway that never forwarded the request) and says ``outcome_unknown=False``.
    A terminal error means no effect happened, unless it says otherwise.
    """

    def __init__(
        self, message: str, *, transient: bool = False, outcome_unknown: bool | None = None
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.outcome_unknown = transient if outcome_unknown is None else outcome_unknown


class Adapter(Protocol):
    """The port to a broker, a booking system, a database or a notifier.

    Only ``execute`` is required; ``lookup``, ``quote`` and ``retry_policy``
    are optional and found by attribute.
    """

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        """Carry out ``intent`` at most once per ``intent.key``."""
        ...


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How transient adapter errors are retried, and what happens when the budget is spent.

    The delay before retry ``n`` (1-based) is ``min(max_s, base_s * factor**(n-1))``
    shortened by up to ``jitter`` of itself, drawn from the kernel's seeded source.

    Args:
        max_attempts: calls of one key in all, the first included.
        base_s: the first delay.
        factor: growth per retry.
        max_s: the ceiling of a delay.
        jitter: the fraction of a delay that may be cut at random (0 for none).
        on_exhausted: ``"escalate"`` hands the flow to a human (operational
            failure), ``"abort"`` ends it with EXECUTION_FAILED.
    """

    max_attempts: int = 4
    base_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    jitter: float = 0.2
    on_exhausted: Literal["escalate", "abort"] = "escalate"

    def delay_s(self, retry: int, rng: random.Random) -> float:
        """Return the wait before retry ``retry`` (1-based)."""
        delay = min(self.max_s, self.base_s * self.factor ** (retry - 1))
        if self.jitter:
            # Always drawn when jitter is on, so a seed replays the same schedule.
            delay *= 1.0 - self.jitter * rng.random()
        return delay


class SagaStep(msgspec.Struct, frozen=True, kw_only=True):
    """One ordered step of a multi-step intent and how to undo it.

    A policy kind becomes a saga by defining ``steps(self) -> list[SagaStep]``;
    the list must be a pure function of the kind's parameters (recovery
    derives it again from the recorded proposal).

    Args:
        action: what the step does, e.g. ``"book_flight"``; part of its key.
        params: what the adapter receives for the step.
        compensation: what the adapter receives to undo the step; None when
            there is nothing to undo.
    """

    action: str
    params: dict[str, Any] = {}
    compensation: dict[str, Any] | None = None


def idempotency_key(dfid: str, action: str, step: int = 0) -> str:
    """Return the key of one step of one flow's action."""
    return hashlib.sha256(f"{dfid}|{action}|{step}".encode()).hexdigest()[:32]


def compensation_key(dfid: str, action: str, step: int) -> str:
    """Return the key of the compensation of one completed step."""
    return idempotency_key(dfid, f"compensate:{action}", step)


Call = Callable[[], Awaitable[None]]


class CallPool:
    """Runs adapter calls on long-lived worker tasks instead of a new task per call.

    Starting a task per call (with its cancel scope and wrapper coroutine) cost
    more than the no-op adapter call itself in the P1 profile. Up to ``size``
    workers are started on demand through ``spawn`` and then kept (the kernel
    sizes it to the flows it admits at once, each has at most one call in
    flight); a call finds an idle worker, or starts one, or, when all ``size``
    are busy, gets a task of its own: a slow adapter never queues the calls of
    others.

    Args:
        spawn: starts a coroutine function in the kernel's effects task group.
        size: the most workers kept.
    """

    def __init__(self, spawn: Callable[[Call], None], size: int = 64) -> None:
        self._spawn = spawn
        self._size = size
        self._workers = 0
        self._idle: list[_Slot] = []

    def __call__(self, fn: Call) -> None:
        """Run ``fn`` soon, beside the caller."""
        if self._idle:
            slot = self._idle.pop()
            slot.call = fn
            slot.wake.set()
        elif self._workers < self._size:
            self._workers += 1
            self._spawn(lambda: self._work(fn))
        else:
            self._spawn(fn)

    def statistics(self) -> tuple[int, int]:
        """Return (workers, idle workers)."""
        return self._workers, len(self._idle)

    async def _work(self, fn: Call) -> None:
        slot: _Slot | None = None
        try:
            while True:
                await fn()
                slot = _Slot()
                self._idle.append(slot)
                await slot.wake.wait()
                assert slot.call is not None
                fn, slot = slot.call, None
        finally:
            self._workers -= 1
            if slot is not None and slot in self._idle:
                self._idle.remove(slot)


class _Slot:
    """An idle worker: the call handed to it, and its wake-up."""

    __slots__ = ("call", "wake")

    def __init__(self) -> None:
        self.call: Call | None = None
        self.wake = asyncio.Event()  # asyncio's own: anyio.Event() looks up the backend each time
