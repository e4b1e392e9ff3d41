"""PydanticAI under the kernel, offline, with PydanticAI's own FunctionModel."""

# ruff: noqa: E402 (the framework's imports follow the check that its extra is installed)

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tests.support.extras import require

require("pydantic_ai", "pydantic-ai")  # skips outside CI, fails under it

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent, ConversationTypeAdapter, DeferredToolRequests
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.usage import RequestUsage

from kernel.core.reasons import ReasonCode
from kernel.frameworks import Gate
from kernel.frameworks.pydantic_ai import RunStopped, governed_toolset, settle
from kernel.policy import EscalationBudget
from policies.booking import BOOKING
from tests.frameworks.support import (
    CHEAP,
    OVER_LIMIT,
    REVISED,
    SCRIPT,
    TOOL,
    Hotel,
    approve_all,
    booking_kernel,
    charged,
    created,
    proposals,
    suspend,
)


def booker(
    gate: Gate, script: list[dict[str, Any]], seen: list[list[str]], **kw: Any
) -> Agent[None, str | DeferredToolRequests]:
    """An agent whose model books ``script`` one call a turn, deciding from the history."""

    def turn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = [str(p.content) for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        seen.append(done)
        if len(done) < len(script):
            n = len(done)
            return ModelResponse(
                parts=[ToolCallPart(TOOL, script[n], tool_call_id=f"call_{n + 1}")]
            )
        return ModelResponse(parts=[TextPart("done")])

    return Agent(
        FunctionModel(turn),
        toolsets=[governed_toolset(gate)],
        output_type=[str, DeferredToolRequests],
        **kw,
    )


async def test_four_rooms_refusals_reach_the_model_and_the_approval_resumes_once(
    tmp_path: Path,
) -> None:
    hotel = Hotel()
    seen: list[list[str]] = []
    async with booking_kernel(tmp_path / "j.db", hotel) as gate:
        agent = booker(gate, SCRIPT, seen)
        first = await agent.run("book four rooms", conversation_id="conv-42")
        assert isinstance(first.output, DeferredToolRequests)
        assert [c.tool_call_id for c in first.output.approvals] == ["call_4"]
        assert first.output.metadata["call_4"]["reason_code"] == "APPROVAL_REQUIRED"
        said = seen[-1]
        assert said[0].startswith("EXECUTED")
        assert said[1].startswith("REFUSED RISK_LIMIT_EXCEEDED: total 450000 cents is above 300000")
        assert said[2].startswith("REFUSED CONSTRAINT_VIOLATION")
        saved = ConversationTypeAdapter.dump_json(first.conversation)

        # Before an operator decided, there is nothing to resume with.
        results, waiting = await settle(gate, ConversationTypeAdapter.validate_json(saved))
        assert results is None and [d.verdict.value for d in waiting] == ["ESCALATED"]

        await approve_all(gate.kernel)
        for _ in range(2):  # the same saved conversation resumed twice: one booking
            conversation = ConversationTypeAdapter.validate_json(saved)
            results, waiting = await settle(gate, conversation)
            assert results is not None and waiting == []
            final = await agent.run(conversation=conversation, deferred_tool_results=results)
            assert final.output == "done"
            assert seen[-1][3].startswith("EXECUTED")
        assert [c.params["nightly_rate_cents"] for c in hotel.calls] == [10_000, 50_000]


async def test_a_looping_agent_stops_when_the_governor_trips(tmp_path: Path) -> None:
    seen: list[list[str]] = []
    async with booking_kernel(tmp_path / "j.db", Hotel(), max_attempts=3) as gate:
        with pytest.raises(RunStopped) as raised:
            await booker(gate, [OVER_LIMIT] * 25, seen).run("book", conversation_id="loop")
        assert raised.value.reason_code is ReasonCode.REASONING_EXHAUSTION
        assert len(seen) == 3  # the model was asked three times, and not after the stop
        assert await proposals(gate.kernel) == 3


async def test_a_suspended_agents_run_stops_on_its_first_call(tmp_path: Path) -> None:
    seen: list[list[str]] = []
    async with booking_kernel(tmp_path / "j.db", Hotel()) as gate:
        await suspend(gate.kernel)
        with pytest.raises(RunStopped) as raised:
            await booker(gate, [OVER_LIMIT] * 5, seen).run("book", conversation_id="s")
        assert raised.value.reason_code is ReasonCode.AGENT_SUSPENDED
        assert len(seen) == 1  # one call, refused at the session (no flow): then the stop


async def test_the_tool_span_is_the_flows_parent(tmp_path: Path) -> None:
    provider, spans = TracerProvider(), InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    seen: list[list[str]] = []
    async with booking_kernel(tmp_path / "j.db", Hotel()) as gate:
        settings = InstrumentationSettings(tracer_provider=provider)
        agent = booker(gate, SCRIPT[:1], seen, capabilities=[Instrumentation(settings)])
        with provider.get_tracer("app").start_as_current_span("app") as span:
            run = await agent.run("book", conversation_id="t")
        assert run.output == "done"
        trace_id = f"{span.get_span_context().trace_id:032x}"
        [flow] = [f for f in gate.kernel.flows() if f.status.value == "CLOSED"]
        made = await created(gate.kernel, flow.dfid)
        assert made.tool_call_id == "call_1" and made.conversation_id == "t"
        # The link is to PydanticAI's `execute_tool` span, which carries the call id.
        [tool] = [s for s in spans.get_finished_spans() if s.name == f"execute_tool {TOOL}"]
        assert tool.attributes is not None and tool.attributes["gen_ai.tool.call.id"] == "call_1"
        tool_span = f"{tool.context.span_id:016x}" if tool.context else ""
        assert (made.traceparent or "").startswith(f"00-{trace_id}-{tool_span}-")


async def test_a_demoted_agents_runs_stop_with_the_demotions_reason_code(tmp_path: Path) -> None:
    pack = dataclasses.replace(BOOKING, escalation_budget=EscalationBudget(capacity=1))
    async with booking_kernel(tmp_path / "j.db", Hotel(), pack=pack) as gate:
        first = await booker(gate, [REVISED], []).run("book", conversation_id="a")
        assert isinstance(first.output, DeferredToolRequests)
        agent = booker(gate, [REVISED], [])
        second = await agent.run("book", conversation_id="b")
        assert isinstance(second.output, DeferredToolRequests)
        # The desk finds the budget spent: it aborts the escalation and demotes the agent.
        await gate.kernel.await_decision(second.output.metadata["call_1"]["dfid"])
        results, waiting = await settle(gate, second.conversation)
        assert waiting == [] and results is not None
        with pytest.raises(RunStopped) as resumed:
            await agent.run(conversation=second.conversation, deferred_tool_results=results)
        assert resumed.value.reason_code is ReasonCode.ESCALATION_BUDGET_EXHAUSTED
        with pytest.raises(RunStopped) as later:
            await booker(gate, [CHEAP], []).run("book", conversation_id="c")
        assert later.value.reason_code is ReasonCode.ESCALATION_BUDGET_EXHAUSTED
        assert "demoted to PASSIVE" in later.value.decision.detail


async def test_the_runs_tokens_are_charged_to_the_flow_of_each_call(tmp_path: Path) -> None:
    # Each model request reports 100 + 20 tokens: each call's flow is charged what the
    # run's total grew by since the conversation's last call, under the model's name.
    def turn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = sum(1 for m in messages for p in m.parts if isinstance(p, ToolReturnPart))
        parts: list[Any] = [TextPart("done")]
        if n < 2:
            parts = [ToolCallPart(TOOL, [CHEAP, REVISED][n], tool_call_id=f"call_{n + 1}")]
        return ModelResponse(parts=parts, usage=RequestUsage(input_tokens=100, output_tokens=20))

    async with booking_kernel(tmp_path / "j.db", Hotel()) as gate:
        agent = Agent(
            FunctionModel(turn, model_name="scripted"),
            toolsets=[governed_toolset(gate)],
            output_type=[str, DeferredToolRequests],
        )
        await agent.run("book two rooms", conversation_id="usage")
        assert await charged(gate.kernel) == [{"scripted": 120}, {"scripted": 120}]
