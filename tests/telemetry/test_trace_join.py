"""A flow started inside a request joins the caller's trace: its root links to the caller's
span (the flow keeps its own trace, trace id = DFID), live and re-exported alike."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kernel.audit import open_journal
from kernel.core.wall import InputInvalid
from kernel.telemetry import (
    caller_context,
    span_id_for,
    spans_for_events,
    trace_id_for,
    traceparent_of,
)
from tests.support.helpers import ScriptedAgent, kernel_for, transfer


def host() -> tuple[TracerProvider, InMemorySpanExporter]:
    provider = TracerProvider(shutdown_on_exit=False)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def root_of(spans: list[ReadableSpan], dfid: str) -> ReadableSpan:
    [root] = [
        s
        for s in spans
        if s.context is not None
        and s.context.trace_id == trace_id_for(dfid)
        and s.context.span_id == span_id_for(dfid, "flow", 0)
    ]
    return root


def caller_links(span: ReadableSpan) -> list[tuple[int, int]]:
    return [
        (link.context.trace_id, link.context.span_id)
        for link in span.links
        if (link.attributes or {}).get("dir.link") == "caller"
    ]


async def test_a_flow_started_in_a_request_links_to_the_callers_span(tmp_path: Path) -> None:
    provider, exporter = host()
    request = provider.get_tracer("web")
    async with kernel_for(tmp_path / "j.db", tracer_provider=provider) as kernel:
        await kernel.register(ScriptedAgent("clerk", [transfer(250), transfer(250)]))
        with request.start_as_current_span("POST /invoices") as span:
            [joined] = await kernel.trigger(
                "bank.invoice", trace_context=otel_context.get_current()
            )
        caller = span.get_span_context()
        await kernel.wait_flow(joined)
        # Outside any span: a context with no span links to nothing.
        [alone] = await kernel.trigger("bank.invoice", trace_context=otel_context.get_current())
        await kernel.wait_flow(alone)

    spans = list(exporter.get_finished_spans())
    root = root_of(spans, joined)
    # The flow keeps its own trace: any DFID pasted into a viewer finds it.
    assert root.context is not None and root.context.trace_id == trace_id_for(joined)
    assert root.parent is None
    assert caller_links(root) == [(caller.trace_id, caller.span_id)]
    assert caller_links(root_of(spans, alone)) == []

    # Re-exported from the journal, the root carries the same link: it is recorded.
    async with open_journal(tmp_path / "j.db", readonly=True) as journal:
        events = await journal.read()
    again = root_of(spans_for_events(events), joined)
    assert caller_links(again) == caller_links(root)


async def test_a_traceparent_string_joins_too_and_a_malformed_one_is_refused(
    tmp_path: Path,
) -> None:
    provider, exporter = host()
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with kernel_for(tmp_path / "j.db", tracer_provider=provider) as kernel:
        await kernel.register(ScriptedAgent("clerk", [transfer(250)]))
        [dfid] = await kernel.trigger("bank.invoice", trace_context=traceparent)
        await kernel.wait_flow(dfid)
        bad = [
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",  # no flags
            "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",  # upper case
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # no trace
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # no span
            "not a traceparent",
        ]
        for text in bad:
            with pytest.raises(InputInvalid):
                await kernel.trigger("bank.invoice", trace_context=text)
        with pytest.raises(InputInvalid):
            await kernel.trigger("bank.invoice", trace_context=42)  # type: ignore[arg-type]
    root = root_of(list(exporter.get_finished_spans()), dfid)
    assert caller_links(root) == [(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331)]


@settings(max_examples=50, derandomize=True, deadline=None)
@given(
    trace_id=st.integers(1, 2**128 - 1),
    span_id=st.integers(1, 2**64 - 1),
    sampled=st.booleans(),
)
def test_a_context_survives_the_round_trip_through_its_traceparent(
    trace_id: int, span_id: int, sampled: bool
) -> None:
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    span = NonRecordingSpan(SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags))
    text = traceparent_of(set_span_in_context(span))
    back = caller_context(text)
    assert back is not None
    assert (back.trace_id, back.span_id, back.trace_flags) == (trace_id, span_id, flags)
    assert back.is_remote
