"""Approvals as MCP tasks: the tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663).

On protocol revision 2026-07-28, a client that declares the extension in its request's
capabilities gets an escalated proposal back as a **task** (``resultType: "task"``)
instead of an ESCALATED answer: the task's id is the flow's DFID, and the task is the
flow. ``tasks/get`` reads the flow from the journal, so any process that can reach the
server (another client, a restarted one) polls it, and the server may have restarted in
between: while a human decides the task is ``working`` (its ``statusMessage`` says why
the call waits); once the flow ends (approved and executed once by the kernel, rejected,
expired) it is ``completed`` with the tool's own answer as its ``result``, the very
answer ``wait_flow`` gives. Only the flow's own agent reads it (another agent's flow,
or another tenant's, is an unknown task: -32602, and another tenant's attempt is recorded).
``tasks/update`` is acknowledged, as the extension asks (a dirk task asks for no input).
``tasks/cancel`` withdraws the request while it waits for a human: beside a kernel
(``dirk mcp`` embedded, the gateway) the kernel aborts the flow for its own agent
(``Kernel.withdraw``: FlowAborted, AGENT_DECLINED, "withdrawn by <agent>: ..."), so an
approval given later is refused (FLOW_NOT_ACTIVE) and nothing executes; the task is
then ``cancelled``, for ``tasks/get`` too. A task a human already decided is not
cancelled (-32602, FLOW_NOT_ACTIVE). A server that follows a journal whose kernel runs
elsewhere has no such door (the inbox carries no agent withdrawal): it acknowledges the
cancel and the task goes on as a human decides it.

A client without the extension, or on an older revision (the conformance suite's and
the Inspector's), gets the ESCALATED answer and follows it with ``wait_flow`` as before.

For clients, :class:`TaskClient` is the extension's client half for ``mcp.Client``
(``Client(..., extensions=[TaskClient()])``): ``call_tool`` then waits for an escalated
call's task to complete and returns its result; :func:`get_task` reads one task by id.
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Literal

import anyio
import msgspec
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
from mcp_types import INVALID_PARAMS, CallToolRequestParams, CallToolResult, RequestParams, Result
from mcp_types import Request as McpRequest
from mcp_types.jsonrpc import HEADER_MISMATCH
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from kernel.api import Kernel
from kernel.audit.units import readable
from kernel.core.flow import FlowState, FlowStatus
from kernel.core.reasons import CliError, ReasonCode
from kernel.mcp._backend import Backend, Principal, ToolRefused, settled
from kernel.mcp._tenancy import check_flow
from kernel.mcp._tools import Answer, reply
from kernel.policy.contracts import Outcome

TASKS = "io.modelcontextprotocol/tasks"
"""The extension's identifier."""
POLL_MS = 2000
"""The polling interval a task suggests: a human's decision takes seconds at least."""


class TaskParams(RequestParams):
    """What ``tasks/get``, ``tasks/update`` and ``tasks/cancel`` name: the task."""

    task_id: str = Field(alias="taskId")
    request_state: str | None = Field(default=None, alias="requestState")


class UpdateParams(TaskParams):
    """``tasks/update``: responses to input requests (a dirk task asks for none)."""

    input_responses: dict[str, Any] = Field(default_factory=dict, alias="inputResponses")


Reader = Callable[[Principal, str], Awaitable[tuple[FlowState, CallToolResult | None]]]
"""Reads a task's flow for a caller: the flow, and the tool's answer once it ended."""
Canceller = Callable[[Principal, str], Awaitable[FlowState]]
"""Withdraws a task's flow for its agent (already read as the caller's); the flow after it.

Raises ToolRefused (FLOW_NOT_ACTIVE) when no human is waited for any more."""
WITHDRAWN = "withdrawn by "
"""How the detail of a flow its agent withdrew begins (kernel.api.facade.Kernel.withdraw)."""


