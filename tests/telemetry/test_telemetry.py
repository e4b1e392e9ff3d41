"""Spans projected from hand-built journals, checked in memory and through a real OTLP receiver."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import (
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import StatusCode

from kernel.core.events import (
    ActorRestarted,
    AgentRegistered,
    AnyPayload,
    CompensationStarted,
    CompensationSucceeded,
    ContextCompiled,
    DriftBreached,
    DuplicateSuppressed,
    Event,
    ExecutionFailed,
    ExecutionIntent,
    ExecutionRetried,
    ExecutionStarted,
    ExecutionSucceeded,
    Feedback,
    FlowAborted,
    FlowClosed,
    FlowCompensated,
    FlowCreated,
    FlowDirty,
    FlowEscalated,
    FlowFlagged,
    HumanDecided,
    KernelStarted,
    Manifest,
    ProposalAccepted,
    ProposalRecord,
    ProposalRejected,
    ProposalSubmitted,
    TriggerFired,
)
from kernel.core.reasons import ReasonCode
from kernel.telemetry import (
    ExporterUnavailable,
    SpanProjector,
    Telemetry,
    configure_exporter,
    export_flows,
    span_id_for,
    spans_for_events,
    trace_id_for,
)
from kernel.telemetry._ship import SpanShipper
from kernel.telemetry._sink import Collector
from tests.support import SUPPORT
from tests.support.ports import free_port
from tests.support.spans import attrs

T0 = 1_700_000_000_000_000_000
MS = 1_000_000
US = 1_000  # a flow's span starts are kept strictly increasing, a microsecond apart
AGENT = "restock-agent"
REASON = f"invoke_agent {AGENT}"
PARENT = "7f0c2a52-9d1e-4c4b-8a53-0d6a1b2c3d4e"
CHILD = "0b9e5c1d-2f3a-4b5c-9d6e-7f8091a2b3c4"
RECEIVER = SUPPORT / "otlp_receiver.py"


class JournalBuilder:
    """Number and stamp events the way the journal would, with time in ms after T0."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def add(
        self,
        payload: AnyPayload,
        *,
        at_ms: int,
        dfid: str | None = PARENT,
        parent_dfid: str | None = None,
        agent_id: str | None = AGENT,
    ) -> Event:
        event = Event(
            seq=len(self.events) + 1,
            ts=T0 + at_ms * MS,
            payload=payload,
            dfid=dfid,
            parent_dfid=parent_dfid,
            caused_by=len(self.events) or None,
            agent_id=agent_id,
        )
        self.events.append(event)
        return event


def proposal(attempt: int, kind: str = "reorder") -> ProposalSubmitted:
    record = ProposalRecord(
        kind=kind, params={"sku": "A-1", "qty": 5}, context_ref=f"ctx-{attempt}"
    )
    return ProposalSubmitted(attempt=attempt, proposal=record)


def executed_flow(j: JournalBuilder, dfid: str = PARENT, *, start_ms: int = 0) -> None:
    """Append an accepted, executed and closed flow: the happy path."""
    at = start_ms
    j.add(FlowCreated(root_dfid=dfid, topic="stock.low"), at_ms=at, dfid=dfid)
    j.add(ContextCompiled(attempt=1, context_ref="ctx-1"), at_ms=at + 2, dfid=dfid)
    j.add(proposal(1), at_ms=at + 50, dfid=dfid)
    j.add(ProposalAccepted(attempt=1), at_ms=at + 51, dfid=dfid)
    intent = ExecutionIntent(key="key-1", kind="reorder", adapter="erp", step=0)
    j.add(ExecutionStarted(intent=intent), at_ms=at + 52, dfid=dfid)
    j.add(ExecutionSucceeded(key="key-1", external_id="PO-7"), at_ms=at + 80, dfid=dfid)
    j.add(FlowClosed(), at_ms=at + 81, dfid=dfid)


def exported(events: Sequence[Event]) -> list[ReadableSpan]:
    """Run events through Telemetry into the SDK's in-memory exporter."""
    exporter = InMemorySpanExporter()
    telemetry = Telemetry(SimpleSpanProcessor(exporter), span_time="journal")
    telemetry.emit(events)
    telemetry.shutdown()
    return list(exporter.get_finished_spans())


