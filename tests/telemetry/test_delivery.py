"""No span dropped when the kernel outruns the exporter (issue 35, S2).

The kernel's telemetry task waits for room in the exporter's queue and its journal
subscription reads what it missed from the journal, so a burst many times the queue
arrives whole; a collector that is down delays spans (they are retried) and never the
kernel's decisions; what can still be lost is counted, with its reason.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, TraceFlags

from benchmarks.flows import PACK, SPANS_PER_FLOW, InstantAgent, NoopAdapter
from kernel import FlowStatus, Kernel, open_kernel
from kernel.audit import open_journal
from kernel.config import KernelConfig, Ports
from kernel.core.ports import SystemClock
from kernel.telemetry import Telemetry, configure_exporter, spans_for_events, trace_id_for
from kernel.telemetry._ship import EXPORT_FAILED, OVERFLOW, SHUT_DOWN, SpanShipper
from kernel.telemetry._telemetry import _drain_from_env
from kernel.testing import SeededIds
from tests.support.hostile import hostile_text
from tests.support.otlp import Received, otlp_receiver
from tests.support.principals import LOCAL

TOPIC = "bench.tick"


@asynccontextmanager
async def desk(path: Path, telemetry: Telemetry, agents: int = 4) -> AsyncIterator[Kernel]:
    """A kernel whose agents decide at once and whose adapter answers at once (benchmarks'
    P1 workload): each trigger opens one flow per agent."""
    names = [f"agent-{i}" for i in range(agents)]
    clock = SystemClock()
    async with open_kernel(
        path,
        packs=[PACK],
        adapters={"noop": NoopAdapter()},
        allow=names,
        config=KernelConfig(
            principal=LOCAL,
            ports=Ports(clock=clock, ids=SeededIds(7, clock=clock)),
            telemetry=telemetry,
        ),
    ) as kernel:
        for name in names:
            await kernel.register(InstantAgent(name))
        yield kernel


async def fire(kernel: Kernel, triggers: int, concurrency: int = 64) -> list[str]:
    """Fire ``triggers`` triggers from ``concurrency`` tasks; return every flow they opened."""
    opened: list[str] = []
    left = iter(range(triggers))

    async def one() -> None:
        for _ in left:
            opened.extend(await kernel.trigger(TOPIC, source="test"))

    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(one)
    return opened


async def all_closed(kernel: Kernel, dfids: Sequence[str]) -> None:
    for dfid in dfids:
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED


async def expected_span_ids(path: Path) -> set[str]:
    """The span id of every span the journal projects to (what the receiver should hold)."""
    async with open_journal(path, readonly=True) as journal:
        spans = spans_for_events(await journal.read())
    return {f"{span.context.span_id:016x}" for span in spans}


def shipper_of(endpoint: str, **env: str) -> SpanShipper:
    processor = configure_exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, **env})
    assert isinstance(processor, SpanShipper)
    return processor


async def test_a_burst_many_times_the_queue_arrives_whole(tmp_path: Path) -> None:
    """5,000 flows (25,000 spans) through a queue of 64: the old processor dropped every
    span past its queue; now the kernel's telemetry task waits for room instead."""
    path = tmp_path / "j.db"
    with anyio.fail_after(240):
        async with otlp_receiver() as received, anyio.create_task_group() as tg:
            tg.start_soon(received.rest)  # its pipe drained, or it stops answering
            shipper = shipper_of(
                received.endpoint,
                OTEL_BSP_MAX_QUEUE_SIZE="64",
                OTEL_BSP_MAX_EXPORT_BATCH_SIZE="32",
            )
            telemetry = Telemetry(shipper, drain_s=120.0)
            async with desk(path, telemetry) as kernel:
                await all_closed(kernel, await fire(kernel, 1250))
            # Closed: the receiver acknowledged every span it printed; its output ends next.
            received.process.terminate()

    expected = await expected_span_ids(path)
    assert len(expected) == 5000 * SPANS_PER_FLOW
    assert shipper.dropped == {}
    assert telemetry.unexported == 0
    assert shipper.high_water >= 64, "the burst never filled the queue: it proves nothing"
    assert ids(received) == expected


def ids(received: Received) -> set[str]:
    return {span["span_id"] for span in received.spans()}