class Tasks(Extension):
    """The server half: escalated tool calls become tasks; ``tasks/*`` read their flows.

    Args:
        read: reads a task's flow for a caller, and the tool's answer once it ended
            (:func:`flow_reader` for dirk's tools; the gateway reads its kernel's).
        who: the caller of a request (its Context's principal).
        cancel: withdraws a task's flow (:func:`flow_canceller`); None: ``tasks/cancel``
            is acknowledged and changes nothing.
        currency: the currency whose minor units a status message's reasons quote, shown
            in major units (kernel.audit.units.readable); ``none``: as recorded.
    """

    identifier = TASKS

    def __init__(
        self,
        read: Reader,
        who: Callable[[Any], Principal],
        cancel: Canceller | None = None,
        currency: str = "none",
    ) -> None:
        self.read = read
        self.who = who
        self.cancel = cancel
        self.currency = currency

    def _words(self, text: str) -> str:
        """A reason as a status message says it: amounts in major units, durations spoken."""
        return readable(text, self.currency)

    def methods(self) -> Sequence[MethodBinding]:
        versions = frozenset(MODERN_PROTOCOL_VERSIONS)
        return (
            MethodBinding("tasks/get", TaskParams, self._get, versions),
            MethodBinding("tasks/update", UpdateParams, self._ack, versions),
            MethodBinding("tasks/cancel", TaskParams, self._cancel, versions),
        )

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        """Answer an escalated call as a task, where the client declared the extension."""
        result = await call_next(ctx)
        if not isinstance(result, CallToolResult) or not _declared(ctx):
            return result
        body = result.structured_content or {}
        if body.get("verdict") != "ESCALATED" or not body.get("dfid"):
            return result
        try:
            flow, _ = await self.read(self.who(ctx), str(body["dfid"]))
        except ToolRefused:
            return result  # not readable as a task by this caller: the answer as it is
        return {"resultType": "task", **_task(flow, self._words(str(body.get("detail", ""))))}

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        _check_name(ctx, params)
        try:
            who = self.who(ctx)
            flow, answer = await self.read(who, params.task_id)
        except ToolRefused as exc:
            raise _refused(exc) from None
        task = _task(flow, self._words(flow.detail))
        if _withdrawn(flow):
            return {**task, "status": "cancelled", "statusMessage": self._words(flow.detail)}
        if answer is not None:
            task["status"] = "completed"
            task["statusMessage"] = str((answer.structured_content or {}).get("verdict", ""))
            task["result"] = answer.model_dump(by_alias=True, mode="json", exclude_none=True)
        return task

    async def _ack(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        """``tasks/update``: acknowledged (a dirk task asks for no input)."""
        _check_name(ctx, params)
        return {}

    async def _cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskParams
    ) -> HandlerResult:
        """``tasks/cancel``: withdraw the flow while a human is still to decide it."""
        _check_name(ctx, params)
        try:
            who = self.who(ctx)
            flow, _ = await self.read(who, params.task_id)  # only its own agent's task
            if self.cancel is None:
                # No door to withdraw through: the task as it is.
                return _task(flow, self._words(flow.detail))
            flow = await self.cancel(who, params.task_id)
        except ToolRefused as exc:
            raise _refused(exc) from None
        why = self._words(flow.detail)
        return {**_task(flow, why), "status": "cancelled", "statusMessage": why}


def _refused(exc: ToolRefused) -> MCPError:
    """A task refused: unknown (another agent's or tenant's reads the same), or not waiting."""
    return MCPError(INVALID_PARAMS, exc.detail, {"reason_code": str(exc.code), "field": "taskId"})


def _withdrawn(flow: FlowState) -> bool:
    """Whether the flow ended because its agent withdrew it (a cancelled task)."""
    return (
        flow.status is FlowStatus.ABORTED
        and flow.reason_code is ReasonCode.AGENT_DECLINED
        and flow.detail.startswith(WITHDRAWN)
    )


def kernel_canceller(kernel: Kernel) -> Canceller:
    """Withdraw tasks through ``kernel`` (in this process): ``Kernel.withdraw``."""

    async def cancel(who: Principal, dfid: str) -> FlowState:
        verdict = await kernel.withdraw(dfid, agent_id=who.name, reason="MCP task cancelled")
        if verdict.outcome is not Outcome.ABORTED:
            why = verdict.feedback.detail if verdict.feedback is not None else "not waiting"
            raise ToolRefused(ReasonCode.FLOW_NOT_ACTIVE, why, "taskId")
        flow = await kernel.wait_flow(dfid)
        return flow

    return cancel


def _check_name(ctx: ServerRequestContext[Any, Any], params: TaskParams) -> None:
    """Over HTTP, a ``tasks/*`` request's ``Mcp-Name`` header is its task id (SEP-2663).

    What routes the request to the server holding the task must name the task the body
    names: a request without it, or naming another, is refused (-32020, header mismatch).
    """
    request = ctx.request
    headers = getattr(request, "headers", None)
    if headers is None:
        return  # stdio, in process: no header to carry it
    if decode_header_value(headers.get(MCP_NAME_HEADER)) != params.task_id:
        raise MCPError(
            HEADER_MISMATCH,
            f"{MCP_NAME_HEADER} header does not match the request body's 'taskId' parameter",
            {"reason_code": "SCHEMA_INVALID", "field": "taskId"},
        )