def by_name(spans: Sequence[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


def root_of(spans: Sequence[ReadableSpan], dfid: str) -> ReadableSpan:
    (root,) = [
        s for s in spans if s.name.startswith("invoke_workflow") and attrs(s)["dir.dfid"] == dfid
    ]
    return root


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    span_id: int = span.context.span_id
    return span_id


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


# --- the span tree -------------------------------------------------------------


def test_accepted_and_executed_flow_is_one_trace_with_a_span_per_stage() -> None:
    j = JournalBuilder()
    executed_flow(j)

    spans = exported(j.events)

    named = by_name(spans)
    assert sorted(named) == [
        "apply_guardrail dirk DIM",
        "context",
        "execute_tool reorder",
        REASON,
        "invoke_workflow reorder",
    ]
    root = named["invoke_workflow reorder"][0]
    assert root.parent is None
    assert {s.context.trace_id for s in spans if s.context} == {uuid.UUID(PARENT).int}
    assert all(parent_id(s) == span_id(root) for s in spans if s is not root)
    assert span_id(root) == span_id_for(PARENT, "flow", 0)

    assert (root.start_time, root.end_time) == (T0, T0 + 81 * MS)
    assert root.status.status_code is StatusCode.OK
    assert dict(attrs(root)) == {
        "dir.dfid": PARENT,
        "dir.agent_id": AGENT,
        "dir.topic": "stock.low",
        "dir.policy_kind": "reorder",
        "dir.status": "CLOSED",
        "dir.attempts": 1,
        "gen_ai.operation.name": "invoke_workflow",
        "gen_ai.workflow.name": "reorder",
        "gen_ai.agent.id": AGENT,
        "openinference.span.kind": "CHAIN",
        "input.value": '{"kind":"reorder","params":{"qty":5,"sku":"A-1"}}',
        "output.value": '{"status":"CLOSED"}',
    }
    assert root.resource.attributes["service.name"]
    assert root.instrumentation_scope is not None

    context, reason = named["context"][0], named[REASON][0]
    validate, execute = named["apply_guardrail dirk DIM"][0], named["execute_tool reorder"][0]
    assert (context.start_time, context.end_time) == (T0 + US, T0 + 2 * MS)
    assert attrs(context)["dir.context_ref"] == "ctx-1"
    assert (reason.start_time, reason.end_time) == (T0 + 2 * MS, T0 + 50 * MS)
    assert (validate.start_time, validate.end_time) == (T0 + 50 * MS, T0 + 51 * MS)
    assert attrs(validate)["dir.verdict"] == "ACCEPTED"
    assert validate.status.status_code is StatusCode.UNSET
    assert (execute.start_time, execute.end_time) == (T0 + 52 * MS, T0 + 80 * MS)
    assert attrs(execute)["dir.idempotency_key"] == "key-1"
    assert attrs(execute)["dir.adapter"] == "erp"
    assert attrs(execute)["dir.external_id"] == "PO-7"
    assert all(attrs(s)["dir.attempt"] == 1 for s in (context, reason, validate))
    assert span_id(reason) == span_id_for(PARENT, "reason", 1)
    # Every span names the agent with the GenAI semantic conventions.
    assert all(attrs(s)["gen_ai.agent.id"] == AGENT for s in spans)
    assert attrs(reason)["gen_ai.operation.name"] == "invoke_agent"
    assert attrs(execute)["gen_ai.operation.name"] == "execute_tool"


def test_a_rejected_attempt_is_a_governed_validate_span_carrying_the_feedback() -> None:
    j = JournalBuilder()
    j.add(FlowCreated(root_dfid=PARENT, topic="stock.low"), at_ms=0)
    j.add(ContextCompiled(attempt=1, context_ref="ctx-1"), at_ms=1)
    j.add(proposal(1), at_ms=10)
    feedback = Feedback(
        reason_code=ReasonCode.RISK_LIMIT_EXCEEDED, detail="qty 5 > 3", layer="risk", field="qty"
    )
    j.add(ProposalRejected(attempt=1, feedback=feedback), at_ms=11)
    j.add(ContextCompiled(attempt=2, context_ref="ctx-2", feedback=feedback), at_ms=12)
    j.add(proposal(2), at_ms=20)
    j.add(ProposalAccepted(attempt=2), at_ms=21)
    j.add(FlowClosed(), at_ms=22)

    named = by_name(exported(j.events))

    first, second = sorted(named["apply_guardrail dirk DIM"], key=lambda s: attrs(s)["dir.attempt"])
    # A refusal is the policy working, not a fault: no ERROR status.
    assert first.status.status_code is StatusCode.UNSET
    assert attrs(first)["dir.reason_code"] == "RISK_LIMIT_EXCEEDED"
    assert attrs(first)["dir.verdict"] == "REJECTED"
    event, result = first.events
    assert event.name == "feedback"
    assert event.timestamp == T0 + 11 * MS
    # The verdict as the GenAI guardrail conventions' result, with the rule (layer) decided.
    assert result.name == "gen_ai.guardrail.result" and result.timestamp == event.timestamp
    assert dict(result.attributes or {}) == {
        "gen_ai.guardrail.result.type": "verdict",
        "gen_ai.guardrail.result.value": "REJECTED",
        "gen_ai.guardrail.result.reason": "RISK_LIMIT_EXCEEDED",
        "gen_ai.guardrail.policy.rule.id": "risk",
    }
    assert dict(event.attributes or {}) == {
        "dir.reason_code": "RISK_LIMIT_EXCEEDED",
        "dir.detail": "qty 5 > 3",
        "dir.layer": "risk",
        "dir.field": "qty",
    }
    assert second.status.status_code is StatusCode.UNSET
    assert attrs(second)["dir.attempt"] == 2
    # The second context span covers the gap since the rejection.
    contexts = sorted(named["context"], key=lambda s: attrs(s)["dir.attempt"])
    assert [(c.start_time, c.end_time) for c in contexts] == [
        (T0 + US, T0 + 1 * MS),
        (T0 + 11 * MS, T0 + 12 * MS),
    ]
    assert len(named[REASON]) == 2
    root = named["invoke_workflow reorder"][0]
    assert attrs(root)["dir.attempts"] == 2
    assert root.status.status_code is StatusCode.OK


@pytest.mark.parametrize(
    ("code", "fault"),
    [
        (ReasonCode.REASONING_EXHAUSTION, False),
        (ReasonCode.HUMAN_REJECTED, False),
        (ReasonCode.AGENT_ERROR, True),
        (ReasonCode.KERNEL_FAULT, True),
    ],
)
def test_an_aborted_flow_names_its_reason_code_and_is_an_error_only_for_a_fault(
    code: ReasonCode, fault: bool
) -> None:
    j = JournalBuilder()
    j.add(FlowCreated(root_dfid=PARENT, topic="stock.low"), at_ms=0)
    j.add(ContextCompiled(attempt=1, context_ref="ctx-1"), at_ms=1)
    j.add(FlowAborted(reason_code=code, detail="no proposal"), at_ms=30)

    named = by_name(exported(j.events))

    root = named["invoke_workflow stock.low"][0]
    if fault:
        assert root.status.status_code is StatusCode.ERROR
        assert root.status.description == code.value
        assert attrs(root)["error.type"] == code.value
    else:
        assert root.status.status_code is StatusCode.UNSET
        assert "error.type" not in attrs(root)
    assert attrs(root)["dir.status"] == "ABORTED"
    assert attrs(root)["dir.reason_code"] == code.value
    assert attrs(root)["dir.detail"] == "no proposal"
    # The agent never answered: its reason span runs until the abort.
    (reason,) = named[REASON]
    assert (reason.start_time, reason.end_time) == (T0 + 1 * MS, T0 + 30 * MS)


def test_a_failed_execution_is_an_error_execute_span() -> None:
    j = JournalBuilder()
    j.add(FlowCreated(root_dfid=PARENT), at_ms=0)
    j.add(proposal(1), at_ms=1)
    j.add(ProposalAccepted(attempt=1), at_ms=2)
    intent = ExecutionIntent(key="key-1", kind="reorder", adapter="erp")
    j.add(ExecutionStarted(intent=intent), at_ms=3)
    j.add(ExecutionFailed(key="key-1", error="erp down", transient=False), at_ms=9)
    j.add(FlowAborted(reason_code=ReasonCode.EXECUTION_FAILED), at_ms=10)

    (execute,) = by_name(exported(j.events))["execute_tool reorder"]

    assert execute.status.status_code is StatusCode.ERROR
    assert attrs(execute)["dir.reason_code"] == "EXECUTION_FAILED"
    assert attrs(execute)["dir.error"] == "erp down"
    assert attrs(execute)["error.type"] == "EXECUTION_FAILED"
    assert (execute.start_time, execute.end_time) == (T0 + 3 * MS, T0 + 9 * MS)


def test_a_resumed_execution_ends_the_interrupted_attempt_and_starts_a_new_span() -> None:
    j = JournalBuilder()
    j.add(FlowCreated(root_dfid=PARENT), at_ms=0)
    intent = ExecutionIntent(key="key-1", kind="reorder", adapter="erp")
    j.add(ExecutionStarted(intent=intent), at_ms=1)
    j.add(ExecutionStarted(intent=intent), at_ms=5)  # after a crash, same idempotency key
    j.add(ExecutionSucceeded(key="key-1"), at_ms=6)
    j.add(FlowClosed(), at_ms=7)

    executes = by_name(exported(j.events))["execute_tool reorder"]

    assert sorted((s.start_time, s.end_time) for s in executes) == [
        (T0 + 1 * MS, T0 + 5 * MS),
        (T0 + 5 * MS, T0 + 6 * MS),
    ]
    assert len({span_id(s) for s in executes}) == 2


def test_an_escalation_span_records_the_human_decision_and_the_wait() -> None:
    j = JournalBuilder()
    j.add(FlowCreated(root_dfid=PARENT, topic="stock.low"), at_ms=0)
    j.add(ContextCompiled(attempt=1, context_ref="ctx-1"), at_ms=1)
    j.add(proposal(1), at_ms=5)
    j.add(FlowEscalated(reason_code=ReasonCode.VERIFICATION_REQUIRED), at_ms=6)
    j.add(HumanDecided(decision="approve", operator="ops@example"), at_ms=90_006, agent_id=None)
    j.add(ProposalAccepted(attempt=1, by_human=True), at_ms=90_007)
    j.add(FlowClosed(), at_ms=90_008)

    named = by_name(exported(j.events))

    (validate,) = named["apply_guardrail dirk DIM"]
    assert attrs(validate)["dir.verdict"] == "ESCALATED"
    assert validate.status.status_code is StatusCode.UNSET
    (escalation,) = named["escalation VERIFICATION_REQUIRED"]
    assert (escalation.start_time, escalation.end_time) == (T0 + 6 * MS, T0 + 90_006 * MS)
    assert attrs(escalation)["dir.wait_ms"] == 90_000
    assert attrs(escalation)["dir.reason_code"] == "VERIFICATION_REQUIRED"
    assert attrs(escalation)["dir.operator"] == "ops@example"
    assert attrs(escalation)["dir.decision"] == "approve"
    root = named["invoke_workflow reorder"][0]
    assert parent_id(escalation) == span_id(root)
    # The root left when the flow began to wait; the rest hangs under "resume".
    assert root.end_time == T0 + 6 * MS
    assert attrs(root)["dir.status"] == "ESCALATED"
    (resume,) = named["resume reorder"]
    assert parent_id(resume) == span_id(root)
    assert attrs(resume)["dir.status"] == "CLOSED"
    assert resume.status.status_code is StatusCode.OK
    assert (resume.start_time, resume.end_time) == (T0 + 90_006 * MS, T0 + 90_008 * MS)
    # A human's acceptance opens no second judgement.
    assert not [s for s in named["apply_guardrail dirk DIM"] if s is not validate]


def test_a_child_flow_is_its_own_trace_linked_both_ways_to_its_parent() -> None:
    j = JournalBuilder()
    j.add(FlowCreated(root_dfid=PARENT, topic="stock.low"), at_ms=0)
    j.add(
        FlowCreated(root_dfid=PARENT, topic="supplier.quote"),
        at_ms=1,
        dfid=CHILD,
        parent_dfid=PARENT,
    )
    j.add(proposal(1, kind="quote"), at_ms=2, dfid=CHILD, parent_dfid=PARENT)
    j.add(ProposalAccepted(attempt=1), at_ms=3, dfid=CHILD, parent_dfid=PARENT)
    j.add(FlowClosed(), at_ms=4, dfid=CHILD, parent_dfid=PARENT)
    j.add(proposal(1), at_ms=5)
    j.add(ProposalAccepted(attempt=1), at_ms=6)
    j.add(FlowClosed(), at_ms=7)

    spans = exported(j.events)

    parent_root, child_root = root_of(spans, PARENT), root_of(spans, CHILD)
    assert child_root.name == "invoke_workflow quote"
    assert child_root.parent is None
    assert child_root.context is not None and parent_root.context is not None
    assert child_root.context.trace_id == uuid.UUID(CHILD).int == trace_id_for(CHILD)
    assert parent_root.context.trace_id == uuid.UUID(PARENT).int
    assert [link.context.span_id for link in child_root.links] == [span_id(parent_root)]
    assert [link.context.trace_id for link in child_root.links] == [trace_id_for(PARENT)]
    assert attrs(child_root)["dir.parent_dfid"] == PARENT
    # The parent's trace shows where the child went, linked to the child's root.
    (spawn,) = by_name(spans)["child flow supplier.quote"]
    assert spawn.context is not None and spawn.context.trace_id == trace_id_for(PARENT)
    assert parent_id(spawn) == span_id(parent_root)
    assert [link.context.span_id for link in spawn.links] == [span_id(child_root)]
    (child_validate,) = [s for s in spans if parent_id(s) == span_id(child_root)]
    assert child_validate.name == "apply_guardrail dirk DIM"


def test_export_flows_selects_a_flow_and_its_descendants() -> None:
    j = JournalBuilder()
    j.add(FlowCreated(root_dfid=PARENT), at_ms=0)
    j.add(FlowCreated(root_dfid=PARENT), at_ms=1, dfid=CHILD, parent_dfid=PARENT)
    j.add(FlowClosed(), at_ms=2, dfid=CHILD, parent_dfid=PARENT)
    j.add(FlowClosed(), at_ms=3)
    other = str(uuid.UUID(int=42, version=4))
    executed_flow(j, other, start_ms=10)

    def dfids(**kwargs: Any) -> set[str]:
        exporter = InMemorySpanExporter()
        count = export_flows(j.events, SimpleSpanProcessor(exporter), **kwargs)
        spans = exporter.get_finished_spans()
        assert count == len(spans)
        return {str(attrs(s)["dir.dfid"]) for s in spans if s.name.startswith("invoke_workflow")}

    assert dfids() == {PARENT, CHILD, other}
    assert dfids(dfid=PARENT) == {PARENT, CHILD}
    assert dfids(dfid=CHILD) == {CHILD}
    assert dfids(dfid=other) == {other}


# --- determinism and memory ------------------------------------------------------


def test_the_same_events_give_the_same_span_ids() -> None:
    j = JournalBuilder()
    executed_flow(j)

    def identities() -> list[tuple[int, int, int | None, str]]:
        return [
            (s.context.trace_id, s.context.span_id, parent_id(s), s.name)
            for s in spans_for_events(j.events)
            if s.context
        ]

    first = identities()
    assert first == identities()
    assert len({span for _, span, _, _ in first}) == len(first)


def test_fed_in_batches_equals_fed_at_once_and_nothing_is_retained_after_terminal() -> None:
    j = JournalBuilder()
    j.add(KernelStarted(kernel_version="0.1.0"), at_ms=0, dfid=None, agent_id=None)
    manifest = Manifest(agent_id=AGENT, version="1")
    j.add(AgentRegistered(manifest=manifest, session_hash="h"), at_ms=0, dfid=None)
    executed_flow(j, PARENT, start_ms=1)
    j.add(TriggerFired(topic="stock.low"), at_ms=200, dfid=None, agent_id=None)
    # A duplicate answered after the flow closed must not reopen it.
    j.add(DuplicateSuppressed(key="key-1", source="adapter"), at_ms=201)
    projector = SpanProjector()

    exporter = InMemorySpanExporter()
    telemetry = Telemetry(SimpleSpanProcessor(exporter), span_time="journal")
    open_counts = []
    for event in j.events:
        telemetry.emit([event])
        open_counts.append(telemetry._projector.open_flows)
        projector.feed([event])

    assert max(open_counts) == 1
    assert projector.open_flows == 0
    spans = exporter.get_finished_spans()
    ids = [(s.name, s.context.span_id, s.start_time, s.end_time) for s in spans if s.context]
    at_once = [
        (s.name, s.context.span_id, s.start_time, s.end_time)
        for s in spans_for_events(j.events)
        if s.context
    ]
    assert ids == at_once


def test_an_open_flow_gives_only_its_finished_stages_and_never_an_open_root() -> None:
    j = JournalBuilder()
    j.add(FlowCreated(root_dfid=PARENT, topic="stock.low"), at_ms=0)
    j.add(ContextCompiled(attempt=1, context_ref="ctx-1"), at_ms=1)
    j.add(proposal(1), at_ms=7)

    named = by_name(spans_for_events(j.events))

    assert sorted(named) == ["context", REASON]
    (reason,) = named[REASON]
    assert (reason.start_time, reason.end_time) == (T0 + 1 * MS, T0 + 7 * MS)
    assert all("dir.open" not in attrs(s) for spans in named.values() for s in spans)


def test_a_waiting_flow_shows_its_root_and_stages_and_later_ids_never_change_content() -> None:
    j = JournalBuilder()
    j.add(FlowCreated(root_dfid=PARENT, topic="stock.low"), at_ms=0)
    j.add(ContextCompiled(attempt=1, context_ref="ctx-1"), at_ms=1)
    j.add(proposal(1), at_ms=5)
    j.add(FlowEscalated(reason_code=ReasonCode.APPROVAL_REQUIRED, impact="HIGH"), at_ms=6)
    waiting = len(j.events)
    j.add(HumanDecided(decision="reject", operator="ops", reason="no"), at_ms=9, agent_id=None)
    j.add(FlowAborted(reason_code=ReasonCode.HUMAN_REJECTED), at_ms=10)

    before = {span_id(s): s for s in spans_for_events(j.events[:waiting])}
    after = {span_id(s): s for s in spans_for_events(j.events)}

    assert sorted(s.name for s in before.values()) == [
        "apply_guardrail dirk DIM",
        "context",
        REASON,
        "invoke_workflow reorder",
    ]
    assert attrs(before[span_id_for(PARENT, "flow", 0)])["dir.status"] == "ESCALATED"
    for sid, span in before.items():
        assert after[sid].to_json() == span.to_json()
    resume = after[span_id_for(PARENT, "resume", 0)]
    assert attrs(resume)["dir.status"] == "ABORTED"
    assert resume.status.status_code is StatusCode.UNSET  # a human's rejection is no fault
    (escalation,) = [s for s in after.values() if s.name.startswith("escalation")]
    assert attrs(escalation)["dir.human_reason"] == "no"


def test_duplicates_inside_a_flow_are_events_on_its_root_span() -> None:
    j = JournalBuilder()
    j.add(FlowCreated(root_dfid=PARENT), at_ms=0)
    j.add(DuplicateSuppressed(key="key-1", source="agent"), at_ms=1)
    j.add(FlowClosed(), at_ms=2)

    (root,) = spans_for_events(j.events)

    (event,) = root.events
    assert event.name == "duplicate_suppressed"
    assert dict(event.attributes or {}) == {"dir.idempotency_key": "key-1", "dir.source": "agent"}


# --- configuration and the disabled path ----------------------------------------


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"OTEL_SERVICE_NAME": "x"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"},
    ],
)
def test_export_is_off_unless_configured(env: dict[str, str]) -> None:
    assert configure_exporter(env) is None
    # Metrics follow their own variable (and an endpoint): off too when it says none.
    assert not Telemetry.from_env({**env, "OTEL_METRICS_EXPORTER": "none"}).enabled


