"""Which clock a span's times are on: the journal's, or the wall clock a viewer searches by.

Spans are projected from recorded events, so their natural times are the events'
``ts``: the kernel's clock. On the system clock that is the wall clock and nothing
needs doing. On a simulated clock (the examples run in March 2024) a viewer's
default range (Jaeger's last hour, Phoenix's last seven days) finds nothing, so
the spans move onto the wall clock:

- ``"journal"``: spans carry the recorded times, exactly; live and re-exported alike.
- ``"wall"``: each flow moves by one shift, the distance between the wall clock and
  the journal's clock when this process first projects the flow (live: as it
  begins; a re-export: the distance to the newest event exported, so the export
  ends now and keeps every distance between flows). Durations and order within
  a flow are the journal's; each moved span carries its recorded start as
  ``dir.journal_time``.
- ``"auto"`` (the default): ``"wall"`` for a live kernel whose clock is further than
  :data:`WALL_SKEW_NS` from the wall clock, ``"journal"`` otherwise. A re-export keeps
  the recorded times: it cannot tell a simulated clock from a real one long past.

Ids, names, attributes and links never depend on the choice: only the span times do,
so a re-export is as deterministic as before in everything it derives from events.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

from kernel.telemetry._project import SpanRecord

__all__ = [
    "SPAN_TIMES",
    "WALL_SKEW_NS",
    "SpanClock",
    "SpanTime",
    "span_time_from_env",
]

_log = logging.getLogger(__name__)

SpanTime = Literal["auto", "wall", "journal"]
"""The clock of span times: see :mod:`kernel.telemetry._clock`."""

SPAN_TIMES: tuple[SpanTime, ...] = ("auto", "wall", "journal")

ENV = "DIRK_SPAN_TIME"
"""The environment variable that chooses the span clock when no code does."""

WALL_SKEW_NS = 5 * 60 * 1_000_000_000
"""How far (5 minutes) a live journal's clock may be from the wall clock before ``"auto"``
moves its spans. A real clock is milliseconds off (the projection's lag); a simulated
one, months or years."""

JOURNAL_TIME = "dir.journal_time"
"""The attribute of a moved span that keeps its recorded start (ISO 8601, UTC, µs)."""


def check_span_time(value: str) -> SpanTime:
    """Return ``value`` as a span clock.

    Raises:
        ValueError: ``value`` names no span clock.
    """
    for known in SPAN_TIMES:
        if value == known:
            return known
    raise ValueError(f"span_time must be one of {', '.join(SPAN_TIMES)}, not {value!r}")


def span_time_from_env(env: Mapping[str, str]) -> SpanTime:
    """Return the span clock ``DIRK_SPAN_TIME`` in ``env`` names ("auto" if none).

    A value that names none is reported in the log and "auto" is used: a typo in an
    environment variable must not keep a kernel from starting.
    """
    raw = (env.get(ENV) or "").strip().lower()
    if not raw:
        return "auto"
    try:
        return check_span_time(raw)
    except ValueError:
        _log.warning("%s=%r names no span clock (%s): using auto", ENV, raw, "/".join(SPAN_TIMES))
        return "auto"


def iso_utc(ns: int) -> str:
    """Return ``ns`` since the epoch as ISO 8601 in UTC, to the microsecond."""
    seconds, rest = divmod(ns, 1_000_000_000)
    try:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    except (OverflowError, OSError, ValueError):
        return str(ns)  # past what the platform's calendar holds: the number itself
    return f"{text}.{rest // 1000:06d}Z"


class SpanClock:
    """Place span records on the chosen clock, one shift per flow, kept until it ends.

    Args:
        mode: the span clock.
        wall: the wall clock, ns since the epoch (tests give their own).
    """

    def __init__(self, mode: SpanTime = "auto", wall: Callable[[], int] = time.time_ns) -> None:
        self.mode = check_span_time(mode)
        self._wall = wall
        self._shifts: dict[str, int] = {}

    @property
    def open_flows(self) -> int:
        """The flows whose shift is remembered (begun, not yet ended)."""
        return len(self._shifts)

    def _skew(self, newest_ts: int | None, live: bool) -> int:
        if newest_ts is None:
            return 0  # nothing recorded to measure against: keep the recorded times
        skew = self._wall() - newest_ts
        if self.mode == "wall" or (live and abs(skew) > WALL_SKEW_NS):
            return skew
        return 0

    def place(
        self,
        records: Iterable[SpanRecord],
        newest_ts: int | None,
        *,
        live: bool,
        is_open: Callable[[str], bool],
    ) -> None:
        """Move ``records`` in place onto this clock.

        ``newest_ts`` is the recorded time of the newest event behind them (what the
        journal's clock said last); ``live`` says whether they were just committed
        (the kernel running) rather than read back (an export); ``is_open(dfid)``
        whether a flow goes on after them (its shift is kept for its later spans).
        """
        if self.mode == "journal":
            return
        shifts = self._shifts
        skew: int | None = None
        for record in records:
            dfid = record.dfid
            shift = shifts.get(dfid)
            if shift is None:
                if skew is None:
                    skew = self._skew(newest_ts, live)
                shift = skew
                # Not for a flow already over (a late child's marker in an ended
                # parent's trace, say): nothing would ever forget it.
                if is_open(dfid):
                    shifts[dfid] = shift
            elif record.final:
                del shifts[dfid]
            if shift:
                record.attrs[JOURNAL_TIME] = iso_utc(record.start)
                record.start += shift
                record.end += shift
                if record.events:
                    record.events = [(n, a, ts + shift) for n, a, ts in record.events]
