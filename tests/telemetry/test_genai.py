"""The spans speak the GenAI conventions of the pinned semconv package and OpenInference.

The root is the workflow (``invoke_workflow``), the reasoning span the agent, execution a
tool, the DIM's judgement a guardrail; Phoenix fills its input and output columns from the
root and ``judge``. Ids a framework adapter records on a flow's events (a conversation, a
tool call, the agent's version) are carried when present; nothing is made up otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

from kernel.core.events import (
    ContextCompiled,
    ExecutionIntent,
    ExecutionStarted,
    ExecutionSucceeded,
    Feedback,
    FlowClosed,
    FlowCreated,
    FlowEscalated,
    Manifest,
    ProposalAccepted,
    ProposalRecord,
    ProposalRejected,
    ProposalSubmitted,
)
from kernel.core.reasons import ReasonCode
from kernel.telemetry import span_id_for, spans_for_events
from tests.support.helpers import kernel_for
from tests.support.hostile import hostile_text, hostile_values
from tests.telemetry.test_telemetry import PARENT, JournalBuilder, executed_flow, proposal

LIMIT = 4096  # characters of an input or output value


class ToolCallProposal(ProposalRecord, frozen=True):
    """A proposal made of a framework's tool call, with that call's id."""

    tool_call_id: str = ""


def spans_by_kind(spans: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    """The flow's spans by the first word of their names (one of each expected)."""
    named: dict[str, ReadableSpan] = {}
    for span in spans:
        assert span.name.split()[0] not in named
        named[span.name.split()[0]] = span
    return named


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_the_root_is_the_workflow_and_each_stage_has_its_openinference_kind() -> None:
    j = JournalBuilder()
    executed_flow(j)

    named = spans_by_kind(spans_for_events(j.events))

    root = attrs(named["invoke_workflow"])
    assert named["invoke_workflow"].name == "invoke_workflow reorder"
    assert root[gen_ai.GEN_AI_OPERATION_NAME] == "invoke_workflow"
    assert root[gen_ai.GEN_AI_WORKFLOW_NAME] == "reorder"
    reason = attrs(named["invoke_agent"])
    assert reason[gen_ai.GEN_AI_OPERATION_NAME] == "invoke_agent"
    # The provider names a model call's: the kernel makes none, so no span of its says one.
    assert all(gen_ai.GEN_AI_PROVIDER_NAME not in attrs(s) for s in named.values())
    # Phoenix reads AGENT and TOOL off gen_ai.operation.name; the root and judge say theirs.
    assert {name: attrs(s).get("openinference.span.kind") for name, s in named.items()} == {
        "invoke_workflow": "CHAIN",
        "context": None,
        "invoke_agent": None,
        "apply_guardrail": "GUARDRAIL",
        "execute_tool": None,
    }
    assert attrs(named["execute_tool"])[gen_ai.GEN_AI_OPERATION_NAME] == "execute_tool"

    # Nothing is invented where no event says it.
    for span in named.values():
        for name in (
            gen_ai.GEN_AI_CONVERSATION_ID,
            gen_ai.GEN_AI_TOOL_CALL_ID,
            gen_ai.GEN_AI_AGENT_VERSION,
        ):
            assert name not in attrs(span)


