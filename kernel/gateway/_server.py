"""The governing MCP gateway: an MCP server whose tools are the upstreams' tools, governed.

Its clients see the tools the pack names (``<upstream>_<tool>``, the upstream's
description and schema, without the idempotency argument) and ``wait_flow``.
Each ``tools/call`` is one ``Kernel.propose``: the kind is the tool's, the agent
is the calling principal (authenticated as ``dirk mcp``'s clients are: the
``--agent`` of a stdio server, a bearer token over HTTP), the conversation is the
MCP connection and the tool-call id the JSON-RPC request id. So a call is judged,
recorded and carried out exactly once by the executor that calls the upstream,
and the same call again (the client retrying, or resuming) is answered from the
record. A client names its own conversation and call id with ``_meta``
(``dirk/conversation``, ``dirk/tool_call_id``): what a client that reconnects
uses to resume; over stateless HTTP, without them, each call stands alone.

The answer to an executed call is what the upstream answered (content and
structured content, as recorded), with ``_meta`` ``dirk/dfid`` and
``dirk/verdict``. Any other is one line the model can act on and a structured
``{verdict, dfid, reason_code, detail, field, limit}``: REFUSED and FAILED marked
``isError``; ESCALATED (a human decides first) not, with the DFID the client
follows with ``wait_flow``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Collection, Mapping
from contextlib import asynccontextmanager
from os import PathLike
from typing import Any

import anyio
import msgspec
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
)

from kernel.api import Kernel
from kernel.api.decisions import Decision, DecisionVerdict
from kernel.boot import open_kernel
from kernel.config import KernelConfig
from kernel.core.errors import KernelShutdown
from kernel.core.events import Manifest
from kernel.core.flow import FlowState
from kernel.core.reasons import CliError, ReasonCode
from kernel.core.wall import clip
from kernel.gateway._config import GatewayConfig, ToolPolicy
from kernel.gateway._pack import Route, ToolInfo, gateway_pack
from kernel.gateway._upstream import Upstream, UpstreamExecutor
from kernel.mcp import Embedded, Identity, Principal, ToolRefused
from kernel.mcp._offered import principal_scopes
from kernel.mcp._tasks import Tasks, kernel_canceller, unknown_task
from kernel.mcp._tenancy import check_flow
from kernel.policy import PolicyPack
from kernel.policy.contracts import HandshakeRefused
from kernel.registry import CONTRACT_VERSION

log = logging.getLogger(__name__)
_CONNECTION_KEY = "dirk/conversation"
"""Where a connection's conversation is named, in the state the SDK keeps for its run."""

CONVERSATION_META = "dirk/conversation"
"""The ``_meta`` key a client names its conversation with."""
CALL_META = "dirk/tool_call_id"
"""The ``_meta`` key a client names its tool call with."""
TRACEPARENT_META = "traceparent"
"""The ``_meta`` key a client's W3C trace context comes in: the flow links to that span."""
MAX_WAIT_S = 30
"""The longest ``wait_flow`` holds a call open."""

_WAIT_FLOW = Tool(
    name="wait_flow",
    description=(
        "Read the flow of an earlier call by its DFID (an ESCALATED call's answer names it);"
        " with timeout_s (0 to 30 seconds), first wait up to that long for a human's decision"
        " and the execution. Answers what the call answers once it is settled."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "dfid": {"type": "string", "description": "the flow's DFID"},
            "timeout_s": {"type": "integer", "description": "seconds to wait, 0 to 30"},
        },
        "required": ["dfid"],
        "additionalProperties": False,
    },
)


class Gateway:
    """A running gateway: its kernel, its MCP server, its pack and its routes.

    Attributes:
        kernel: the kernel the calls are proposed to.
        server: the MCP server to serve (stdio, streamable HTTP, or in process).
        pack: the pack made from the upstreams' tools and the configuration.
        routes: the governed tools by their name to clients.
        upstreams: the upstream connections by name.
        listed: what each upstream listed at start (``write_listing`` saves it).
    """

    def __init__(
        self,
        kernel: Kernel,
        server: GatewayServer,
        pack: PolicyPack,
        routes: dict[str, Route],
        upstreams: dict[str, Upstream],
        listed: dict[str, list[ToolInfo]],
    ) -> None:
        self.kernel = kernel
        self.server = server
        self.pack = pack
        self.routes = routes
        self.upstreams = upstreams
        self.listed = listed


