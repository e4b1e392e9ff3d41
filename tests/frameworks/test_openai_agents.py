"""The OpenAI Agents SDK under the kernel, offline, with the SDK's own ScriptedModel."""

# ruff: noqa: E402 (the framework's imports follow the check that its extra is installed)

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.extras import require

require("agents", "openai-agents")  # skips outside CI, fails under it

from agents import Agent, Runner, RunState, set_tracing_disabled
from agents.exceptions import ToolInputGuardrailTripwireTriggered
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from agents.usage import Usage
from opentelemetry.sdk.trace import TracerProvider

from kernel.core.reasons import ReasonCode
from kernel.frameworks import Gate
from kernel.frameworks.openai_agents import governed_tools, settle, stop_of
from tests.frameworks.support import (
    AGENT,
    OVER_LIMIT,
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

set_tracing_disabled(True)  # the SDK's own tracer would try to export to OpenAI


def outputs(call: ModelCall) -> list[str]:
    """The tool outputs the model has seen so far."""
    return [
        str(item["output"])
        for item in call.input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]


def booker(gate: Gate, script: list[dict[str, Any]], seen: list[list[str]]) -> Agent[Any]:
    """A fresh agent whose model books ``script`` one call a turn, deciding from the history."""

    def turn(call: ModelCall) -> list[Any]:
        done = outputs(call)
        seen.append(done)
        if len(done) < len(script):
            n = len(done)
            return [function_call(TOOL, script[n], call_id=f"call_{n + 1}")]
        return [assistant_message("done")]

    model = ScriptedModel([ModelStep.respond(turn)] * (len(script) + 1))
    return Agent(name=AGENT, tools=governed_tools(gate), model=model)  # type: ignore[arg-type]


async def test_four_rooms_refusals_reach_the_model_and_the_approval_resumes_once(
    tmp_path: Path,
) -> None:
    hotel = Hotel()
    seen: list[list[str]] = []
    context = {"conversation": "conv-42"}
    async with booking_kernel(tmp_path / "j.db", hotel) as gate:
        first = await Runner.run(booker(gate, SCRIPT, seen), "book four rooms", context=context)
        # The fourth call waits for a human: the run pauses on it.
        assert [i.call_id for i in first.interruptions] == ["call_4"]
        said = seen[-1]
        assert said[0].startswith("EXECUTED")
        assert said[1].startswith("REFUSED RISK_LIMIT_EXCEEDED: total 450000 cents is above 300000")
        assert said[2].startswith("REFUSED CONSTRAINT_VIOLATION")
        assert len(hotel.calls) == 1
        saved = first.to_state().to_string()

        # Before an operator decided, nothing is approved in the SDK.
        state = await RunState.from_string(booker(gate, SCRIPT, seen), saved)
        assert [d.verdict.value for d in await settle(gate, state, "conv-42")] == ["ESCALATED"]

        await approve_all(gate.kernel)
        for _ in range(2):  # the same saved state resumed twice: one booking
            agent = booker(gate, SCRIPT, seen)
            state = await RunState.from_string(agent, saved)
            assert await settle(gate, state, "conv-42") == []
            final = await Runner.run(agent, state)
            assert final.final_output == "done"
            assert seen[-1][3].startswith("EXECUTED")
        assert len(hotel.calls) == 2
        assert [c.params["nightly_rate_cents"] for c in hotel.calls] == [10_000, 50_000]


async def test_an_operators_rejection_is_the_tools_output(tmp_path: Path) -> None:
    hotel = Hotel()
    seen: list[list[str]] = []
    script = [SCRIPT[3]]
    async with booking_kernel(tmp_path / "j.db", hotel) as gate:
        run = await Runner.run(booker(gate, script, seen), "book", context={"conversation": "c"})
        assert [i.call_id for i in run.interruptions] == ["call_1"]
        [flow] = gate.kernel.flows("ESCALATED")
        await gate.kernel.decide(flow.dfid, "reject", operator="ana", reason="too dear")
        agent = booker(gate, script, seen)
        state = await RunState.from_string(agent, run.to_state().to_string())
        assert await settle(gate, state, "c") == []
        await Runner.run(agent, state)
        assert seen[-1][0].startswith("REFUSED")
        assert seen[-1][0] == "REFUSED HUMAN_REJECTED: ana: too dear"
        assert hotel.calls == []


async def test_the_apps_span_is_the_flows_parent_and_the_call_id_is_recorded(
    tmp_path: Path,
) -> None:
    tracer = TracerProvider().get_tracer("app")
    seen: list[list[str]] = []
    async with booking_kernel(tmp_path / "j.db", Hotel()) as gate:
        with tracer.start_as_current_span("conversation") as span:
            await Runner.run(booker(gate, SCRIPT[:1], seen), "book", context={"conversation": "t"})
        trace_id = f"{span.get_span_context().trace_id:032x}"
        [flow] = [
            f for f in gate.kernel.flows() if f.status.value == "CLOSED" and f.agent_id == AGENT
        ]
        made = await created(gate.kernel, flow.dfid)
        assert made.tool_call_id == "call_1" and made.conversation_id == "t"
        assert made.traceparent is not None and trace_id in made.traceparent


async def test_a_looping_agent_stops_when_the_governor_trips(tmp_path: Path) -> None:
    seen: list[list[str]] = []
    async with booking_kernel(tmp_path / "j.db", Hotel(), max_attempts=3) as gate:
        with pytest.raises(ToolInputGuardrailTripwireTriggered) as raised:
            await Runner.run(
                booker(gate, [OVER_LIMIT] * 25, seen),
                "book",
                context={"conversation": "loop"},
                max_turns=30,
            )
        stopped = stop_of(raised.value)
        assert stopped is not None and stopped.reason_code is ReasonCode.REASONING_EXHAUSTION
        assert len(seen) == 3  # the model was asked three times, and not after the stop
        assert await proposals(gate.kernel) == 3


async def test_a_suspended_agents_run_stops_on_its_first_call(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db", Hotel()) as gate:
        await suspend(gate.kernel)
        seen: list[list[str]] = []
        with pytest.raises(ToolInputGuardrailTripwireTriggered) as raised:
            await Runner.run(
                booker(gate, [OVER_LIMIT] * 5, seen), "book", context={"conversation": "s"}
            )
        stopped = stop_of(raised.value)
        assert stopped is not None and stopped.reason_code is ReasonCode.AGENT_SUSPENDED
        assert len(seen) == 1  # one call, refused at the session (no flow): then the stop


async def test_the_runs_tokens_are_charged_to_the_flow_of_each_call(tmp_path: Path) -> None:
    # Each model call reports 120 tokens; the SDK names no model to a tool: the gate's does.
    def turn(call: ModelCall) -> ModelStep:
        n = len(outputs(call))
        said = [assistant_message("done")]
        if n < 2:
            said = [function_call(TOOL, [SCRIPT[0], SCRIPT[3]][n], call_id=f"call_{n + 1}")]
        used = Usage(requests=1, input_tokens=100, output_tokens=20, total_tokens=120)
        return ModelStep(output=said, usage=used)

    async with booking_kernel(tmp_path / "j.db", Hotel(), model="gpt-test") as gate:
        model = ScriptedModel([ModelStep.respond(turn)] * 3)
        agent = Agent(name=AGENT, tools=governed_tools(gate), model=model)  # type: ignore[arg-type]
        await Runner.run(agent, "book two rooms", context={"conversation": "usage"})
        assert await charged(gate.kernel) == [{"gpt-test": 120}, {"gpt-test": 120}]
