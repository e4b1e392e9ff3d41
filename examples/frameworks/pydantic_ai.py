"""PydanticAI, governed: a scripted model (FunctionModel) books four rooms, offline.

    python -m examples.frameworks.pydantic_ai [--db trip.db]

The dirk side is three lines (marked ``# dirk``); the rest is PydanticAI's own.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic_ai import Agent, ConversationTypeAdapter, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from examples.frameworks._scene import CONVERSATION, TOOL, main_of, next_call, operator_approves
from kernel.frameworks import Gate
from kernel.frameworks.pydantic_ai import governed_toolset, settle


def outputs(messages: list[ModelMessage]) -> list[str]:
    """The tool outputs the model has seen so far."""
    return [str(p.content) for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]


def turn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The scripted model's turn: the next call, or done."""
    nxt = next_call(outputs(messages))
    if nxt is None:
        return ModelResponse(parts=[TextPart("four rooms handled")])
    return ModelResponse(parts=[ToolCallPart(TOOL, nxt[1], tool_call_id=nxt[0])])


async def play(gate: Gate, workdir: Path) -> list[str]:
    """Run until the approval pause, save the conversation, let the operator decide, resume."""
    agent = Agent(
        FunctionModel(turn),
        toolsets=[governed_toolset(gate)],  # dirk
        output_type=[str, DeferredToolRequests],  # a run may end waiting for a human
    )
    run = await agent.run("book the four rooms", conversation_id=CONVERSATION)
    assert isinstance(run.output, DeferredToolRequests)
    print("paused on:", [(c.tool_name, c.tool_call_id) for c in run.output.approvals])
    saved = workdir / "conversation.json"
    saved.write_bytes(ConversationTypeAdapter.dump_json(run.conversation))

    await operator_approves(gate.kernel)  # on the console, with `dirk decide`, or MCP

    conversation = ConversationTypeAdapter.validate_json(saved.read_bytes())
    results, _waiting = await settle(gate, conversation)  # dirk: what the kernel settled
    done = await agent.run(conversation=conversation, deferred_tool_results=results)
    print("model:", done.output)
    return outputs(done.all_messages())


def main(argv: list[str] | None = None) -> int:
    """Run the example."""
    return main_of("pydantic_ai", play, argv)


if __name__ == "__main__":
    sys.exit(main())