async def test_a_collector_killed_mid_run_costs_the_kernel_nothing_and_loses_no_span(
    tmp_path: Path,
) -> None:
    """SIGKILL the receiver while the kernel runs: the kernel goes on deciding, and every
    span reaches the receiver that comes back on the same port, or is counted as dropped."""
    path = tmp_path / "j.db"
    with anyio.fail_after(240):
        async with (
            contextlib.AsyncExitStack() as stack,
            otlp_receiver() as first,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(first.rest)
            shipper = shipper_of(first.endpoint, OTEL_BSP_SCHEDULE_DELAY="50")
            telemetry = Telemetry(shipper, drain_s=120.0)
            async with desk(path, telemetry) as kernel:
                await all_closed(kernel, await fire(kernel, 25))
                os.kill(first.process.pid, signal.SIGKILL)
                await first.process.wait()

                # The collector is down: the decisions go on, their spans wait in the journal.
                await all_closed(kernel, await fire(kernel, 100))
                assert not await anyio.to_thread.run_sync(shipper.force_flush, 1000)
                # The exporter retries on its own before it says refused: flush again until
                # it has (a busy machine takes longer than one flush's second).
                while shipper.refused < 1:
                    await anyio.to_thread.run_sync(shipper.force_flush, 200)
                second = await stack.enter_async_context(otlp_receiver(first.port))
                tg.start_soon(second.rest)
                after = await fire(kernel, 25)
                await all_closed(kernel, after)
            # Closed with the collector up: what was left has been handed over.
            second.process.terminate()

    expected = await expected_span_ids(path)
    assert len(expected) == 150 * 4 * SPANS_PER_FLOW
    assert set(shipper.dropped) <= {EXPORT_FAILED}, "only a refused export may lose spans"
    assert len(expected - ids(first) - ids(second)) <= sum(shipper.dropped.values()), (
        "a span neither delivered nor counted"
    )
    assert telemetry.unexported == 0
    async with open_journal(path, readonly=True) as journal:
        traces = {trace_id_for(dfid) for dfid in after}
        since = {
            f"{span.context.span_id:016x}"
            for span in spans_for_events(await journal.read())
            if span.context.trace_id in traces
        }
    assert len(since) == 25 * 4 * SPANS_PER_FLOW
    assert since <= ids(second), "a span of a flow decided after the collector came back is missing"


# --- the shipper, with a scripted exporter (the collector's edge) ---------------------


class Scripted(SpanExporter):
    """Refuses the first ``refusals`` calls, then takes every batch; or blocks until told."""

    def __init__(self, refusals: float = 0, *, blocked: bool = False) -> None:
        self.refusals = refusals
        self.calls = 0
        self.taken: list[ReadableSpan] = []
        self.released = threading.Event()
        if not blocked:
            self.released.set()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.released.wait()
        self.calls += 1
        if self.calls <= self.refusals:
            return SpanExportResult.FAILURE
        self.taken.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.released.set()


def span(n: int = 1) -> ReadableSpan:
    context = SpanContext(n, n, False, TraceFlags(TraceFlags.SAMPLED))
    return ReadableSpan(f"span {n}", context)


def test_a_refused_batch_is_retried_until_the_collector_takes_it() -> None:
    exporter = Scripted(refusals=3)
    shipper = SpanShipper(exporter, max_export_batch_size=10, give_up_s=60.0)
    for n in range(1, 11):
        shipper.on_end(span(n))

    assert shipper.force_flush(60_000)
    shipper.shutdown()
    assert exporter.calls == 4
    assert [s.name for s in exporter.taken] == [f"span {n}" for n in range(1, 11)]
    assert shipper.exported == 10
    assert shipper.dropped == {}


def test_a_batch_refused_past_give_up_is_counted_with_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exporter = Scripted(refusals=math.inf)
    shipper = SpanShipper(exporter, max_export_batch_size=5, give_up_s=0.3)
    for n in range(1, 6):
        shipper.on_end(span(n))

    assert shipper.force_flush(60_000)  # done when the batch is dropped
    shipper.shutdown()
    assert exporter.calls >= 2, "it was not retried"
    assert shipper.dropped == {EXPORT_FAILED: 5}
    assert any("5 spans dropped in all (export_failed" in r.getMessage() for r in caplog.records)


def test_shutdown_counts_what_is_still_queued_and_what_comes_after() -> None:
    exporter = Scripted(blocked=True)
    shipper = SpanShipper(exporter, max_export_batch_size=1, schedule_delay_s=0.01)
    for n in range(1, 6):
        shipper.on_end(span(n))
    assert not shipper.force_flush(50)  # the collector does not answer

    exporter.released.set()  # it answers the batch in flight; the rest waits in the queue
    shipper.shutdown()
    shipper.on_end(span(9))

    assert shipper.exported + sum(shipper.dropped.values()) == 6
    assert shipper.dropped.get(SHUT_DOWN, 0) >= 1
    assert set(shipper.dropped) == {SHUT_DOWN}


def test_a_writer_that_never_waits_is_bounded_and_told() -> None:
    exporter = Scripted(blocked=True)
    shipper = SpanShipper(exporter, max_queue_size=1, max_export_batch_size=1)
    one = span()
    try:
        for _ in range(4 * 1 + 4096 + 10):
            shipper.on_end(one)
        assert shipper.queued <= 4 * 1 + 4096 + 1
        assert shipper.dropped[OVERFLOW] >= 9
        assert not shipper.wait_for_room(0.01)
    finally:
        exporter.released.set()
        shipper.shutdown()


def test_unsampled_spans_are_not_shipped() -> None:
    exporter = Scripted()
    shipper = SpanShipper(exporter)
    context = SpanContext(1, 1, False, TraceFlags(TraceFlags.DEFAULT))
    shipper.on_end(ReadableSpan("unsampled", context))
    assert shipper.force_flush(10_000)
    shipper.shutdown()
    assert exporter.taken == []


@settings(max_examples=60, deadline=None)
@given(
    queue=hostile_text(),
    batch=hostile_text(),
    delay=hostile_text(),
    drain=st.one_of(hostile_text(), st.sampled_from(["nan", "inf", "-1", "1e999", "0", "2.5"])),
)
def test_hostile_sizes_fall_back_to_the_defaults(
    queue: str, batch: str, delay: str, drain: str
) -> None:
    shipper = configure_exporter(
        {
            "OTEL_TRACES_EXPORTER": "console",
            "OTEL_BSP_MAX_QUEUE_SIZE": queue,
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": batch,
            "OTEL_BSP_SCHEDULE_DELAY": delay,
        }
    )
    assert shipper is not None
    try:
        assert shipper.max_queue_size >= 1
    finally:
        shipper.shutdown()
    drain_s = _drain_from_env({"DIRK_SPAN_DRAIN_S": drain})
    assert 0 <= drain_s < math.inf


@pytest.mark.parametrize("drain_s", [math.inf, math.nan, -1.0])
def test_a_drain_without_a_bound_is_refused(drain_s: float) -> None:
    with pytest.raises(ValueError, match="finite number of seconds"):
        Telemetry(None, drain_s=drain_s)
