"""PydanticAI under the kernel: each tool call is proposed, judged, executed once.

Three lines on the app's side::

    toolset = governed_toolset(Gate(kernel, "booker", BOOKING))
    agent = Agent(model, toolsets=[toolset], output_type=[str, DeferredToolRequests])
    result = await agent.run(prompt, conversation_id="conv-42")

How PydanticAI's deferred tools carry the kernel's answer
(shared/notes/framework-hitl-apis.md):

- Each tool proposes the call (``Kernel.propose``, keyed by ``ctx.conversation_id``
  and ``ctx.tool_call_id``). An executed receipt, or a refusal with its reason code,
  is returned as the tool's output (never ``ModelRetry``: that spends the tool's
  retry budget and ends the run after a second refusal).
- ESCALATED raises ``ApprovalRequired`` with the flow's DFID in its metadata: the
  run ends with ``DeferredToolRequests``; save ``result.conversation`` with
  ``ConversationTypeAdapter``.
- When an operator decided (console, ``dirk decide``, MCP), :func:`settle` builds
  the ``DeferredToolResults`` that approve what the kernel settled; resume with
  ``agent.run(conversation=conv, deferred_tool_results=results)``. The approved
  re-call is answered from the record: the receipt, or the operator's refusal.
  Resuming the same saved conversation twice books once.
- A refusal that ends the run, not the call (:data:`kernel.frameworks.STOPS`: the
  conversation's retry governor tripped, the agent was demoted or suspended, a
  budget is spent) raises :class:`RunStopped`, a PydanticAI ``AgentRunError`` (as
  ``UsageLimitExceeded`` is): ``agent.run`` raises it with the kernel's Decision,
  and no later call of the run reaches the kernel.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import (
    ApprovalRequired,
    Conversation,
    DeferredToolResults,
    FunctionToolset,
    RunContext,
    Tool,
    ToolApproved,
)
from pydantic_ai.exceptions import AgentRunError

from kernel.api.decisions import Decision, DecisionVerdict
from kernel.core.reasons import ReasonCode
from kernel.frameworks._tools import Gate, ToolSpec, stops

__all__ = ["RunStopped", "governed_toolset", "settle"]


class RunStopped(AgentRunError):
    """The kernel ended the run: its ``decision`` says why (``reason_code``, ``detail``).

    A PydanticAI ``AgentRunError``, so an app that already handles a run's errors
    (``UsageLimitExceeded``) handles this one there too.
    """

    def __init__(self, decision: Decision) -> None:
        super().__init__(decision.message())
        self.decision = decision
        self.reason_code: ReasonCode | None = decision.reason_code


def governed_toolset(gate: Gate, *, wait: float = 0.0) -> FunctionToolset[Any]:
    """Return a toolset with one tool per kind of ``gate``, governed by the kernel.

    Args:
        gate: the agent's gate to the kernel.
        wait: seconds an approved re-call waits for the kernel to settle (0: answer at once).
    """
    return FunctionToolset([_tool(gate, spec, wait) for spec in gate.tools])


def _tool(gate: Gate, spec: ToolSpec, wait: float) -> Tool[Any]:
    async def run(ctx: RunContext[Any], **params: Any) -> str:
        decision = await gate.call(
            spec.name,
            params,
            conversation=ctx.conversation_id,
            tool_call_id=ctx.tool_call_id,
            spent=(getattr(ctx.model, "model_name", ""), ctx.usage.total_tokens),
        )
        if not decision.settled and ctx.tool_call_approved and decision.dfid:
            # Approved in the app, still open in the kernel: the kernel's word decides.
            decision = await gate.kernel.await_decision(decision.dfid, wait)
        if stops(decision):
            raise RunStopped(decision)
        if decision.verdict is DecisionVerdict.ESCALATED and not ctx.tool_call_approved:
            raise ApprovalRequired(
                metadata={"dfid": decision.dfid, "reason_code": str(decision.reason_code)}
            )
        return decision.message()

    return Tool.from_schema(run, spec.name, spec.description, spec.parameters, takes_ctx=True)


async def settle(
    gate: Gate, conversation: Conversation
) -> tuple[DeferredToolResults | None, list[Decision]]:
    """Approve every pending call of ``conversation`` that the kernel settled.

    Returns:
        The results to resume with (None until the kernel settled every pending
        call), and the decisions still ESCALATED or PENDING.
    """
    pending = conversation.deferred_tool_requests
    if pending is None:
        return None, []
    approvals: dict[str, ToolApproved] = {}
    waiting: list[Decision] = []
    for part in pending.approvals:
        decision = await gate.call(
            part.tool_name,
            part.args_as_dict(),
            conversation=conversation.conversation_id,
            tool_call_id=part.tool_call_id,
        )
        if decision.settled:
            approvals[part.tool_call_id] = ToolApproved()
        else:
            waiting.append(decision)
    if waiting:  # a resume must answer every pending call: wait for the last one
        return None, waiting
    metadata = {i: m for i, m in pending.metadata.items() if i in approvals}
    return pending.build_results(approvals=approvals, metadata=metadata), waiting
