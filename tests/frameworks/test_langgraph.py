"""LangGraph under the kernel, offline, with a fake chat model and a SQLite checkpointer."""

# ruff: noqa: E402 (the framework's imports follow the check that its extra is installed)

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.support.extras import require

require("langgraph", "langgraph")  # skips outside CI, fails under it

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.pregel import Pregel
from langgraph.types import Command

from kernel.frameworks import Gate
from kernel.frameworks.langgraph import governed_tool_node, settle, stop_of
from tests.frameworks.support import (
    OVER_LIMIT,
    SCRIPT,
    TOOL,
    Hotel,
    approve_all,
    booking_kernel,
    charged,
    proposals,
    suspend,
)

USED = {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120}
"""What each reply of a model that reports usage says it spent."""


def scripted_chat(
    script: list[dict[str, Any]], seen: list[list[str]], usage: bool = False
) -> GenericFakeChatModel:
    """langchain-core's fake chat model, made stateless: each reply comes from the history.

    With ``usage``, each reply reports :data:`USED` as model ``chat-test``.
    """
    said: dict[str, Any] = (
        {"usage_metadata": USED, "response_metadata": {"model_name": "chat-test"}} if usage else {}
    )

    class ScriptedChat(GenericFakeChatModel):
        def _generate(self, messages: list[BaseMessage], *args: Any, **kw: Any) -> ChatResult:
            done = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
            seen.append(done)
            n = len(done)
            reply = AIMessage("done", **said)
            if n < len(script):
                call = {"name": TOOL, "args": script[n], "id": f"call_{n + 1}"}
                reply = AIMessage("", tool_calls=[call], **said)
            return ChatResult(generations=[ChatGeneration(message=reply)])

    return ScriptedChat(messages=iter(()))


@asynccontextmanager
async def booker(
    gate: Gate,
    path: Path,
    script: list[dict[str, Any]],
    seen: list[list[str]],
    usage: bool = False,
) -> AsyncIterator[Pregel[Any, Any, Any, Any]]:
    """A graph (model, then governed tools) checkpointed to the SQLite file ``path``."""
    model = scripted_chat(script, seen, usage)

    async def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", governed_tool_node(gate))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        yield builder.compile(checkpointer=saver)


async def test_four_rooms_refusals_reach_the_model_and_the_approval_resumes_once(
    tmp_path: Path,
) -> None:
    hotel = Hotel()
    seen: list[list[str]] = []
    config: RunnableConfig = {"configurable": {"thread_id": "conv-42"}}
    async with booking_kernel(tmp_path / "j.db", hotel) as gate:
        async with booker(gate, tmp_path / "graph.db", SCRIPT, seen) as graph:
            out = await graph.ainvoke({"messages": [("user", "book four rooms")]}, config)
            [pause] = out["__interrupt__"]
            assert pause.value["tool_call_id"] == "call_4"
            assert pause.value["reason_code"] == "APPROVAL_REQUIRED"
            said = seen[-1]
            assert said[0].startswith("EXECUTED")
            assert said[1].startswith("REFUSED RISK_LIMIT_EXCEEDED: total 450000 cents")
            assert said[2].startswith("REFUSED CONSTRAINT_VIOLATION")
            command, waiting = await settle(gate, graph, config)
            assert command is None and [d.verdict.value for d in waiting] == ["ESCALATED"]
            paused_at = (await graph.aget_state(config)).config

        await approve_all(gate.kernel)
        # A new graph on the same file, as another process would build it.
        async with booker(gate, tmp_path / "graph.db", SCRIPT, seen) as graph:
            command, waiting = await settle(gate, graph, config)
            assert command is not None and waiting == []
            out = await graph.ainvoke(command, config)
            assert out["messages"][-1].content == "done"
            assert seen[-1][3].startswith("EXECUTED")
            # Resumed again from the paused checkpoint (a fork): still one booking.
            again = await graph.ainvoke(command, paused_at)
            assert again["messages"][-1].content == "done"
        assert [c.params["nightly_rate_cents"] for c in hotel.calls] == [10_000, 50_000]


async def test_a_looping_agent_stops_when_the_governor_trips(tmp_path: Path) -> None:
    seen: list[list[str]] = []
    config: RunnableConfig = {"configurable": {"thread_id": "loop"}, "recursion_limit": 60}
    async with booking_kernel(tmp_path / "j.db", Hotel(), max_attempts=3) as gate:
        async with booker(gate, tmp_path / "graph.db", [OVER_LIMIT] * 25, seen) as graph:
            out = await graph.ainvoke({"messages": [("user", "book")]}, config)
            stopped = stop_of(out["__interrupt__"])
            assert stopped is not None and stopped["stopped"] == "REASONING_EXHAUSTION"
            assert len(seen) == 3  # the model was asked three times, and not after the stop
            assert await settle(gate, graph, config) == (None, [])
            # Resumed anyway: the gate answers the stop, the thread pauses on it again.
            again = await graph.ainvoke(Command(resume="go on"), config)
            assert stop_of(again["__interrupt__"]) == stopped
            assert len(seen) == 3
        assert await proposals(gate.kernel) == 3


async def test_a_suspended_agents_run_stops_on_its_first_call(tmp_path: Path) -> None:
    seen: list[list[str]] = []
    config: RunnableConfig = {"configurable": {"thread_id": "s"}}
    async with booking_kernel(tmp_path / "j.db", Hotel()) as gate:
        await suspend(gate.kernel)
        async with booker(gate, tmp_path / "graph.db", [OVER_LIMIT] * 5, seen) as graph:
            out = await graph.ainvoke({"messages": [("user", "book")]}, config)
        stopped = stop_of(out["__interrupt__"])
        assert stopped is not None and stopped["stopped"] == "AGENT_SUSPENDED"
        assert len(seen) == 1


async def test_the_threads_tokens_are_charged_to_the_flow_of_each_call(tmp_path: Path) -> None:
    seen: list[list[str]] = []
    config: RunnableConfig = {"configurable": {"thread_id": "usage"}}
    async with booking_kernel(tmp_path / "j.db", Hotel()) as gate:
        two = [SCRIPT[0], SCRIPT[3]]
        async with booker(gate, tmp_path / "graph.db", two, seen, usage=True) as graph:
            await graph.ainvoke({"messages": [("user", "book two rooms")]}, config)
        assert await charged(gate.kernel) == [{"chat-test": 120}, {"chat-test": 120}]
