"""LangGraph, governed: a scripted chat model books four rooms, paused and resumed via SQLite.

    python -m examples.frameworks.langgraph [--db trip.db]

The dirk side is three lines (marked ``# dirk``); the rest is LangGraph's own graph.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import tools_condition

from examples.frameworks._scene import CONVERSATION, TOOL, main_of, next_call, operator_approves
from kernel.frameworks import Gate
from kernel.frameworks.langgraph import governed_tool_node, settle


class ScriptedChat(GenericFakeChatModel):
    """langchain-core's fake chat model, made stateless: each reply comes from the history."""

    def _generate(self, messages: list[BaseMessage], *args: Any, **kw: Any) -> ChatResult:
        nxt = next_call([str(m.content) for m in messages if isinstance(m, ToolMessage)])
        reply = AIMessage("four rooms handled")
        if nxt is not None:
            reply = AIMessage("", tool_calls=[{"name": TOOL, "args": nxt[1], "id": nxt[0]}])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def graph_of(gate: Gate, saver: AsyncSqliteSaver) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The app's graph: the model, then the governed tools, until the model is done."""
    model = ScriptedChat(messages=iter(()))

    async def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", governed_tool_node(gate))  # dirk
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


async def play(gate: Gate, workdir: Path) -> list[str]:
    """Run until the interrupt, let the operator decide, resume from the SQLite checkpoint."""
    config: RunnableConfig = {"configurable": {"thread_id": CONVERSATION}}
    checkpoints = str(workdir / "graph.db")
    async with AsyncSqliteSaver.from_conn_string(checkpoints) as saver:
        out = await graph_of(gate, saver).ainvoke({"messages": [("user", "book")]}, config)
        print("paused on:", [i.value["tool_call_id"] for i in out["__interrupt__"]])

    await operator_approves(gate.kernel)  # on the console, with `dirk decide`, or MCP

    async with AsyncSqliteSaver.from_conn_string(checkpoints) as saver:  # as a new process
        graph = graph_of(gate, saver)
        command, _waiting = await settle(gate, graph, config)  # dirk: once the kernel settled
        out = await graph.ainvoke(command, config)
    print("model:", out["messages"][-1].content)
    return [str(m.content) for m in out["messages"] if isinstance(m, ToolMessage)]


def main(argv: list[str] | None = None) -> int:
    """Run the example."""
    return main_of("langgraph", play, argv)


if __name__ == "__main__":
    sys.exit(main())
