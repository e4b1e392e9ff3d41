"""Ports through which time, randomness and identifiers reach the kernel.

Deterministic code never calls ``time.time()``, ``uuid.uuid4()`` or ``secrets``
directly: it is handed a :class:`Clock` and an :class:`IdSource`, so tests can
drive time by hand and simulations can be replayed from a seed.
"""

from __future__ import annotations

import random
import secrets
import time
import uuid
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


class RandomIds:
    """Ids from the operating system's randomness (the default)."""

    def new_dfid(self) -> str:
        return str(uuid.uuid4())

    def new_token(self) -> str:
        return secrets.token_urlsafe(32)


class SeededIds:
    """Reproducible ids for simulations and tests; never use its tokens in production."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def new_dfid(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def new_token(self) -> str:
        return self._rng.getrandbits(256).to_bytes(32, "big").hex()
