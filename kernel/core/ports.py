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


class RandomIds:
    """Ids from the operating system's randomness (the default)."""

    def new_dfid(self) -> str:
        # What uuid.uuid4() does: 16 bytes of os.urandom, version 4, RFC 4122 variant.
        return uuid4_text(int.from_bytes(os.urandom(16)))

    def new_token(self) -> str:
        return secrets.token_urlsafe(32)


class SeededIds:
    """Reproducible ids for simulations and tests; never use its tokens in production."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def new_dfid(self) -> str:
        return uuid4_text(self._rng.getrandbits(128))

    def new_token(self) -> str:
        return self._rng.getrandbits(256).to_bytes(32, "big").hex()