def test_judge_shows_the_proposal_in_and_the_verdict_out() -> None:
    j = JournalBuilder()
    j.add(FlowCreated(root_dfid=PARENT, topic="stock.low"), at_ms=0)
    j.add(ContextCompiled(attempt=1, context_ref="ctx-1"), at_ms=1)
    j.add(proposal(1), at_ms=2)
    feedback = Feedback(reason_code=ReasonCode.RISK_LIMIT_EXCEEDED, detail="qty 5 > 3")
    j.add(ProposalRejected(attempt=1, feedback=feedback), at_ms=3)
    j.add(ContextCompiled(attempt=2, context_ref="ctx-2"), at_ms=4)
    j.add(proposal(2), at_ms=5)
    j.add(ProposalAccepted(attempt=2), at_ms=6)
    j.add(FlowClosed(), at_ms=7)

    judged = sorted(
        (s for s in spans_for_events(j.events) if s.name.startswith("apply_guardrail")),
        key=lambda s: attrs(s)["dir.attempt"],
    )

    first, second = (attrs(s) for s in judged)
    assert json.loads(first["input.value"]) == {
        "kind": "reorder",
        "params": {"qty": 5, "sku": "A-1"},
    }
    assert json.loads(first["output.value"]) == {
        "verdict": "REJECTED",
        "reason_code": "RISK_LIMIT_EXCEEDED",
        "detail": "qty 5 > 3",
    }
    assert json.loads(second["output.value"]) == {"verdict": "ACCEPTED"}


def test_a_waiting_flows_root_says_why_it_waits() -> None:
    j = JournalBuilder()
    j.add(FlowCreated(root_dfid=PARENT, topic="stock.low"), at_ms=0)
    j.add(ContextCompiled(attempt=1, context_ref="ctx-1"), at_ms=1)
    j.add(proposal(1), at_ms=2)
    j.add(
        FlowEscalated(
            reason_code=ReasonCode.RISK_LIMIT_EXCEEDED,
            impact="HIGH_IMPACT",
            detail="amount 2992640 is above 2500000",
        ),
        at_ms=3,
    )

    spans = {s.context.span_id: s for s in spans_for_events(j.events) if s.context}

    root = attrs(spans[span_id_for(PARENT, "flow", 0)])
    assert root["dir.status"] == "ESCALATED"
    assert root["dir.reason_code"] == "RISK_LIMIT_EXCEEDED"
    assert root["dir.impact"] == "HIGH_IMPACT"
    assert root["dir.detail"] == "amount 2992640 is above 2500000"
    assert json.loads(root["output.value"]) == {
        "status": "ESCALATED",
        "reason_code": "RISK_LIMIT_EXCEEDED",
        "impact": "HIGH_IMPACT",
        "detail": "amount 2992640 is above 2500000",
    }
    assert json.loads(root["input.value"])["kind"] == "reorder"
    (judge,) = [attrs(s) for s in spans.values() if s.name.startswith("apply_guardrail")]
    assert json.loads(judge["output.value"])["verdict"] == "ESCALATED"


def test_a_conversation_a_tool_call_and_an_agent_version_are_carried_when_recorded() -> None:
    j = JournalBuilder()
    created = FlowCreated(
        root_dfid=PARENT, topic="stock.low", conversation_id="conv_42", agent_version="2.1.0"
    )
    j.add(created, at_ms=0)
    j.add(ContextCompiled(attempt=1, context_ref="ctx-1"), at_ms=1)
    record = ToolCallProposal(kind="reorder", params={"sku": "A-1"}, tool_call_id="call_7")
    j.add(ProposalSubmitted(attempt=1, proposal=record), at_ms=2)
    j.add(ProposalAccepted(attempt=1), at_ms=3)
    intent = ExecutionIntent(key="key-1", kind="reorder", adapter="erp")
    j.add(ExecutionStarted(intent=intent), at_ms=4)
    j.add(ExecutionSucceeded(key="key-1"), at_ms=5)
    j.add(FlowClosed(), at_ms=6)

    named = spans_by_kind(spans_for_events(j.events))

    for span in named.values():
        assert attrs(span)[gen_ai.GEN_AI_CONVERSATION_ID] == "conv_42"
        assert attrs(span)[gen_ai.GEN_AI_AGENT_VERSION] == "2.1.0"
    assert attrs(named["execute_tool"])[gen_ai.GEN_AI_TOOL_CALL_ID] == "call_7"
    assert attrs(named["invoke_workflow"])[gen_ai.GEN_AI_TOOL_CALL_ID] == "call_7"


