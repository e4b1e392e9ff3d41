"""Histogram buckets fit what they measure: a commit of 0.2 ms and one of 3 ms are told apart.

With the SDK's default bounds (0, 5, 10, 25 ... 10,000) every journal commit fell in the one
bucket (0, 5] seconds. Each instrument now advises its own bounds, which an application's
View may still override.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

from kernel.core.events import Draft, TriggerFired
from kernel.journal.opening import open_journal
from kernel.telemetry import Telemetry
from kernel.telemetry._metrics import (
    BATCH_BUCKETS,
    COMMIT_BUCKETS,
    EXECUTION_BUCKETS,
    WAIT_BUCKETS,
)
from tests.telemetry.test_telemetry import VARIED
from tests.telemetry.test_telemetry_ports import points

US = 1_000
MS = 1_000_000


def note(i: int) -> Draft:
    return Draft(payload=TriggerFired(topic="t", facts={"i": i}))


def stopwatch(*durations_ns: int) -> Iterator[int]:
    """A monotonic clock read twice per commit, so that commit k lasts ``durations_ns[k]``."""
    now = 0
    for duration in durations_ns:
        yield now
        now += duration
        yield now
        now += 10 * MS  # between commits


def bucket_of(bounds: tuple[float, ...] | list[float], seconds: float) -> int:
    """The index of the bucket ``seconds`` falls in: (bounds[i-1], bounds[i]]."""
    return bisect.bisect_left(bounds, seconds)


async def test_journal_commits_of_two_tenths_and_three_milliseconds_land_in_different_buckets(
    tmp_path: Path,
) -> None:
    reader = InMemoryMetricReader()
    telemetry = Telemetry(None, meter_provider=MeterProvider([reader]))
    metrics = telemetry._metrics
    assert metrics is not None
    ticks = stopwatch(200 * US, 3 * MS)
    async with open_journal(tmp_path / "j.db") as journal:
        # Real transactions; only the stopwatch around them is the test's.
        journal.observe_commits(metrics.committed, clock=lambda: next(ticks))
        await journal.append([note(1)])
        await journal.append([note(2), note(3)])
        assert journal.statistics().transactions == 2

    [point] = points(reader, "dir.journal.commit.duration")
    assert tuple(point.explicit_bounds) == COMMIT_BUCKETS
    assert point.count == 2
    assert point.sum == 0.0002 + 0.003
    fast, slow = bucket_of(COMMIT_BUCKETS, 0.0002), bucket_of(COMMIT_BUCKETS, 0.003)
    assert fast != slow
    counts = list(point.bucket_counts)
    assert counts[fast] == counts[slow] == 1
    assert sum(counts) == 2


async def test_every_real_commit_is_counted_in_a_bucket_under_a_second(tmp_path: Path) -> None:
    reader = InMemoryMetricReader()
    telemetry = Telemetry(None, meter_provider=MeterProvider([reader]))
    async with open_journal(tmp_path / "j.db") as journal:
        telemetry.install(journal, dict)
        for i in range(5):
            await journal.append([note(i)])
    [point] = points(reader, "dir.journal.commit.duration")
    assert point.count == 5
    # Below the bucket that ends at a second: the default bounds put all in one (0, 5].
    assert sum(point.bucket_counts[: bucket_of(COMMIT_BUCKETS, 1.0) + 1]) == 5


def test_each_histogram_advises_bounds_for_what_it_measures() -> None:
    reader = InMemoryMetricReader()
    telemetry = Telemetry(None, meter_provider=MeterProvider([reader]))
    telemetry.emit(VARIED)  # escalation waits, executions, batches
    assert telemetry._metrics is not None
    telemetry._metrics.committed(1, 300 * US)

    bounds = {
        name: tuple(points(reader, name)[0].explicit_bounds)
        for name in (
            "dir.journal.commit.duration",
            "dir.execution.duration",
            "dir.escalation.wait",
            "dir.journal.batch_size",
        )
    }
    assert bounds == {
        "dir.journal.commit.duration": COMMIT_BUCKETS,
        "dir.execution.duration": EXECUTION_BUCKETS,
        "dir.escalation.wait": WAIT_BUCKETS,
        "dir.journal.batch_size": BATCH_BUCKETS,
    }
    # From tens of microseconds up for the machine; from a second to a week for people.
    assert COMMIT_BUCKETS[0] <= 0.0001 and EXECUTION_BUCKETS[-1] >= 60
    assert WAIT_BUCKETS[0] == 1 and WAIT_BUCKETS[-1] == 7 * 86400
    for ladder in bounds.values():
        assert list(ladder) == sorted(set(ladder))


def test_an_applications_view_still_wins_over_the_advice() -> None:
    reader = InMemoryMetricReader()
    view = View(
        instrument_name="dir.journal.commit.duration",
        aggregation=ExplicitBucketHistogramAggregation(boundaries=(0.01, 1.0)),
    )
    telemetry = Telemetry(None, meter_provider=MeterProvider([reader], views=[view]))
    assert telemetry._metrics is not None
    telemetry._metrics.committed(1, 2 * MS)
    point: Any = points(reader, "dir.journal.commit.duration")[0]
    assert tuple(point.explicit_bounds) == (0.01, 1.0)