@asynccontextmanager
async def open_gateway(
    config: GatewayConfig,
    db: str | PathLike[str],
    *,
    agents: Collection[str],
    identity: Identity | None = None,
    kernel_config: KernelConfig = KernelConfig(),
    server_options: Mapping[str, Any] | None = None,
) -> AsyncIterator[Gateway]:
    """Connect the upstreams, make the pack from their tools, open the kernel; yield the gateway.

    Args:
        config: the gateway's configuration.
        db: the journal.
        agents: the agent ids that may propose (the kernel's ``allow``).
        identity: who calls (``kernel.mcp.Identity``: a stdio principal or bearer tokens);
            by default the one agent of ``agents`` (stdio, in process).
        kernel_config: the kernel's configuration.
        server_options: the MCP server's own keywords: over HTTP with bearer tokens, the
            SDK's ``auth`` and ``token_verifier`` (``dirk mcp proxy`` passes what ``dirk mcp``
            does, so both answer an unknown caller the same way).

    Raises:
        UpstreamDown: an upstream cannot be reached, or its tools cannot be listed.
        PackFailure: a named tool that is not listed, or a schema the gateway cannot govern.
        PackError: the kernel refuses the pack (a bound naming no field of its tool).
    """
    who = identity
    if who is None:
        if len(agents) != 1:
            raise ValueError("say who calls: an identity, or exactly one agent")
        who = Identity(Principal(role="agent", name=next(iter(agents))))
    try:
        async with anyio.create_task_group() as tg:
            upstreams = {
                name: Upstream(name, spec, config.base, tg)
                for name, spec in config.upstreams.items()
            }
            try:
                listed = {name: await up.list_tools() for name, up in upstreams.items()}
                pack, routes = gateway_pack(config, listed)
                adapters: dict[str, Any] = {
                    f"mcp.{name}": UpstreamExecutor(
                        up, {r.name: r for r in routes.values() if r.upstream == name}
                    )
                    for name, up in upstreams.items()
                }
                async with open_kernel(
                    db, packs=[pack], adapters=adapters, allow=agents, config=kernel_config
                ) as kernel:
                    server = GatewayServer(kernel, config, routes, who, **(server_options or {}))
                    yield Gateway(kernel, server, pack, routes, upstreams, listed)
            finally:
                for up in upstreams.values():
                    up.drop()
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The connections' task group wraps what failed; the caller gets the failure itself.
        leaves = group.exceptions
        if len(leaves) == 1 and not isinstance(leaves[0], BaseExceptionGroup):
            raise leaves[0] from None
        raise