def exporter_of(env: dict[str, str]) -> SpanExporter:
    """Return the exporter ``env`` configures, shutting its processor down again."""
    processor = configure_exporter(env)
    assert isinstance(processor, SpanShipper)
    processor.shutdown()
    return processor.exporter


@pytest.mark.parametrize(
    ("env", "endpoint"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "http://c:4318/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/t"}, "http://c:4318/t"),
    ],
)
def test_the_http_endpoint_follows_the_sdk_rule(env: dict[str, str], endpoint: str) -> None:
    exporter = exporter_of(env)

    assert isinstance(exporter, HttpExporter)
    assert exporter._endpoint == endpoint


def test_the_protocol_and_exporter_variables_choose_the_exporter() -> None:
    grpc = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    assert isinstance(exporter_of(grpc), GrpcExporter)
    assert isinstance(exporter_of({"OTEL_TRACES_EXPORTER": "console"}), ConsoleSpanExporter)

    both = configure_exporter(
        {"OTEL_TRACES_EXPORTER": "otlp,console", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    )
    assert both is not None
    both.shutdown()


async def test_disabled_telemetry_is_a_no_op() -> None:
    j = JournalBuilder()
    executed_flow(j)
    telemetry = Telemetry(None)

    telemetry.emit(j.events)

    assert not telemetry.enabled
    await telemetry.run(batches([j.events]))  # drains and returns
    assert telemetry.shutdown()


async def batches(chunks: Iterable[list[Event]]) -> AsyncIterator[list[Event]]:
    for chunk in chunks:
        yield chunk


async def test_run_exports_each_flow_as_its_batches_arrive() -> None:
    j = JournalBuilder()
    executed_flow(j)
    exporter = InMemorySpanExporter()
    telemetry = Telemetry(SimpleSpanProcessor(exporter))

    await telemetry.run(batches([j.events[:3], j.events[3:]]))

    assert len(exporter.get_finished_spans()) == 5
    telemetry.shutdown()


# --- through a real OTLP receiver -----------------------------------------------


async def read_line(stdout: BufferedByteReceiveStream) -> str:
    return (await stdout.receive_until(b"\n", 1 << 20)).decode()


@pytest.mark.parametrize("compression", ["none", "gzip"])
async def test_spans_reach_a_real_otlp_receiver(compression: str) -> None:
    j = JournalBuilder()
    executed_flow(j)
    expected = {span_id(s): s for s in spans_for_events(j.events)}
    trace_hex = f"{trace_id_for(PARENT):032x}"

    with anyio.fail_after(30):
        async with await anyio.open_process([sys.executable, str(RECEIVER)]) as receiver:
            try:
                assert receiver.stdout is not None
                stdout = BufferedByteReceiveStream(receiver.stdout)
                port = int((await read_line(stdout)).removeprefix("PORT "))
                env = {
                    "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                    "OTEL_EXPORTER_OTLP_COMPRESSION": compression,
                    "OTEL_SERVICE_NAME": "dir-test",
                }
                telemetry = Telemetry.from_env(env)
                telemetry.emit(j.events)
                await anyio.to_thread.run_sync(telemetry.shutdown)

                received: dict[int, dict[str, Any]] = {}
                while received.keys() != expected.keys():
                    span = json.loads(await read_line(stdout))
                    if span.get("trace_id") == trace_hex:
                        received[int(span["span_id"], 16)] = span
            finally:
                receiver.terminate()

    root = expected[span_id_for(PARENT, "flow", 0)]
    for sid, span in received.items():
        assert span["name"] == expected[sid].name
        assert span["service_name"] == "dir-test"
        parent = parent_id(expected[sid])
        assert span["parent_span_id"] == (f"{parent:016x}" if parent else "")
    assert received[span_id(root)]["attributes"]["dir.dfid"] == PARENT
    assert received[span_id(root)]["attributes"]["dir.attempts"] == 1


def closed_port() -> int:
    """A port nothing listens on (nor will: no other worker is handed it)."""
    return free_port()


async def test_shutdown_returns_when_the_collector_is_unreachable() -> None:
    j = JournalBuilder()
    executed_flow(j)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed_port()}"}
    telemetry = Telemetry.from_env(env)
    telemetry.emit(j.events)

    # Abandoning the worker thread on timeout keeps a regression from hanging the suite.
    with anyio.fail_after(20):
        finished = await anyio.to_thread.run_sync(telemetry.shutdown, abandon_on_cancel=True)

    assert isinstance(finished, bool)
    assert not telemetry.enabled


