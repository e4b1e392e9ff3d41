"""Metrics the journal does not hold, through ports: the journal's commit latency (its
commit observer) and each mailbox's depth (read when metrics are collected). Neither the
journal nor the runtime imports telemetry; boot connects them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from kernel.core.events import Draft, TriggerFired
from kernel.journal.opening import open_journal
from kernel.telemetry import Telemetry
from kernel.telemetry._metrics import COMMIT_BUCKETS
from tests.support.helpers import ScriptedAgent, kernel_for, transfer
from tests.support.otlp import otlp_receiver


def note(i: int) -> Draft:
    return Draft(payload=TriggerFired(topic="t", facts={"i": i}))


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    if data is None:  # nothing measured at all
        return []
    return [
        point
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


async def test_the_commit_observer_sees_every_transaction_on_its_own_clock(
    tmp_path: Path,
) -> None:
    ticks = iter(range(0, 10**9, 7))  # a clock that advances 7 ns per reading
    seen: list[tuple[int, int]] = []
    async with open_journal(tmp_path / "j.db") as journal:
        journal.observe_commits(lambda n, ns: seen.append((n, ns)), clock=lambda: next(ticks))
        await journal.append([note(1), note(2)])
        await journal.append([note(3)])
        assert seen == [(2, 7), (1, 7)]
        assert journal.statistics().transactions == 2


async def test_an_observer_that_raises_is_dropped_not_the_journal(tmp_path: Path) -> None:
    calls = []

    def broken(n: int, ns: int) -> None:
        calls.append(n)
        raise RuntimeError("the meter is gone")

    async with open_journal(tmp_path / "j.db") as journal:
        journal.observe_commits(broken)
        await journal.append([note(1)])
        await journal.append([note(2)])
        assert calls == [1] and not journal.failed
        assert [e.seq for e in await journal.read()] == [1, 2]


@settings(max_examples=20, derandomize=True, deadline=None)
@given(
    rounds=st.lists(
        st.dictionaries(st.sampled_from(["dim", "context", "agent:x"]), st.integers(0, 4096)),
        min_size=1,
        max_size=4,
    ),
    commits=st.integers(0, 5),
)
def test_metrics_report_the_mailboxes_as_read_and_every_commit(
    tmp_path_factory: pytest.TempPathFactory, rounds: list[dict[str, int]], commits: int
) -> None:
    async def run() -> None:
        reader = InMemoryMetricReader()
        telemetry = Telemetry(None, meter_provider=MeterProvider([reader]))
        assert telemetry.measures
        current: dict[str, int] = {}
        async with open_journal(tmp_path_factory.mktemp("m") / "j.db") as journal:
            telemetry.install(journal, lambda: current)
            for i in range(commits):
                await journal.append([note(i)])
            for depths in rounds:
                current = depths
                gauge = points(reader, "dir.mailbox.depth")
                assert {p.attributes["dir.mailbox"]: p.value for p in gauge} == depths
        latency = points(reader, "dir.journal.commit.duration")
        assert sum(p.count for p in latency) == commits
        assert all(p.sum >= 0 for p in latency)

    anyio.run(run)


async def test_nothing_is_installed_while_metrics_are_off(tmp_path: Path) -> None:
    telemetry = Telemetry(None)
    async with open_journal(tmp_path / "j.db") as journal:
        telemetry.install(journal, dict)
        assert journal._observer is None and not telemetry.measures


async def test_commit_latency_and_mailbox_depth_arrive_over_otlp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with anyio.fail_after(60):
        async with otlp_receiver() as received:
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", received.endpoint)
            monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
            async with kernel_for(tmp_path / "j.db") as kernel:
                await kernel.register(ScriptedAgent("clerk", [transfer(250)]))
                for _ in range(3):
                    [dfid] = await kernel.trigger("bank.invoice")
                    await kernel.wait_flow(dfid)
                journal = kernel.journal
            # Every transaction, KernelStopped's too, was measured; the kernel's metrics
            # are exported once, when it closes.
            transactions = journal.statistics().transactions

            def metric(name: str) -> list[dict[str, Any]]:
                return [i for i in received.items if i.get("metric") == name]

            actors = {"registry", "context", "dim", "guards", "escalation", "agent:clerk"}

            def depths() -> dict[str, int]:
                return {
                    p["attributes"]["dir.mailbox"]: p["value"] for p in metric("dir.mailbox.depth")
                }

            await received.until(
                lambda _: bool(metric("dir.journal.commit.duration")) and actors <= set(depths())
            )
    [latency] = metric("dir.journal.commit.duration")
    assert latency["kind"] == "histogram" and latency["count"] == transactions > 3
    assert latency["sum"] > 0
    # The bounds the instrument advises arrive with it: microseconds to seconds.
    assert latency["bounds"] == list(COMMIT_BUCKETS)
    assert sum(latency["buckets"]) == transactions
    assert all(v >= 0 for v in depths().values())