class GatewayServer(MCPServer[Any]):
    """The MCP server of the gateway: upstream tools, each call a proposal.

    Args:
        kernel: the running kernel (its pack is the gateway's).
        config: the gateway's configuration.
        routes: the governed tools by their name to clients.
        identity: who calls.
        options: the SDK server's own keywords (``auth``, ``token_verifier``).
    """

    def __init__(
        self,
        kernel: Kernel,
        config: GatewayConfig,
        routes: Mapping[str, Route],
        identity: Identity,
        **options: Any,
    ) -> None:
        super().__init__(
            "dirk-gateway",
            version="0.1.0",
            instructions=(
                "Tools of other MCP servers, governed: each call is judged by a policy first."
                " A REFUSED answer says why (reason_code, detail): revise and call again."
                " An ESCALATED one waits for a human: follow its dfid with wait_flow."
            ),
            log_level="WARNING",
            # An escalated call answered as a task (2026-07-28, for clients that declare it).
            extensions=[Tasks(self._task, self._task_caller, kernel_canceller(kernel))],
            **options,
        )
        self.kernel = kernel
        self.config = config
        self.routes = dict(routes)
        self.identity = identity
        self._sessions: set[str] = set()
        self._lock = anyio.Lock()

    # --- the protocol's two requests ------------------------------------------------

    async def _handle_list_tools(
        self, ctx: Any, params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        """``tools/list``: an agent sees the governed tools and wait_flow; others see none."""
        try:
            who = self._who(ctx)
        except ToolRefused:
            return ListToolsResult(tools=[])
        if who.role != "agent":
            return ListToolsResult(tools=[])
        # A user sees only the tools its scopes cover: the member scopes its tenant declares,
        # narrowed by those its token claims (kernel.mcp._offered). The DIM still judges
        # every call (a hidden tool called anyway is refused on record there).
        scopes = principal_scopes(self.kernel.projections, who)
        kinds = set(self._capabilities(who.name))
        tools = [
            Tool(name=r.name, description=r.description, input_schema=r.input_schema)
            for r in self.routes.values()
            if r.kind in kinds and (scopes is None or set(r.scopes) <= scopes)
        ]
        return ListToolsResult(tools=[*tools, _WAIT_FLOW])

    def _tool_input_schema(self, name: str) -> dict[str, Any] | None:
        route = self.routes.get(name)
        if route is not None:
            return route.input_schema
        return dict(_WAIT_FLOW.input_schema) if name == "wait_flow" else None

    async def _handle_call_tool(self, ctx: Any, params: CallToolRequestParams) -> CallToolResult:
        """``tools/call``: proposed through the kernel; every failure an answer with a code."""
        return await self.answer_call(ctx, params.name, params.arguments or {})

    async def answer_call(self, ctx: Any, name: Any, arguments: Any) -> CallToolResult:
        """Answer one ``tools/call`` as the SDK hands it over (``ctx``: its request context).

        Whatever ``name`` and ``arguments`` hold, the answer is a result with a reason
        code; nothing a caller sends raises here or stops the kernel.
        """
        params = _Call(name=name, arguments=arguments)
        try:
            who = self._who(ctx)
            if who.role != "agent":
                raise ToolRefused(
                    ReasonCode.UNAUTHORIZED, f"the gateway's tools are for agents, not {who.name}"
                )
            if not isinstance(params.name, str) or not isinstance(params.arguments, dict):
                raise ToolRefused(ReasonCode.SCHEMA_INVALID, "a tool's name and its arguments")
            if params.name == "wait_flow":
                return await self._wait_flow(who, params.arguments)
            return await self._call(who, ctx, params.name, params.arguments)
        except ToolRefused as exc:
            return _refused(str(exc.code), exc.detail, exc.field)
        except KernelShutdown as exc:
            return _refused(str(exc.reason), f"the kernel stopped: {exc.detail}")
        except Exception as exc:
            # Fail clear: the caller gets a code, the log the traceback, the kernel runs on.
            log.exception("gateway call of %s failed", clip(params.name, 64))
            return _refused(ReasonCode.KERNEL_FAULT, f"the gateway failed: {type(exc).__name__}")

    # --- one call -------------------------------------------------------------------

    async def _call(
        self, who: Principal, ctx: Any, name: str, arguments: dict[str, Any]
    ) -> CallToolResult:
        route = self.routes.get(name)
        kind = route.kind if route is not None else self._unnamed(name)
        conversation, call_id = self._keys(ctx)
        meta = getattr(ctx, "meta", None) or {}
        traceparent = meta.get(TRACEPARENT_META)
        await self._session(who.name)
        # A call the door bound to a user is that user's; any other acts for the kernel's
        # default principal (KernelConfig.principal), or is refused PRINCIPAL_MISSING.
        behalf: dict[str, Any] = {} if who.on_behalf is None else {"principal": who.on_behalf}
        decision = await self.kernel.propose(
            who.name,
            kind,
            arguments,
            explain=f"MCP tools/call of {clip(name, 64)} through the gateway",
            confidence=self.config.confidence,
            conversation=conversation,
            # The client's span, when it says which (W3C trace context in ``_meta``).
            trace_context=traceparent if isinstance(traceparent, str) else None,
            tool_call_id=call_id,
            **behalf,
        )
        return answer(decision, self.config.tools)

    def _unnamed(self, name: str) -> str:
        """The kind a call of a tool the pack does not name is proposed as (the kernel refuses it).

        Proposed all the same, so the refusal is on record: ``<upstream>_<tool>`` of a
        known upstream as ``<upstream>.<tool>``, any other name as itself.
        """
        upstream, sep, tool = name.partition("_")
        return f"{upstream}.{tool}" if sep and upstream in self.config.upstreams else name

    def _keys(self, ctx: Any) -> tuple[Any, Any]:
        """The call's conversation and tool-call id: the client's ``_meta``, else the connection's.

        A stdio or in-process connection is one conversation, its request ids the call
        ids. A stateless HTTP request belongs to no connection: without ``_meta`` it is
        keyed by nothing (request ids repeat across clients).
        """
        meta = getattr(ctx, "meta", None) or {}
        conversation = meta.get(CONVERSATION_META)
        call_id = meta.get(CALL_META)
        if conversation is None and getattr(ctx, "request", None) is None:
            conversation = self._connection(ctx)
        request_id = getattr(ctx, "request_id", None)
        if call_id is None and conversation is not None and request_id is not None:
            call_id = str(request_id)
        return conversation, call_id

    def _connection(self, ctx: Any) -> str | None:
        """The conversation of one connection, named once.

        The SDK's server hands each request a session of its own; what lives as long as the
        connection is the server's run for it (its lifespan state, one per stdio process or
        in-process client): the name is kept there. None: no such state, no conversation.
        """
        state = getattr(ctx, "lifespan_context", None)
        if not isinstance(state, dict):
            return None
        name = state.get(_CONNECTION_KEY)
        if not isinstance(name, str):
            name = state[_CONNECTION_KEY] = f"mcp-{uuid.uuid4()}"
        return name

    async def _session(self, agent_id: str) -> None:
        """Open the agent's session in the kernel once: a handshake with the pack's kinds."""
        async with self._lock:
            if agent_id in self._sessions:
                return
            manifest = Manifest(
                agent_id=agent_id,
                version=f"{CONTRACT_VERSION[0]}.{CONTRACT_VERSION[1]}.0",
                capabilities=self._capabilities(agent_id),
                max_attempts=self.config.max_attempts,
            )
            try:
                await self.kernel.handshake(manifest)
            except HandshakeRefused as exc:
                raise ToolRefused(exc.reason_code, str(exc)) from None
            self._sessions.add(agent_id)

    def _capabilities(self, agent_id: str) -> list[str]:
        """The kinds ``agent_id`` may call: the configuration's ``[agents]``, else every one."""
        every = sorted(route.kind for route in self.routes.values())
        named = self.config.agents.get(agent_id)
        return every if named is None else [k for k in every if k in named]

    async def _wait_flow(self, who: Principal, arguments: Mapping[str, Any]) -> CallToolResult:
        unknown = set(arguments) - {"dfid", "timeout_s"}
        if unknown:
            field = clip(sorted(map(str, unknown))[0], 64)
            raise ToolRefused(ReasonCode.SCHEMA_INVALID, f"wait_flow takes no {field}", field)
        dfid = arguments.get("dfid")
        if not isinstance(dfid, str) or not dfid or len(dfid) > 256:
            raise ToolRefused(ReasonCode.SCHEMA_INVALID, "dfid is a flow's DFID", "dfid")
        timeout = arguments.get("timeout_s", 0)
        if not isinstance(timeout, int) or isinstance(timeout, bool) or not 0 <= timeout:
            raise ToolRefused(ReasonCode.SCHEMA_INVALID, "timeout_s is 0 to 30", "timeout_s")
        flow = self.kernel.flow(dfid)
        if flow is None or flow.agent_id != who.name:
            # The same answer for another agent's flow: an agent learns nothing of others'.
            raise ToolRefused(CliError.UNKNOWN_FLOW, f"no open or recent flow {clip(dfid)}", "dfid")
        reads = Embedded(self.kernel)
        async with reads.reading() as view:
            # Another tenant's flow: the same answer, and the attempt on record.
            await check_flow(reads, view, who, "wait_flow", dfid, door="gateway")
        decision = await self.kernel.await_decision(dfid, float(min(timeout, MAX_WAIT_S)))
        return answer(decision, self.config.tools)

    async def _task(self, who: Principal, dfid: str) -> tuple[FlowState, CallToolResult | None]:
        """The flow behind task ``dfid`` as agent ``who`` may read it, its answer once ended."""
        flow = self.kernel.flow(dfid) if who.role == "agent" and 0 < len(dfid) <= 256 else None
        if flow is None or flow.agent_id != who.name:
            raise unknown_task(dfid)
        reads = Embedded(self.kernel)
        async with reads.reading() as view:
            await check_flow(reads, view, who, "tasks_get", dfid, door="gateway")
        if not flow.terminal:
            return flow, None
        return flow, answer(await self.kernel.await_decision(dfid, 0.0), self.config.tools)

    def _task_caller(self, ctx: Any) -> Principal:
        try:
            return self._who(ctx)
        except ToolRefused as exc:
            raise MCPError(INVALID_PARAMS, exc.detail, {"reason_code": str(exc.code)}) from None

    def _who(self, ctx: Any) -> Principal:
        return self.identity.of(Context(request_context=ctx, mcp_server=self))


def answer(decision: Decision, tools: Mapping[str, ToolPolicy] | None = None) -> CallToolResult:
    """Return the kernel's decision as the tool's result.

    EXECUTED: what the upstream answered, as recorded. Otherwise one line for the
    model and the decision's fields, structured; an escalation over a threshold names
    the field of ``tools`` (the configuration's) it compares.
    """
    decision = _in_its_units(decision, tools or {})
    meta = {
        "dirk/verdict": str(decision.verdict),
        "dirk/dfid": decision.dfid,
        "dirk/replayed": decision.replayed,
    }
    if decision.verdict is DecisionVerdict.EXECUTED:
        recorded = {"content": decision.result.get("content", []), "_meta": meta}
        if "structured" in decision.result:
            recorded["structuredContent"] = decision.result["structured"]
        try:
            return CallToolResult.model_validate(recorded)
        except ValueError:
            pass  # recorded as a note (too large to record): the decision's own words
    line = decision.message()
    if decision.verdict is DecisionVerdict.ESCALATED:
        line += f"; follow it with wait_flow(dfid={decision.dfid!r})"
    body = msgspec.to_builtins(
        {
            "verdict": decision.verdict,
            "dfid": decision.dfid,
            "reason_code": decision.reason_code,
            "detail": decision.detail,
            "field": decision.field,
            "limit": decision.limit,
            "replayed": decision.replayed,
        }
    )
    if decision.verdict is DecisionVerdict.EXECUTED:
        body["result"] = decision.result
    return CallToolResult(
        content=[TextContent(type="text", text=_sendable(line))],
        structured_content=_sendable(body),
        is_error=decision.verdict in (DecisionVerdict.REFUSED, DecisionVerdict.FAILED),
        _meta=meta,
    )


def _in_its_units(decision: Decision, tools: Mapping[str, ToolPolicy]) -> Decision:
    """``decision`` with an approval threshold's wording naming the field it compares.

    The DIM words a threshold over a field as ``amount 50 is above 20`` whatever the
    field holds; a gateway tool's field is a quantity, a count, a size as often as money,
    so the answer names it, ``qty 50 is above 20``: the field of the kind's
    ``approve_above`` whose bound the sentence quotes. The record keeps the DIM's words.
    """
    if str(decision.reason_code) != ReasonCode.APPROVAL_REQUIRED:
        return decision
    kind, sep, rest = decision.detail.partition(": amount ")
    policy = tools.get(kind)
    if not sep or policy is None:
        return decision
    bound = rest.rpartition(" is above ")[2]
    fields = [f for f, above in policy.approve_above.items() if str(above) == bound]
    if len(fields) != 1:
        return decision
    return msgspec.structs.replace(decision, detail=f"{kind}: {fields[0]} {rest}")


class _Call(msgspec.Struct, frozen=True, kw_only=True):
    name: Any
    arguments: Any


def _refused(code: str, detail: str, field: str = "") -> CallToolResult:
    """A call refused before any proposal (who calls, wait_flow's arguments)."""
    body = {"verdict": "REFUSED", "dfid": "", "reason_code": code, "detail": detail, "field": field}
    return CallToolResult(
        content=[TextContent(type="text", text=_sendable(f"REFUSED {code}: {detail}"))],
        structured_content=_sendable(body),
        is_error=True,
        _meta={"dirk/verdict": "REFUSED", "dirk/dfid": "", "dirk/replayed": False},
    )


def _sendable(value: Any) -> Any:
    """``value`` with each lone surrogate in its strings escaped: an answer always goes out."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, dict):
        return {_sendable(k): _sendable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_sendable(v) for v in value]
    return value
