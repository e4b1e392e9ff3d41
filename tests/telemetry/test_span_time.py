"""Span times on the clock a viewer searches by: the wall clock when the journal's is simulated.

The examples run on a 2024 clock and the test kernels on one of November 2023; a viewer's
default range (Jaeger: the last hour, Phoenix: the last seven days) finds none of it. By
default ("auto") a live kernel whose clock is far from the wall clock moves each flow onto
the wall clock by one shift; everything else a span says stays as projected.
"""

from __future__ import annotations

import calendar
import itertools
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from kernel import FlowStatus
from kernel.core.events import Event
from kernel.telemetry import SpanTime, Telemetry, export_flows, spans_for_events
from kernel.telemetry._clock import (
    JOURNAL_TIME,
    SPAN_TIMES,
    WALL_SKEW_NS,
    SpanClock,
    iso_utc,
    span_time_from_env,
)
from kernel.telemetry._sink import Collector
from kernel.testing import action_of
from tests.support.helpers import ScriptedAgent, kernel_for, transfer
from tests.support.hostile import hostile_text
from tests.telemetry.test_telemetry import VARIED, JournalBuilder, executed_flow
from tests.telemetry.test_telemetry_ports import points

NOW = 1_790_000_000_000_000_000  # the tests' wall clock: September 2026
SECOND = 1_000_000_000


def moved(events: Sequence[Event], to_ns: int) -> list[Event]:
    """``events`` recorded as if the journal's clock had started at ``to_ns``."""
    delta = to_ns - events[0].ts
    return [msgspec.structs.replace(e, ts=e.ts + delta) for e in events]


def telemetry_at(
    collector: Collector, mode: SpanTime = "auto", wall: int = NOW, **kw: Any
) -> Telemetry:
    """Telemetry into ``collector`` whose wall clock stands still at ``wall``."""
    telemetry = Telemetry(collector, sampler=ALWAYS_ON, span_time=mode, **kw)
    telemetry._span_clock = SpanClock(mode, wall=lambda: wall)
    return telemetry


def by_id(spans: Iterable[ReadableSpan]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in spans if s.context}


def without_time(span: ReadableSpan) -> dict[str, Any]:
    """What a span says besides its times and its recorded time."""
    attrs = {k: v for k, v in (span.attributes or {}).items() if k != JOURNAL_TIME}
    return {
        "name": span.name,
        "parent": span.parent.span_id if span.parent else None,
        "attrs": attrs,
        "links": [(link.context.trace_id, link.context.span_id) for link in span.links],
        "status": (span.status.status_code, span.status.description),
        "events": [(e.name, dict(e.attributes or {})) for e in span.events],
    }


def shifts_by_trace(
    spans: Iterable[ReadableSpan], recorded: dict[int, ReadableSpan]
) -> dict[int, set[int]]:
    """Per trace, every distance between a span's times (and its events') and the recorded."""
    shifts: dict[int, set[int]] = defaultdict(set)
    for span in spans:
        assert span.context is not None
        want = recorded[span.context.span_id]
        distances = {
            (span.start_time or 0) - (want.start_time or 0),
            (span.end_time or 0) - (want.end_time or 0),
        }
        distances |= {
            a.timestamp - b.timestamp for a, b in zip(span.events, want.events, strict=True)
        }
        shifts[span.context.trace_id] |= distances
    return shifts


# --- auto: the recorded times when they are the wall clock's ---------------------------


def test_a_journal_on_the_wall_clock_keeps_its_recorded_times_exactly() -> None:
    events = moved(VARIED, NOW - 2 * SECOND)  # a real clock: seconds behind the wall
    collector = Collector()

    telemetry_at(collector).emit(events)

    recorded = by_id(spans_for_events(events))
    assert {sid: s.to_json() for sid, s in by_id(collector.spans).items()} == {
        sid: s.to_json() for sid, s in recorded.items()
    }
    assert not [s for s in collector.spans if JOURNAL_TIME in (s.attributes or {})]


# --- auto on a simulated clock: each flow moves as one --------------------------------