def test_secret_looking_keys_stay_out_and_values_stay_bounded() -> None:
    j = JournalBuilder()
    j.add(FlowCreated(root_dfid=PARENT, topic="mail.send"), at_ms=0)
    j.add(ContextCompiled(attempt=1, context_ref="ctx-1"), at_ms=1)
    params = {
        "to": "ana@example.com",
        "api_key": "sk-live-123",
        "smtp": {"password": "hunter2", "host": "mail"},
        "headers": [{"Authorization": "Bearer abc"}],
        "session_token": "tok",
        "max_tokens": 5,
    }
    record = ProposalRecord(kind="mail.send", params=params, explain="x" * 100_000)
    j.add(ProposalSubmitted(attempt=1, proposal=record), at_ms=2)
    j.add(ProposalAccepted(attempt=1), at_ms=3)
    j.add(FlowClosed(), at_ms=4)

    for span in spans_for_events(j.events):
        for name in ("input.value", "output.value"):
            text = attrs(span).get(name, "")
            assert len(text) <= LIMIT
            for secret in ("sk-live-123", "hunter2", "Bearer abc", '"tok"'):
                assert secret not in text
    (judge,) = [s for s in spans_for_events(j.events) if s.name.startswith("apply_guardrail")]
    shown = json.loads(attrs(judge)["input.value"])
    assert len(shown["explain"]) == 1025 and shown["explain"].endswith("…")
    assert shown["params"]["api_key"] == "[redacted]" and shown["params"]["max_tokens"] == 5
    assert shown["params"]["smtp"] == {"password": "[redacted]", "host": "mail"}
    assert shown["params"]["headers"] == [{"Authorization": "[redacted]"}]


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    params=st.dictionaries(hostile_text(max_size=12), hostile_values(max_leaves=12), max_size=5),
    explain=hostile_text(max_size=60),
    detail=hostile_text(max_size=40),
)
def test_any_proposal_gives_spans_the_otlp_encoder_can_send(
    params: dict[str, Any], explain: str, detail: str
) -> None:
    j = JournalBuilder()
    j.add(FlowCreated(root_dfid=PARENT, topic="t"), at_ms=0)
    j.add(ContextCompiled(attempt=1, context_ref="ctx-1"), at_ms=1)
    record = ProposalRecord(kind="k", params=params, explain=explain)
    j.add(ProposalSubmitted(attempt=1, proposal=record), at_ms=2)
    feedback = Feedback(reason_code=ReasonCode.SCHEMA_INVALID, detail=detail)
    j.add(ProposalRejected(attempt=1, feedback=feedback), at_ms=3)

    spans = spans_for_events(j.events)

    for span in spans:
        for name in ("input.value", "output.value"):
            if name in attrs(span):
                text = attrs(span)[name]
                assert isinstance(text, str) and len(text) <= LIMIT
                text.encode("utf-8")  # no lone surrogate reaches an attribute
    # What the root and judge add never keeps an exporter from encoding a batch (the
    # feedback's own detail goes as it was recorded, and a journal records only UTF-8).
    if "\ud800" not in detail and not any(0xD800 <= ord(c) <= 0xDFFF for c in detail):
        assert encode_spans(spans).SerializeToString()


async def test_an_agents_own_version_reaches_its_flows_and_their_spans(tmp_path: Path) -> None:
    async with kernel_for(tmp_path / "j.db") as kernel:
        await kernel.handshake(
            Manifest(
                agent_id="clerk", version="1.0.0", capabilities=["test.transfer"],
                agent_version="clerk-2.1.0",
            )
        )  # fmt: skip
        decision = await kernel.propose(
            "clerk", "test.transfer", {"account": "acc-1", "amount_cents": 100},
            explain="a test", confidence=0.9,
        )  # fmt: skip
        events = await kernel.journal.read(dfid=decision.dfid)
    created = events[0].payload
    assert isinstance(created, FlowCreated) and created.agent_version == "clerk-2.1.0"
    for span in spans_for_events(events):
        assert attrs(span)[gen_ai.GEN_AI_AGENT_VERSION] == "clerk-2.1.0"
