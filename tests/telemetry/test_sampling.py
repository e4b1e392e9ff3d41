"""Ratio sampling keeps the configured share of flows, each whole, the same everywhere.

A DFID is a UUIDv4, and the SDK's ``TraceIdRatioBased`` compares the low 64 bits of the
trace id, where a UUIDv4 keeps its variant bits: at 0.5 it keeps no flow at all. The
kernel's tracer decides the same ratio on a hash of the DFID (kernel/telemetry/_sampling.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)

from examples.summary import read_events
from kernel.core.events import Event, FlowCreated
from kernel.core.ports import SeededIds
from kernel.telemetry import DfidRatioBased, Telemetry, flow_sampler, trace_id_for
from tests.support import SUPPORT
from tests.telemetry.test_telemetry import JournalBuilder, executed_flow

FLOWS = 200
HALF = 0.5
SPANS_PER_FLOW = 5  # root, context, invoke_agent, judge, execute_tool


def dfids(n: int, seed: int = 3) -> list[str]:
    """``n`` DFIDs as the kernel draws them: random UUIDv4s."""
    ids = SeededIds(seed)
    return [ids.new_dfid() for _ in range(n)]


def journal_of(flows: list[str]) -> list[Event]:
    """One accepted, executed and closed flow per DFID, one after another."""
    j = JournalBuilder()
    for n, dfid in enumerate(flows):
        executed_flow(j, dfid, start_ms=100 * n)
    return j.events


def kept(sampler: Sampler, flows: list[str]) -> set[str]:
    decided = {d: sampler.should_sample(Context(), trace_id_for(d), "flow") for d in flows}
    return {d for d, result in decided.items() if result.decision is Decision.RECORD_AND_SAMPLE}


def traces(spans: tuple[ReadableSpan, ...] | list[ReadableSpan]) -> Counter[str]:
    """How many spans each flow sent, by DFID."""
    return Counter(str((s.attributes or {})["dir.dfid"]) for s in spans)


def test_the_sdks_own_ratio_sampler_keeps_no_dfid_at_one_half() -> None:
    # The trap this module exists for: the variant bits make every DFID look "high".
    flows = dfids(FLOWS)
    assert kept(TraceIdRatioBased(HALF), flows) == set()
    assert len(kept(DfidRatioBased(HALF), flows)) > 0


@pytest.mark.parametrize("parent_based", [False, True], ids=["traceidratio", "parentbased"])
def test_traceidratio_from_the_environment_keeps_about_half_of_200_flows_each_whole(
    monkeypatch: pytest.MonkeyPatch, parent_based: bool
) -> None:
    flows = dfids(FLOWS)
    name = "parentbased_traceidratio" if parent_based else "traceidratio"
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", name)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", str(HALF))
    exporter = InMemorySpanExporter()
    # The kernel's own provider: the SDK reads the sampler from the environment.
    telemetry = Telemetry(SimpleSpanProcessor(exporter), span_time="journal")

    telemetry.emit(journal_of(flows))
    telemetry.shutdown()

    sent = traces(exporter.get_finished_spans())
    assert 0.35 * FLOWS <= len(sent) <= 0.65 * FLOWS
    assert set(sent.values()) == {SPANS_PER_FLOW}, "a flow is kept or dropped whole"
    assert set(sent) == kept(DfidRatioBased(HALF), flows)


def test_a_hosts_parent_based_ratio_sampler_keeps_the_llm_spans_of_the_flows_it_keeps() -> None:
    flows = dfids(FLOWS, seed=11)
    exporter = InMemorySpanExporter()
    host = TracerProvider(sampler=ParentBased(TraceIdRatioBased(HALF)), shutdown_on_exit=False)
    host.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry.from_provider(host, span_time="journal")
    llm = host.get_tracer("llm-client")

    # Inside decide(): an instrumented LLM call starts a span in the flow's context.
    for dfid in flows:
        with telemetry.reasoning(dfid, 1):
            llm.start_span("chat model").end()
    telemetry.emit(journal_of(flows))
    telemetry.shutdown()

    spans = exporter.get_finished_spans()
    chats = {f"{s.context.trace_id:032x}" for s in spans if s.name == "chat model" and s.context}
    sent = traces([s for s in spans if s.name != "chat model"])
    assert 0.35 * FLOWS <= len(sent) <= 0.65 * FLOWS
    assert set(sent.values()) == {SPANS_PER_FLOW}
    # The LLM's spans follow their flow: kept with it, dropped with it.
    assert chats == {f"{trace_id_for(d):032x}" for d in sent}


def test_other_samplers_are_left_as_the_application_made_them() -> None:
    for sampler in (ALWAYS_ON, ParentBased(ALWAYS_ON)):
        assert flow_sampler(sampler) is sampler
    custom = ParentBased(TraceIdRatioBased(0.25), local_parent_sampled=TraceIdRatioBased(0.5))
    hashed = flow_sampler(custom)
    assert isinstance(hashed, ParentBased)
    assert isinstance(hashed._root, DfidRatioBased) and hashed._root.rate == 0.25
    assert isinstance(hashed._local_parent_sampled, DfidRatioBased)
    assert hashed._remote_parent_sampled is custom._remote_parent_sampled


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=(1 << 128) - 1), min_size=1, max_size=30),
    st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]),
)
def test_a_flow_is_kept_at_a_ratio_exactly_when_it_is_kept_at_any_higher_one(
    ints: list[int], rate: float
) -> None:
    # Decisions nest: raising the ratio only adds flows, so traces sampled at 0.1 are
    # a subset of those at 0.5, and 0 and 1 mean none and all.
    flows = [str(trace) for trace in ints]
    low, high = kept(DfidRatioBased(rate), flows), kept(DfidRatioBased(min(1.0, rate + 0.3)), flows)
    assert low <= high
    if rate == 0.0:
        assert low == set()
    if rate == 1.0:
        assert low == set(flows)


def test_every_process_decides_the_same_flows() -> None:
    # A hash, not random bits nor Python's per-process salted hash(): a restarted kernel,
    # a re-export and an agent's host all keep the same flows.
    flows = dfids(50, seed=5)
    code = (
        "import json, sys\n"
        "from opentelemetry.context import Context\n"
        "from kernel.telemetry import DfidRatioBased, trace_id_for\n"
        "s = DfidRatioBased(0.5)\n"
        "flows = json.load(sys.stdin)\n"
        "print(json.dumps([d for d in flows if s.should_sample(Context(), trace_id_for(d),"
        " 'flow').decision.is_sampled()]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "random"}
    other = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(flows),
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    assert set(json.loads(other.stdout)) == kept(DfidRatioBased(0.5), flows)


def test_the_trading_desk_at_ratio_one_half_sends_about_half_its_flows_to_a_real_receiver(
    tmp_path: Path,
) -> None:
    """The example, configured only by the standard variables, to a real OTLP receiver:
    the flows kept are those the hash keeps, and their roots land in the last hour."""
    db = tmp_path / "desk.db"
    receiver = subprocess.Popen(
        [sys.executable, str(SUPPORT / "otlp_receiver.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert receiver.stdout is not None
        port = int(receiver.stdout.readline().removeprefix("PORT "))
        env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_TRACES_SAMPLER": "traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.5",
            "OTEL_METRICS_EXPORTER": "none",
        }
        env.pop("DIRK_SPAN_TIME", None)
        # Read as it prints, as a collector would: a receiver stalled on a full pipe answers
        # late, and a kernel that is closing waits only so long for its exports.
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(receiver.stdout or ()))
        reader.start()
        run = [sys.executable, "-m", "examples.trading", "--seed", "1", "--db", str(db)]
        subprocess.run([*run, "--minutes", "40"], env=env, check=True, capture_output=True)
        after = time.time_ns()
        assert receiver.stdin is not None
        receiver.stdin.close()  # ends the receiver once it printed all it received
        receiver.wait(60)
        reader.join(60)
    finally:
        receiver.kill()
        receiver.wait()
        if receiver.stdout is not None:
            receiver.stdout.close()
    received = [span for line in lines if "span_id" in (span := json.loads(line))]

    events = anyio.run(read_events, db)
    flows = [e.dfid for e in events if isinstance(e.payload, FlowCreated) and e.dfid]
    roots = [s for s in received if not s["parent_span_id"]]
    sent = {s["attributes"]["dir.dfid"] for s in roots}
    assert sent == kept(DfidRatioBased(HALF), flows)
    assert 0 < len(sent) < len(flows)
    assert {s["trace_id"] for s in received} == {f"{trace_id_for(d):032x}" for d in sent}
    # The example's clock says 2024; a viewer's default range (Jaeger: the last hour)
    # finds its flows, which say when they were recorded.
    hour = 3600 * 10**9
    assert all(after - hour <= s["start"] <= after for s in roots)
    assert all(s["attributes"]["dir.journal_time"].startswith("2024-") for s in roots)
