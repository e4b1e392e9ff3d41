"""The examples' clock: simulated time on the kernel's clock port, never wall time."""

from __future__ import annotations

import anyio.lowlevel

MARKET_OPEN_NS = 1_709_562_600_000_000_000
"""09:30 New York time on 2024-03-04: minute 0 of every simulated day."""


class SimClock:
    """The simulation's clock: the driver sets the minute, and a sleep jumps time ahead.

    Jumping (trio's ``MockClock`` with ``autojump_threshold=0``) is deterministic
    here because the driver lets one flow move at a time: the only sleeper is the
    flow's own broker latency or retry backoff.
    """

    def __init__(self, start_ns: int = MARKET_OPEN_NS) -> None:
        self._now = start_ns

    def now_ns(self) -> int:
        return self._now

    async def sleep(self, seconds: float) -> None:
        self._now = max(self._now, self._now + int(seconds * 1e9))
        await anyio.lowlevel.checkpoint()

    def at_minute(self, minute: int) -> None:
        """Move to the start of ``minute`` of the day (never backwards)."""
        self._now = max(self._now, MARKET_OPEN_NS + minute * 60_000_000_000)
