"""LangGraph under the kernel: each tool call is proposed, judged, executed once.

A few lines on the app's side (the graph is the app's; a durable checkpointer is
what lets a paused thread resume, from another process too)::

    gate = Gate(kernel, "booker", BOOKING)
    model = chat_model.bind_tools(governed_tools(gate))
    graph.add_node("tools", governed_tool_node(gate))
    ...compile(checkpointer=AsyncSqliteSaver(...))
    await graph.ainvoke(inputs, {"configurable": {"thread_id": "conv-42"}})

How LangGraph's interrupts carry the kernel's answer
(shared/notes/framework-hitl-apis.md):

- The ``ToolNode``'s wrapper proposes each call (``Kernel.propose``, keyed by the
  ``thread_id`` and the call's id) and answers with a ``ToolMessage``: the executed
  receipt, or the refusal with its reason code (``status="error"``). It never calls
  the tool: the kernel's executor carried the action out, once.
- ESCALATED calls ``interrupt()`` with plain JSON (the DFID, the reason): the run
  ends with ``__interrupt__``. LangGraph re-runs the node from its top on resume,
  so the proposal before ``interrupt()`` is answered from the record, not made again.
- When an operator decided (console, ``dirk decide``, MCP), :func:`settle` returns
  the ``Command(resume=...)`` for the thread; the resumed wrapper reads the kernel's
  decision (the operator's refusal included). Resuming twice books once.
- A refusal that ends the run, not the call (:data:`kernel.frameworks.STOPS`: the
  thread's retry governor tripped, the agent was demoted or suspended, a budget is
  spent) calls ``interrupt()`` with ``{"stopped": <reason code>, ...}``: the run
  ends with ``__interrupt__`` (:func:`stop_of` reads it), no later call of the run
  reaches the kernel, and :func:`settle` never resumes it. A thread resumed anyway
  proposes the call again and pauses again while the stop holds.

Limits: a plain ``ToolNode`` runs all calls of one model turn as one task, and
LangGraph matches several resume values by their order inside it; give each call
its own task (``create_agent``, ``Send``) or let the model make one call a turn.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.pregel import Pregel
from langgraph.types import Command, Interrupt, interrupt

from kernel.api.decisions import Decision, DecisionVerdict
from kernel.frameworks._tools import Gate, ToolSpec, stops

__all__ = ["governed_tool_node", "governed_tools", "settle", "stop_of"]


def stop_of(interrupts: Iterable[Interrupt]) -> Mapping[str, Any] | None:
    """Return the stop a run ended on (``out["__interrupt__"]``, a snapshot's ``interrupts``).

    Returns:
        The pause's value: ``stopped`` (the reason code), ``detail``, ``dfid``,
        ``tool_call_id``; None when the run paused for a human, not for a stop.
    """
    for pause in interrupts:
        if isinstance(pause.value, dict) and pause.value.get("stopped"):
            return pause.value
    return None


def _paused(decision: Decision, call_id: str | None) -> dict[str, Any]:
    """The JSON an interrupt carries for ``decision``: what a human or the app reads."""
    said: dict[str, Any] = {
        "dfid": decision.dfid,
        "tool_call_id": call_id,
        "reason_code": str(decision.reason_code),
        "detail": decision.detail,
    }
    if stops(decision):
        said["stopped"] = str(decision.reason_code)
    return said


def governed_tools(gate: Gate) -> list[BaseTool]:
    """Return one LangChain tool per kind of ``gate``: what ``bind_tools`` shows the model.

    Called outside :func:`governed_tool_node`, a tool still goes to the kernel, but
    with no call id and no pause: an escalated call answers that it waits.
    """
    return [_tool(gate, spec) for spec in gate.tools]


def _tool(gate: Gate, spec: ToolSpec) -> BaseTool:
    async def run(**params: Any) -> str:
        decision = await gate.call(spec.name, params, conversation=None, tool_call_id=None)
        return decision.message()

    return StructuredTool.from_function(
        coroutine=run, name=spec.name, description=spec.description, args_schema=spec.parameters
    )


def spent_in(state: Any) -> tuple[str, int] | None:
    """The thread's tokens so far: its AI messages' ``usage_metadata``, and the latest model.

    None when no message reports usage (a model that reports none is charged nothing).
    """
    messages = state.get("messages") if isinstance(state, Mapping) else None
    total, model, seen = 0, "", False
    for message in messages if isinstance(messages, list) else ():
        usage = getattr(message, "usage_metadata", None)
        if isinstance(usage, Mapping) and isinstance(usage.get("total_tokens"), int):
            total += usage["total_tokens"]
            seen = True
            named = (getattr(message, "response_metadata", None) or {}).get("model_name")
            model = named if isinstance(named, str) else model
    return (model, total) if seen else None


def governed_tool_node(gate: Gate, *, name: str = "tools") -> ToolNode:
    """Return a ``ToolNode`` whose calls the kernel judges (use with ``ainvoke``)."""

    async def wrap(
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage:
        call = request.tool_call
        info = request.runtime.execution_info if request.runtime else None
        thread = info.thread_id if info else None
        decision = await gate.call(
            call["name"],
            call["args"],
            conversation=thread,
            tool_call_id=call["id"],
            spent=spent_in(request.state),
        )
        while stops(decision):
            # The run ends here; resumed anyway, the call is proposed again (the gate
            # answers a stop it saw) and, while the stop holds, pauses again.
            interrupt(_paused(decision, call["id"]))
            decision = await gate.call(
                call["name"], call["args"], conversation=thread, tool_call_id=call["id"]
            )
        if decision.verdict is DecisionVerdict.ESCALATED:
            # Raises the first time; on resume the node re-runs, the proposal above is
            # answered from the record, and the kernel's decision is read again below.
            interrupt(_paused(decision, call["id"]))
            decision = await gate.call(
                call["name"], call["args"], conversation=thread, tool_call_id=call["id"]
            )
        failed = decision.verdict in (DecisionVerdict.REFUSED, DecisionVerdict.FAILED)
        return ToolMessage(
            decision.message(),
            tool_call_id=call["id"] or "",
            name=call["name"],
            status="error" if failed else "success",
        )

    return ToolNode(governed_tools(gate), name=name, awrap_tool_call=wrap)


async def settle(
    gate: Gate, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig
) -> tuple[Command[Any] | None, list[Decision]]:
    """Return the command that resumes ``config``'s thread once the kernel settled its pauses.

    Returns:
        ``Command(resume=...)`` (None until every pending call is settled, and for a
        thread the kernel stopped: :func:`stop_of`), and the decisions still
        ESCALATED or PENDING.
    """
    snapshot = await graph.aget_state(config)
    answers: dict[str, str] = {}
    waiting: list[Decision] = []
    for pause in snapshot.interrupts:
        value = pause.value if isinstance(pause.value, dict) else {}
        if value.get("stopped"):
            continue  # a stop is not a human's to settle: the thread stays stopped
        decision = await gate.kernel.await_decision(str(value.get("dfid", "")), 0)
        if decision.settled:
            answers[pause.id] = decision.verdict.value
        else:
            waiting.append(decision)
    if waiting or not answers:
        return None, waiting
    return Command(resume=answers), waiting
