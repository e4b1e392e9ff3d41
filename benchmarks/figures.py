"""P3 and P5-P8: latency, replay, storage, opening and memory, as Figures.

The runner (``benchmarks.__main__``) measures P3, P5 and P6 once per round
beside B1 and P1, so their ratios pair with the same round's baselines; P7 and
P8 build something big of their own and run after the rounds. The peers (P9,
P14) run within the rounds too: ``benchmarks.peer_rounds``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

from benchmarks.checkpoints import build, measure, open_ready
from benchmarks.flows import BenchmarkFailed, FlowRun
from benchmarks.latency import LatencyRun
from benchmarks.replay import ReplayRun
from benchmarks.report import Figure
from benchmarks.storage import StorageRun

P3_P50_GOAL_US = 800.0  # issue 35 (1,000 before)
P3_P99_GOAL_US = 4_000.0
REPLAY_GOAL = 300_000.0
VERIFY_GOAL = 250_000.0
BYTES_GOAL = 200.0  # issue 35 (300 before)
OPEN_GOAL_S = 1.0
GROWTH_GOAL = 0.10


def latency_figures(runs: list[LatencyRun]) -> list[Figure]:
    """P3: added latency at the offered rate (lower is better, so goals are stated, not met)."""
    rate = runs[0].rate
    shape = {
        "offered_flows_per_s": rate,
        "flows_per_run": len(runs[0].added_ns),
        "achieved_flows_per_s": statistics.median(r.achieved_rate for r in runs),
    }
    return [
        Figure(
            "P3",
            f"added latency trigger -> CLOSED at {rate:,.0f} flows/s, p50 (think time excluded)",
            "us",
            [r.percentile_us(0.5) for r in runs],
            goal=P3_P50_GOAL_US,
            lower_is_better=True,
            extra=shape,
        ),
        Figure(
            "P3.99",
            "  same, p99",
            "us",
            [r.percentile_us(0.99) for r in runs],
            goal=P3_P99_GOAL_US,
            lower_is_better=True,
        ),
    ]


def replay_figures(runs: list[ReplayRun], p1: list[FlowRun]) -> list[Figure]:
    """P5: replay and verify of each round's P1 journal, events folded per second (derived
    events included: what a reader sees), and rows per second beside them (P5.rows)."""
    events = {
        "events": statistics.median(r.events for r in runs),
        "rows": statistics.median(r.rows for r in runs),
        "journal": "P1's",
    }
    replay = Figure(
        "P5",
        "replay: fold every projection from event 1",
        "events/s",
        [r.replay_per_s for r in runs],
        goal=REPLAY_GOAL,
        extra=events,
    )
    verify = Figure(
        "P5.v",
        "verify: hash chain + projection hash, one read (dirk verify)",
        "events/s",
        [r.verify_per_s for r in runs],
        goal=VERIFY_GOAL,
        extra={
            **events,
            "chain_events_per_s": statistics.median(r.events / r.chain_s for r in runs),
            "projections_events_per_s": statistics.median(r.events / r.projections_s for r in runs),
        },
    )
    rows = Figure(
        "P5.rows",
        "  same, rows read: replay (verify in extra)",
        "rows/s",
        [r.rows_per_s for r in runs],
        extra={"verify_rows_per_s": statistics.median(r.verify_rows_per_s for r in runs)},
    )
    if p1:
        # The kernel writes rows at E2 (P1's events: rows committed); how many times faster
        # it reads them back, row for row.
        written = statistics.median(r.events_per_s for r in p1)
        replay.ratios["E2"] = rows.median / written
        verify.ratios["E2"] = statistics.median(r.verify_rows_per_s for r in runs) / written
    return [replay, verify, rows]


def storage_figures(runs: list[StorageRun], minutes: int) -> list[Figure]:
    """P6: bytes per stored row of the trading simulation's journal; P6.read per event read."""
    read = Figure(
        "P6.read",
        "  same, per event as read (derived events included, as P5 counts)",
        "bytes",
        [r.bytes_per_event_read for r in runs],
        extra={"events_read": statistics.median(r.events_read for r in runs)},
    )
    return [storage_figure(runs, minutes), read]


def storage_figure(runs: list[StorageRun], minutes: int) -> Figure:
    """P6: bytes per event of the trading simulation's journal."""
    keys = runs[0].breakdown.keys()
    return Figure(
        "P6",
        "journal bytes per event on disk, trading simulation",
        "bytes",
        [r.bytes_per_event for r in runs],
        goal=BYTES_GOAL,
        lower_is_better=True,
        extra={
            "minutes": minutes,
            "events": statistics.median(r.events for r in runs),
            "breakdown_bytes_per_event": {
                k: statistics.median(r.breakdown[k] for r in runs) for k in keys
            },
        },
    )


def open_figure(events: int, repeats: int, tail: int, directory: Path, note: str = "") -> Figure:
    """P7: open a journal of ``events`` events with a checkpoint until its projections are ready."""
    path = directory / "p7.db"
    anyio.run(build, path, events, tail)
    try:
        opens = []
        for _ in range(repeats):
            seconds, _ = anyio.run(open_ready, path)
            opens.append(seconds)
        _, full_s, count = anyio.run(measure, path)
    finally:
        for suffix in ("", "-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
    figure = Figure(
        "P7",
        f"open {events:,} events with checkpoints until ready{note}",
        "s",
        opens,
        goal=OPEN_GOAL_S,
        lower_is_better=True,
        extra={"events": count, "tail_after_snapshot": tail, "fold_from_zero_s": full_s},
    )
    figure.ratios["fold from zero"] = figure.median / full_s
    return figure


def memory_figure(
    first: int,
    second: int,
    repeats: int,
    directory: str | None,
    note: str = "",
    workload: str = "orders",
) -> Figure:
    """P8: resident memory growth between ``first`` and ``second`` closed flows.

    With ``workload="memory"`` (P8.m) every flow is a governed memory write or query.
    """
    records = []
    for _ in range(repeats):
        argv = ["--first", str(first), "--second", str(second), "--workload", workload]
        records.append(_child("benchmarks.memory", argv, directory))
    memory = workload == "memory"
    return Figure(
        "P8.m" if memory else "P8",
        f"RSS growth from {first:,} to {second:,} closed {'memory ' if memory else ''}flows{note}",
        "share",
        [r["growth"] for r in records],
        goal=GROWTH_GOAL,
        lower_is_better=True,
        extra={
            "first_flows": first,
            "second_flows": second,
            "rss_first_bytes": statistics.median(r["rss_first"] for r in records),
            "rss_second_bytes": statistics.median(r["rss_second"] for r in records),
            "bytes_per_flow": statistics.median(r["bytes_per_flow"] for r in records),
        },
    )


def _child(module: str, argv: list[str], directory: str | None) -> dict[str, Any]:
    """Run ``python -m module argv`` in a fresh process; return the JSON it printed."""
    with tempfile.TemporaryDirectory(prefix="dir-bench-child-", dir=directory) as tmp:
        done = subprocess.run(
            [sys.executable, "-m", module, *argv, "--dir", tmp],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise BenchmarkFailed(f"{module} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    record: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return record