def test_a_compensated_saga_ends_its_trace_with_its_compensations() -> None:
    j = JournalBuilder()
    j.add(FlowCreated(root_dfid=PARENT, topic="desk.rebalance"), at_ms=0)
    j.add(ContextCompiled(attempt=1, context_ref="ctx-1"), at_ms=1)
    j.add(proposal(1, kind="desk.rebalance"), at_ms=5)
    j.add(ProposalAccepted(attempt=1), at_ms=6)
    j.add(
        FlowFlagged(guard="direction_mismatch", reason="says hedge, buys", confidence="0.7"),
        at_ms=6,
    )
    sell = ExecutionIntent(key="k-sell", kind="sell", adapter="broker", step=0)
    buy = ExecutionIntent(key="k-buy", kind="buy", adapter="broker", step=1)
    j.add(ExecutionStarted(intent=sell), at_ms=7)
    j.add(ExecutionSucceeded(key="k-sell", external_id="S-1"), at_ms=9)
    j.add(ExecutionStarted(intent=buy), at_ms=10)
    j.add(ExecutionFailed(key="k-buy", error="halted"), at_ms=12)
    j.add(FlowDirty(step=1, reason_code=ReasonCode.EXECUTION_FAILED, detail="halted"), at_ms=13)
    undo = ExecutionIntent(key="k-sell-undo", kind="buy_back", adapter="broker", step=0)
    j.add(CompensationStarted(intent=undo), at_ms=14)
    j.add(CompensationSucceeded(key="k-sell-undo", step=0, external_id="B-1"), at_ms=20)
    j.add(FlowCompensated(steps=1), at_ms=21)

    projector = SpanProjector()
    projector.feed(j.events)
    assert projector.open_flows == 0, "FlowCompensated ends the flow"
    spans = spans_for_events(j.events)
    root = root_of(spans, PARENT)
    assert attrs(root)["dir.status"] == "COMPENSATED"
    assert root.status.status_code is StatusCode.ERROR
    assert root.status.description == "COMPENSATED"
    assert attrs(root)["dir.needs_review"] is True
    assert [e.name for e in root.events] == ["needs_review", "dirty"]
    [compensate] = by_name(spans)["compensate buy_back"]
    assert compensate.parent is not None and compensate.parent.span_id == span_id(root)
    assert attrs(compensate)["dir.idempotency_key"] == "k-sell-undo"
    assert attrs(compensate)["dir.external_id"] == "B-1"
    assert (compensate.start_time, compensate.end_time) == (T0 + 14 * MS, T0 + 20 * MS)