def unknown_task(dfid: str) -> ToolRefused:
    """The refusal of a task a caller may not read (the same whether it exists or not)."""
    return ToolRefused(CliError.UNKNOWN_FLOW, f"no task {dfid[:64]!r}", "taskId")


def flow_reader(backend: Backend, currency: str = "none") -> Reader:
    """Read tasks from ``backend``: the flow, and once it ended the answer ``wait_flow`` gives
    (its summary's amounts in ``currency``)."""

    async def read(who: Principal, dfid: str) -> tuple[FlowState, CallToolResult | None]:
        if not dfid or len(dfid) > 256:
            raise unknown_task(dfid)
        async with backend.reading() as view:
            flow = view.projections.flows.get(dfid)
            if flow is None or (who.role == "agent" and flow.agent_id != who.name):
                raise unknown_task(dfid)
            await check_flow(backend, view, who, "tasks_get", dfid)
            if not flow.terminal:
                return flow, None
            events = await view.journal.read(dfid=dfid)
        return flow, reply(Answer(**msgspec.to_builtins(settled(flow, events))), currency)

    return read


def _declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request may be answered with a task: 2026-07-28, extension declared."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    return bool(capabilities and capabilities.extensions and TASKS in capabilities.extensions)


def _task(flow: FlowState, why: str) -> dict[str, Any]:
    """The task a flow is (working while it is open), times from the flow's events."""
    return {
        "taskId": flow.dfid,
        "status": "working",
        "statusMessage": f"waiting for a human decision: {why}" if why else "waiting",
        "createdAt": _iso(flow.created_ts),
        "lastUpdatedAt": _iso(flow.updated_ts),
        "ttlSeconds": None,
        "pollIntervalMilliseconds": POLL_MS,
    }


def _iso(ts_ns: int) -> str:
    at = datetime.datetime.fromtimestamp(ts_ns / 1e9, tz=datetime.UTC)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --- the client half -----------------------------------------------------------------


class TaskHandle(Result):
    """A task as ``tools/call`` answers it (``resultType: "task"``)."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_milliseconds: int | None = None


class TaskState(Result):
    """A task as ``tasks/get`` answers it: its status, and its result once completed."""

    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_milliseconds: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class GetTask(McpRequest[TaskParams, Literal["tasks/get"]]):
    """The ``tasks/get`` request (its ``Mcp-Name`` header is the task's id)."""

    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param: ClassVar[str | None] = "taskId"


class CancelTask(McpRequest[TaskParams, Literal["tasks/cancel"]]):
    """The ``tasks/cancel`` request (its ``Mcp-Name`` header is the task's id)."""

    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams
    name_param: ClassVar[str | None] = "taskId"


async def cancel_task(session: Any, task_id: str) -> TaskState:
    """Cancel task ``task_id``: its request is withdrawn while a human is still to decide it.

    Raises:
        MCPError: -32602: an unknown task, or one a human already decided (FLOW_NOT_ACTIVE).
    """
    request = CancelTask(params=TaskParams(taskId=task_id))
    state: TaskState = await session.send_request(request, TaskState)
    return state


async def get_task(session: Any, task_id: str) -> TaskState:
    """Read task ``task_id`` once (``session``: an ``mcp.Client``'s ``session``)."""
    request = GetTask(params=TaskParams(taskId=task_id))
    state: TaskState = await session.send_request(request, TaskState)
    return state


async def await_task(session: Any, task_id: str, poll_s: float | None = None) -> CallToolResult:
    """Poll task ``task_id`` until it completes; return the tool's result.

    Raises:
        MCPError: the task failed, or was cancelled.
    """
    while True:
        state = await get_task(session, task_id)
        if state.status == "completed" and state.result is not None:
            return CallToolResult.model_validate(state.result)
        if state.status in ("failed", "cancelled"):
            raise MCPError(INVALID_PARAMS, f"task {task_id} {state.status}", state.error)
        interval = poll_s if poll_s is not None else (state.poll_interval_milliseconds or 1000)
        await anyio.sleep(interval if poll_s is not None else interval / 1000)


class TaskClient(ClientExtension):
    """The client half: an escalated call's task is awaited, its result returned.

    Args:
        poll_s: how often to poll (default: the interval the task suggests).
    """

    identifier = TASKS

    def __init__(self, poll_s: float | None = None) -> None:
        self.poll_s = poll_s

    def claims(self) -> Sequence[ResultClaim[Any]]:
        async def resolve(handle: TaskHandle, ctx: ClaimContext) -> CallToolResult:
            return await await_task(ctx.session, handle.task_id, self.poll_s)

        return (ResultClaim(result_type="task", model=TaskHandle, resolve=resolve),)
