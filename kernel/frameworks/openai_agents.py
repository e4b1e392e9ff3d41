"""The OpenAI Agents SDK under the kernel: each tool call is proposed, judged, executed once.

Three lines on the app's side::

    tools = governed_tools(Gate(kernel, "booker", BOOKING))
    agent = Agent(name="booker", tools=tools, model=...)
    result = await Runner.run(agent, prompt, context={"conversation": "conv-42"})

How the SDK's hooks carry the kernel's answer (shared/notes/framework-hitl-apis.md):

- ``needs_approval`` proposes the call (``Kernel.propose``, keyed by the
  conversation and the call id) and asks for approval when it was ESCALATED: the
  run ends with ``result.interruptions``; save ``result.to_state().to_string()``.
- The tool's body proposes again and is answered from the record: the executed
  receipt, or the refusal with its reason code, becomes the tool's output. The
  body never carries the action out: the kernel's executor did, once.
- When an operator decided (console, ``dirk decide``, MCP), :func:`settle`
  approves in the loaded ``RunState`` each interruption the kernel settled, and
  ``Runner.run(agent, state)`` resumes. An operator's rejection reaches the model
  as the refusal. Resuming the same saved state twice is answered from the record.
- A refusal that ends the run, not the call (:data:`kernel.frameworks.STOPS`: the
  conversation's retry governor tripped, the agent was demoted or suspended, a
  budget is spent) trips the tool's input guardrail: ``Runner.run`` raises the
  SDK's ``ToolInputGuardrailTripwireTriggered``, whose ``output.output_info`` is
  the kernel's :class:`~kernel.api.decisions.Decision` (:func:`stop_of` reads it),
  and no later call of the run reaches the kernel.

The conversation is the run context's ``"conversation"`` (a dict context, or an
object with that attribute): ``needs_approval`` sees nothing else that names the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from agents import FunctionTool, RunState, ToolGuardrailFunctionOutput, ToolInputGuardrail
from agents.exceptions import ToolInputGuardrailTripwireTriggered
from agents.run_context import RunContextWrapper
from agents.tool_context import ToolContext
from agents.tool_guardrails import ToolInputGuardrailData

from kernel.api.decisions import Decision, DecisionVerdict
from kernel.frameworks._tools import Gate, ToolSpec

__all__ = ["conversation_of", "governed_tools", "settle", "stop_of"]


def conversation_of(context: object) -> str | None:
    """Return the conversation a run context names (``{"conversation": ...}``), or None."""
    found = context.get("conversation") if isinstance(context, Mapping) else None
    found = found if found is not None else getattr(context, "conversation", None)
    return found if isinstance(found, str) else None


def stop_of(error: ToolInputGuardrailTripwireTriggered) -> Decision | None:
    """Return the kernel's refusal that stopped a run (its ``reason_code``), or None."""
    info = error.output.output_info
    return info if isinstance(info, Decision) else None


def governed_tools(gate: Gate, *, wait: float = 0.0) -> list[FunctionTool]:
    """Return one SDK ``FunctionTool`` per kind of ``gate``, governed by the kernel.

    Args:
        gate: the agent's gate to the kernel.
        wait: seconds the body waits for an execution still PENDING (0: answer at once).
    """
    return [_tool(gate, spec, wait) for spec in gate.tools]


def _tool(gate: Gate, spec: ToolSpec, wait: float) -> FunctionTool:
    async def needs_approval(
        ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str
    ) -> bool:
        decision = await gate.call(
            spec.name,
            params,
            conversation=conversation_of(ctx.context),
            tool_call_id=call_id,
            spent=("", ctx.usage.total_tokens),  # the SDK names no model here: Gate.model
        )
        return decision.verdict is DecisionVerdict.ESCALATED

    async def invoke(ctx: ToolContext[Any], arguments: str) -> str:
        try:
            params: Any = msgspec.json.decode(arguments)
        except msgspec.DecodeError:
            params = arguments  # not JSON: the kernel refuses it, on record (SCHEMA_INVALID)
        decision = await gate.call(
            spec.name,
            params,
            conversation=conversation_of(ctx.context),
            tool_call_id=ctx.tool_call_id,
            spent=("", ctx.usage.total_tokens),
        )
        if decision.verdict is DecisionVerdict.PENDING and decision.dfid:
            decision = await gate.kernel.await_decision(decision.dfid, wait)
        return decision.message()

    def stop(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        # needs_approval proposed this call just before: a stop it met ends the run here.
        stopped = gate.stop_of(conversation_of(data.context.context))
        if stopped is None:
            return ToolGuardrailFunctionOutput.allow()
        return ToolGuardrailFunctionOutput.raise_exception(output_info=stopped)

    return FunctionTool(
        name=spec.name,
        description=spec.description,
        params_json_schema=spec.parameters,
        on_invoke_tool=invoke,
        # Strict mode would rewrite the schema (every field required, defaults gone);
        # the kernel validates the arguments itself and names what is wrong.
        strict_json_schema=False,
        needs_approval=needs_approval,
        tool_input_guardrails=[ToolInputGuardrail(stop, name="dirk stop")],
    )


async def settle(gate: Gate, state: RunState[Any], conversation: str | None) -> list[Decision]:
    """Approve in ``state`` every interruption the kernel has settled; return those still open.

    An interruption is approved in the SDK once the kernel's decision is final,
    whatever it is: the tool's body then reads that decision (an executed receipt,
    or the operator's refusal) and the model sees it. Never ``always_approve``: that
    would switch the SDK's approval hook off for the rest of the run.

    Returns:
        The decisions still ESCALATED or PENDING: resume only when this is empty.
    """
    waiting: list[Decision] = []
    for item in state.get_interruptions():
        raw = item.arguments
        try:
            params: Any = msgspec.json.decode(raw) if isinstance(raw, str | bytes) else raw
        except msgspec.DecodeError:
            params = raw
        decision = await gate.call(
            item.tool_name or "", params, conversation=conversation, tool_call_id=item.call_id
        )
        if decision.settled:
            state.approve(item)
        else:
            waiting.append(decision)
    return waiting