def test_import_kernel_imports_no_exporter() -> None:
    probe = (
        "import sys, kernel, kernel.telemetry, kernel.cli._main\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('opentelemetry.exporter', 'grpc')))\n"
        "print(bad)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_missing_exporter_package_is_named_not_raised_at_the_kernel(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # As if `dir-kernel[otlp]` were not installed: the import of the exporter fails.
    http = "opentelemetry.exporter.otlp.proto.http"
    monkeypatch.setitem(sys.modules, f"{http}.trace_exporter", None)
    monkeypatch.setitem(sys.modules, f"{http}.metric_exporter", None)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}

    with pytest.raises(ExporterUnavailable, match=r"dir-kernel\[otlp\]"):
        configure_exporter(env)
    assert not Telemetry.from_env(env).enabled
    assert "dir-kernel[otlp]" in caplog.text


# --- properties: any cut of the journal, any batching ------------------------------------


def varied_journal() -> list[Event]:
    """Flows of every shape: executed, escalated and decided, rejected then revised, a child."""
    j = JournalBuilder()
    executed_flow(j)
    other = str(uuid.UUID(int=7, version=4))
    j.add(FlowCreated(root_dfid=other, topic="stock.low"), at_ms=100, dfid=other)
    j.add(FlowCreated(root_dfid=other), at_ms=100, dfid=CHILD, parent_dfid=other)
    j.add(ContextCompiled(attempt=1, context_ref="c"), at_ms=100, dfid=other)
    j.add(proposal(1), at_ms=101, dfid=other)
    feedback = Feedback(reason_code=ReasonCode.RISK_LIMIT_EXCEEDED, detail="too much")
    j.add(ProposalRejected(attempt=1, feedback=feedback), at_ms=101, dfid=other)
    j.add(ContextCompiled(attempt=2, context_ref="d"), at_ms=101, dfid=other)
    j.add(proposal(2), at_ms=102, dfid=other)
    j.add(FlowEscalated(reason_code=ReasonCode.APPROVAL_REQUIRED), at_ms=102, dfid=other)
    j.add(FlowClosed(), at_ms=103, dfid=CHILD, parent_dfid=other)
    j.add(HumanDecided(decision="approve", operator="o"), at_ms=900, dfid=other, agent_id=None)
    j.add(ProposalAccepted(attempt=2, by_human=True), at_ms=900, dfid=other)
    intent = ExecutionIntent(key="k2", kind="reorder", adapter="erp")
    j.add(ExecutionStarted(intent=intent), at_ms=900, dfid=other)
    j.add(ExecutionSucceeded(key="k2"), at_ms=901, dfid=other)
    j.add(FlowClosed(), at_ms=901, dfid=other)
    return j.events


