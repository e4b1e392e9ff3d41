"""Ports through which time, randomness and identifiers reach the kernel.

Deterministic code never calls ``time.time()``, ``uuid.uuid4()`` or ``secrets``
directly: it is handed a :class:`Clock` and an :class:`IdSource`, so tests can
drive time by hand and simulations can be replayed from a seed.
"""

from __future__ import annotations

import os
import random
import secrets
import time
from typing import Protocol

import anyio


class Clock(Protocol):
    """Where the kernel reads the time and waits for it to pass."""

    def now_ns(self) -> int:
        """Return wall-clock time in nanoseconds since the epoch."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait until ``seconds`` have passed on this clock."""
        ...


class SystemClock:
    """The real clock."""

    def now_ns(self) -> int:
        return time.time_ns()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


class ManualClock:
    """A clock that moves only when told to; sleepers wake when it passes their deadline.

    The model is trio's ``MockClock``: tests of validity windows, budgets and
    backoff advance time explicitly instead of sleeping.
    """

    def __init__(self, start_ns: int = 1_700_000_000_000_000_000) -> None:
        self._now = start_ns
        self._sleepers: list[tuple[int, anyio.Event]] = []

    def now_ns(self) -> int:
        return self._now

    async def sleep(self, seconds: float) -> None:
        deadline = self._now + int(seconds * 1e9)
        if deadline <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        wake = anyio.Event()
        self._sleepers.append((deadline, wake))
        await wake.wait()

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has passed."""
        self._now += int(seconds * 1e9)
        due = [s for s in self._sleepers if s[0] <= self._now]
        self._sleepers = [s for s in self._sleepers if s[0] > self._now]
        for _, wake in due:
            wake.set()


class IdSource(Protocol):
    """Where DFIDs and session tokens come from."""

    def new_dfid(self) -> str:
        """Return a fresh DecisionFlow id (a UUID string)."""
        ...

    def new_token(self) -> str:
        """Return a fresh, unguessable session token."""
        ...


_VERSION_4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_VERSION_4_SET = (0x4000 << 64) | (0x8000 << 48)


def uuid4_text(bits: int) -> str:
    """Return ``str(uuid.UUID(int=bits, version=4))`` without building a UUID object.

    Every flow's id went through ``uuid.UUID``, whose checks and properties cost
    more than the formatting itself.
    """
    text = f"{(bits & _VERSION_4_CLEAR) | _VERSION_4_SET:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


_VERSION_7 = (0x7000 << 64) | (0x8000 << 48)
_RAND_A = 0xFFF
_RAND_B = (1 << 62) - 1
_MS = (1 << 48) - 1


def uuid7_text(ms: int, counter: int, rand: int) -> str:
    """Return the text of a UUIDv7 (RFC 9562): ``ms`` in the top 48 bits, then ``counter``.

    ``counter`` (12 bits, ``rand_a``) orders ids made in the same millisecond; ``rand`` fills
    the 62 bits after the variant (``rand_b``).
    """
    bits = ((ms & _MS) << 80) | ((counter & _RAND_A) << 64) | (rand & _RAND_B) | _VERSION_7
    text = f"{bits:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


class _TimeOrder:
    """The millisecond and counter of the next time-ordered id: never going backwards.

    Why time-ordered: the journal indexes every event by its DFID (``events_dfid``). Random
    ids put each insert on a random page of that index, so a busy journal reads and
    rewrites pages all over the file (31.8 KB read and 24.2 KB written per flow in P1,
    docs/benchmarks.md); ids that grow with time land on the index's last page. Ids
    already in a journal are recorded, so replay and verify never make one again.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._ms = -1
        self._counter = 0

    def next(self) -> tuple[int, int]:
        ms = self._clock.now_ns() // 1_000_000
        if ms > self._ms:
            self._ms, self._counter = ms, 0
        elif self._counter < _RAND_A:
            # Same millisecond (or the clock stepped back): count on from the last id.
            self._counter += 1
        else:
            # 4,096 ids in one millisecond: borrow the next one, as RFC 9562 allows.
            self._ms, self._counter = self._ms + 1, 0
        return self._ms, self._counter


class RandomIds:
    """Ids from the operating system's randomness (the default).

    DFIDs are UUIDv7: the time from ``clock`` (the system clock unless given) orders them,
    74 bits of ``os.urandom`` (counter aside) make them unguessable enough to be unique.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self._order = _TimeOrder(clock if clock is not None else SystemClock())

    def new_dfid(self) -> str:
        ms, counter = self._order.next()
        return uuid7_text(ms, counter, int.from_bytes(os.urandom(8)))

    def new_token(self) -> str:
        return secrets.token_urlsafe(32)


class SeededIds:
    """Reproducible ids for simulations and tests; never use its tokens in production.

    Without a clock DFIDs are UUIDv4 drawn from the seed (as every seeded run before made
    them, so recorded runs and examples keep their ids); with one they are UUIDv7, time
    from that clock (a :class:`ManualClock` keeps them reproducible) and the rest from the
    seed.
    """

    def __init__(self, seed: int, clock: Clock | None = None) -> None:
        self.seed = seed
        self._rng = random.Random(seed)
        self._order = _TimeOrder(clock) if clock is not None else None

    def new_dfid(self) -> str:
        if self._order is None:
            return uuid4_text(self._rng.getrandbits(128))
        ms, counter = self._order.next()
        return uuid7_text(ms, counter, self._rng.getrandbits(62))

    def new_token(self) -> str:
        return self._rng.getrandbits(256).to_bytes(32, "big").hex()