@settings(max_examples=30, derandomize=True, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(VARIED)), max_size=6))
def test_a_simulated_journal_moves_onto_the_wall_clock_one_shift_per_flow(
    cuts: list[int],
) -> None:
    assert NOW - VARIED[-1].ts > WALL_SKEW_NS  # VARIED is recorded in November 2023
    collector = Collector()
    telemetry = telemetry_at(collector)
    for start, stop in itertools.pairwise([0, *sorted(cuts), len(VARIED)]):
        telemetry.emit(VARIED[start:stop])

    recorded = by_id(spans_for_events(VARIED))
    live = by_id(collector.spans)
    assert live.keys() == recorded.keys()
    for sid, span in live.items():
        # Ids, names, parents, links, status and attributes: as projected.
        assert without_time(span) == without_time(recorded[sid])
        assert (span.attributes or {})[JOURNAL_TIME] == iso_utc(recorded[sid].start_time or 0)
    for trace, shifts in shifts_by_trace(collector.spans, recorded).items():
        (shift,) = shifts  # durations, order and event times within a flow: the journal's
        assert shift > 0, f"trace {trace:032x} was not moved"
    # Each flow begins where the wall clock stood as it was projected (the test's stands
    # still; its later stages are as far after as the journal says).
    roots = [s for s in collector.spans if s.parent is None]
    assert all(NOW - SECOND <= (s.start_time or 0) <= NOW for s in roots)
    assert telemetry._span_clock.open_flows <= telemetry._projector.open_flows


def test_journal_time_is_the_recorded_time_as_it_was() -> None:
    collector = Collector()
    telemetry_at(collector, "journal").emit(VARIED)

    assert {sid: s.to_json() for sid, s in by_id(collector.spans).items()} == {
        sid: s.to_json() for sid, s in by_id(spans_for_events(VARIED)).items()
    }


def test_wall_time_moves_even_a_journal_on_the_wall_clock() -> None:
    events = moved(VARIED, NOW - 2 * SECOND)
    collector = Collector()
    telemetry_at(collector, "wall").emit(events)

    recorded = by_id(spans_for_events(events))
    shifts = shifts_by_trace(collector.spans, recorded)
    assert set().union(*shifts.values()) == {NOW - events[-1].ts}


def test_a_flow_remembers_its_shift_until_it_ends_and_no_longer() -> None:
    collector = Collector()
    telemetry = telemetry_at(collector)
    telemetry.emit(VARIED)
    assert telemetry._projector.open_flows == 0
    assert telemetry._span_clock.open_flows == 0


# --- re-export ---------------------------------------------------------------------------


def test_a_re_export_keeps_the_recorded_times_unless_told_to_end_now() -> None:
    recorded = by_id(spans_for_events(VARIED))
    exporter = InMemorySpanExporter()
    export_flows(VARIED, SimpleSpanProcessor(exporter), span_time="auto")
    assert {sid: s.to_json() for sid, s in by_id(exporter.get_finished_spans()).items()} == {
        sid: s.to_json() for sid, s in recorded.items()
    }

    walled = InMemorySpanExporter()
    before = time.time_ns()
    export_flows(VARIED, SimpleSpanProcessor(walled), env={"DIRK_SPAN_TIME": "wall"})
    after = time.time_ns()
    spans = walled.get_finished_spans()
    # One shift for the whole export: the newest event lands now, every distance kept.
    (shift,) = set().union(*shifts_by_trace(spans, recorded).values())
    assert before <= VARIED[-1].ts + shift <= after
    for sid, span in by_id(spans).items():
        assert without_time(span) == without_time(recorded[sid])


# --- configuration ---------------------------------------------------------------------


def test_the_span_clock_is_chosen_in_code_or_by_dirk_span_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert Telemetry(None).span_time == "auto"
    assert Telemetry.from_env({}).span_time == "auto"
    assert Telemetry.from_env({"DIRK_SPAN_TIME": " Journal "}).span_time == "journal"
    assert Telemetry.from_env({"DIRK_SPAN_TIME": "wall"}, span_time="journal").span_time == (
        "journal"
    )
    with caplog.at_level(logging.WARNING):
        assert Telemetry.from_env({"DIRK_SPAN_TIME": "simulated"}).span_time == "auto"
    assert "DIRK_SPAN_TIME='simulated' names no span clock" in caplog.text
    with pytest.raises(ValueError, match="span_time must be one of auto, wall, journal"):
        Telemetry(None, span_time="simulated")  # type: ignore[arg-type]