VARIED = varied_journal()


def content_of(spans: Iterable[ReadableSpan]) -> dict[int, str]:
    return {span_id(s): s.to_json() for s in spans}


@settings(max_examples=40, derandomize=True, deadline=None)
@given(cut=st.integers(min_value=0, max_value=len(VARIED)))
def test_a_span_sent_from_any_cut_of_the_journal_has_its_final_content(cut: int) -> None:
    early = content_of(spans_for_events(VARIED[:cut]))
    final = content_of(spans_for_events(VARIED))

    assert len(early) == len(spans_for_events(VARIED[:cut])), "an id sent twice in one run"
    for sid, text in early.items():
        assert final[sid] == text


@settings(max_examples=40, derandomize=True, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(VARIED)), max_size=6))
def test_batching_never_changes_the_spans(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(VARIED)]
    collector = Collector()
    telemetry = Telemetry(collector, sampler=ALWAYS_ON, span_time="journal")
    for start, stop in itertools.pairwise(bounds):
        telemetry.emit(VARIED[start:stop])

    assert content_of(collector.spans) == content_of(spans_for_events(VARIED))


def test_metrics_count_flows_verdicts_waits_retries_restarts_and_breaches() -> None:
    reader = InMemoryMetricReader()
    telemetry = Telemetry(None, meter_provider=MeterProvider([reader]))
    events = [*VARIED]
    extra = JournalBuilder()
    extra.events = events
    extra.add(ActorRestarted(actor="dim", error="boom", restarts=1), at_ms=950, dfid=None)
    extra.add(
        ExecutionRetried(key="k", attempt=1, error="busy", delay_ns=1, retry_at_ns=2), at_ms=951
    )
    breach = DriftBreached(
        pack="pay@1.1.0", monitor="refusals", metric="refusal_rate", by="agent",
        subject="clerk", value=0.5, bound=0.3, window_start_ns=0, window_end_ns=952_000_000,
        samples=10, action="demote",
    )  # fmt: skip
    extra.add(breach, at_ms=952, dfid=None)

    telemetry.emit(events)

    points: dict[tuple[str, tuple[tuple[str, Any], ...]], Any] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource_metrics in data.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    key = (metric.name, tuple(sorted((point.attributes or {}).items())))
                    points[key] = getattr(point, "value", None) or getattr(point, "count", None)
    assert points[("dir.flows", (("dir.status", "CLOSED"),))] == 3
    rejected = (("dir.reason_code", "RISK_LIMIT_EXCEEDED"), ("dir.verdict", "REJECTED"))
    assert points[("dir.verdicts", rejected)] == 1
    assert points[("dir.verdicts", (("dir.verdict", "ACCEPTED"),))] == 2
    assert points[("dir.escalation.wait", ())] == 1
    assert points[("dir.actor.restarts", (("dir.actor", "dim"),))] == 1
    assert points[("dir.execution.retries", ())] == 1
    drifted = (
        ("dir.agent", "clerk"),
        ("dir.drift.action", "demote"),
        ("dir.drift.by", "agent"),
        ("dir.drift.metric", "refusal_rate"),
        ("dir.drift.monitor", "refusals"),
    )
    assert points[("dir.drift.breaches", drifted)] == 1
    assert ("dir.escalations.waiting", ()) in points  # back to 0 after the decision
    assert points[("dir.execution.duration", (("dir.adapter", "erp"), ("outcome", "ok")))] == 2
    assert telemetry.shutdown()
