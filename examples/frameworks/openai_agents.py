"""The OpenAI Agents SDK, governed: a scripted model books four rooms, offline.

    python -m examples.frameworks.openai_agents [--db trip.db]

The dirk side is three lines (marked ``# dirk``); the rest is the SDK's own.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from agents import Agent, Runner, RunState, set_tracing_disabled
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

from examples.frameworks._scene import (
    AGENT,
    CONVERSATION,
    TOOL,
    main_of,
    next_call,
    operator_approves,
)
from kernel.frameworks import Gate
from kernel.frameworks.openai_agents import governed_tools, settle


def outputs(call: ModelCall) -> list[str]:
    """The tool outputs the model has seen so far."""
    return [
        str(item["output"])
        for item in call.input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]


def turn(call: ModelCall) -> list[Any]:
    """The scripted model's turn: the next call, or done."""
    nxt = next_call(outputs(call))
    if nxt is None:
        return [assistant_message("four rooms handled")]
    return [function_call(TOOL, nxt[1], call_id=nxt[0])]


def booker(gate: Gate) -> Agent[Any]:
    """A fresh agent (as another process would build it) with the governed tools."""
    model = ScriptedModel([ModelStep.respond(turn)] * 6)
    return Agent(name=AGENT, tools=governed_tools(gate), model=model)  # type: ignore[arg-type]  # dirk


async def play(gate: Gate, workdir: Path) -> list[str]:
    """Run until the approval pause, save the run, let the operator decide, resume."""
    context = {"conversation": CONVERSATION}
    run = await Runner.run(booker(gate), "book the four rooms", context=context)
    print("paused on:", [(i.tool_name, i.call_id) for i in run.interruptions])
    saved = workdir / "run_state.json"
    saved.write_text(run.to_state().to_string())  # the paused run, stored anywhere

    await operator_approves(gate.kernel)  # on the console, with `dirk decide`, or MCP

    agent = booker(gate)
    state = await RunState.from_string(agent, saved.read_text())
    assert await settle(gate, state, CONVERSATION) == []  # dirk: approve what the kernel settled
    done = await Runner.run(agent, state)
    print("model:", done.final_output)
    return [
        str(i.output) for i in done.new_items if getattr(i, "type", "") == "tool_call_output_item"
    ]


set_tracing_disabled(True)  # the SDK's own tracer would export to OpenAI


def main(argv: list[str] | None = None) -> int:
    """Run the example."""
    return main_of("openai_agents", play, argv)


if __name__ == "__main__":
    sys.exit(main())