@settings(max_examples=80, derandomize=True, deadline=None)
@given(value=hostile_text())
def test_any_dirk_span_time_value_starts_telemetry(value: str) -> None:
    assert span_time_from_env({"DIRK_SPAN_TIME": value}) in SPAN_TIMES


@settings(max_examples=80, derandomize=True, deadline=None)
@given(ns=st.integers(min_value=-(2**80), max_value=2**80))
def test_a_recorded_time_is_always_written_somehow(ns: int) -> None:
    text = iso_utc(ns)
    assert text
    if 0 <= ns < 4_000_000_000 * SECOND:
        assert text.endswith("Z") and len(text) == len("2024-03-04T09:30:00.000000Z")


def test_iso_utc_keeps_microseconds() -> None:
    assert iso_utc(0) == "1970-01-01T00:00:00.000000Z"
    assert iso_utc(1_709_544_600_123_456_789) == "2024-03-04T09:30:00.123456Z"


# --- a restarted kernel on a simulated clock ------------------------------------------------


async def test_a_restarted_kernel_sends_what_it_resumes_on_its_own_shift(tmp_path: Path) -> None:
    """Spans sent again after a restart keep their ids and content; on the wall clock they
    take the new run's place (the earlier run's shift is not recorded anywhere)."""
    path = tmp_path / "j.db"
    first = InMemorySpanExporter()
    async with kernel_for(path, telemetry=Telemetry(SimpleSpanProcessor(first))) as kernel:
        await kernel.register(ScriptedAgent(steps=[transfer(confidence=0.2)]))
        [dfid] = await kernel.trigger("bank.invoice")
        await kernel.wait_flow(dfid)
    waiting = by_id(first.get_finished_spans())
    assert len(waiting) == 4  # root, context, invoke_agent, judge

    second = InMemorySpanExporter()
    async with kernel_for(path, telemetry=Telemetry(SimpleSpanProcessor(second))) as kernel:
        await kernel.decide(
            dfid, "override", operator="ana", reason="ok", action_hash=action_of(kernel, dfid)
        )
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
    again = by_id(second.get_finished_spans())

    assert waiting.keys() < again.keys()
    for sid, span in waiting.items():
        assert without_time(again[sid]) == without_time(span)
        assert (again[sid].attributes or {})[JOURNAL_TIME] == (span.attributes or {})[JOURNAL_TIME]
    # The second run moved the whole flow, what it sent again and what it added, as one.
    shifts = [
        (span.start_time or 0) - recorded_ns((span.attributes or {})[JOURNAL_TIME])
        for span in again.values()
    ]
    assert max(shifts) - min(shifts) < 1000  # the recorded text keeps microseconds


def recorded_ns(text: Any) -> int:
    """Nanoseconds since the epoch of an ``iso_utc`` text (to the microsecond)."""
    stamp, _, micro = str(text).removesuffix("Z").partition(".")
    seconds = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    return seconds * SECOND + int(micro) * 1000


def test_spans_held_from_a_resume_leave_with_the_first_live_batch_and_are_not_counted_again() -> (
    None
):
    j = JournalBuilder()
    executed_flow(j)
    *earlier, closed = j.events  # an earlier run executed it; this one records its close
    reader = InMemoryMetricReader()
    collector = Collector()
    telemetry = telemetry_at(collector, meter_provider=MeterProvider([reader]))

    telemetry.resume(earlier)
    assert collector.spans == [], "held until a live batch shows where the clock stands"
    telemetry.emit([closed])

    recorded = by_id(spans_for_events(j.events))
    assert by_id(collector.spans).keys() == recorded.keys()
    (shift,) = set().union(*shifts_by_trace(collector.spans, recorded).values())
    assert shift == NOW - closed.ts
    assert not points(reader, "dir.execution.duration"), "counted by the run that executed it"
    assert telemetry.shutdown()


def test_held_spans_leave_on_their_recorded_times_if_no_live_batch_comes() -> None:
    j = JournalBuilder()
    executed_flow(j)
    collector = Collector()
    telemetry = telemetry_at(collector)
    telemetry.resume(j.events[:-1])

    assert telemetry.shutdown()

    recorded = by_id(spans_for_events(j.events[:-1]))
    assert {sid: s.to_json() for sid, s in by_id(collector.spans).items()} == {
        sid: s.to_json() for sid, s in recorded.items()
    }
