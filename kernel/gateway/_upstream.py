"""The upstream MCP servers: one connection each, made on demand, made again after a loss.

:class:`Upstream` holds the SDK's client to one server (a command over stdio, or a
URL over streamable HTTP) in a task of the gateway's own, so a call from any task
(the kernel's executor) uses it, and a server that died is started or connected
again by the next call. :class:`UpstreamExecutor` is the kernel's adapter for the
kinds of one upstream: it carries out an accepted intent by calling the tool.

How each failure is classified (the adapter contract, kernel.adapters):

- no connection (the command does not start, the URL does not answer): nothing was
  sent, so nothing happened: transient, retried up to the upstream's ``attempts``,
  then the flow ends EXECUTION_FAILED;
- the tool answers ``isError``: the tool refused: terminal, EXECUTION_FAILED, with
  the tool's words;
- the request was sent and no usable answer came back (the server died mid-call,
  its answer does not parse, the call outlived ``timeout_s``): the effect may have
  happened: the flow goes to a human, OUTCOME_UNKNOWN (reconcile or retry).
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import CallToolResult, TextContent

from kernel.adapters import AdapterError, ExecutionIntent, Receipt, RetryPolicy
from kernel.core.wall import clip
from kernel.gateway._config import UpstreamSpec
from kernel.gateway._pack import Route, ToolInfo

log = logging.getLogger(__name__)

MAX_TOOLS = 1000
"""The most tools an upstream's listing is read for."""


class UpstreamDown(Exception):
    """No connection to the upstream could be made (nothing was sent)."""


class Upstream:
    """One upstream MCP server, connected while the gateway runs.

    Args:
        name: the upstream's name in the configuration.
        spec: how to reach it.
        base: the directory a stdio command runs in by default.
        tg: the gateway's task group, where the connection lives.
    """

    def __init__(self, name: str, spec: UpstreamSpec, base: str, tg: TaskGroup) -> None:
        self.name = name
        self.spec = spec
        self._base = base
        self._tg = tg
        self._client: Client | None = None
        self._lost = anyio.Event()
        self._lock = anyio.Lock()

    def _target(self) -> Any:
        spec = self.spec
        if spec.command:
            cwd = spec.cwd if spec.cwd is not None else self._base
            return StdioServerParameters(
                command=spec.command[0],
                args=list(spec.command[1:]),
                env=dict(spec.env) or None,
                cwd=str(Path(self._base, cwd)),
            )
        return spec.url

    async def _hold(self, *, task_status: TaskStatus[Client]) -> None:
        """Keep one connection open until it is lost or given up; its errors end here."""
        started = False
        lost = self._lost
        try:
            async with AsyncExitStack() as stack:
                target = self._target()
                if isinstance(target, str):
                    http = await stack.enter_async_context(
                        create_mcp_http_client(headers=dict(self.spec.headers) or None)
                    )
                    target = streamable_http_client(target, http_client=http)
                client = await stack.enter_async_context(Client(target))
                started = True
                task_status.started(client)
                await lost.wait()
        except Exception as exc:
            if not started:
                raise
            # The server went away under the connection: the next call connects again.
            log.warning("upstream %s: connection lost: %s", self.name, type(exc).__name__)
        finally:
            if self._client is not None and self._lost is lost:
                self._client = None

    async def client(self) -> Client:
        """Return the open connection, connecting (starting the command) first if needed.

        Raises:
            UpstreamDown: it cannot be reached within ``connect_s``.
        """
        async with self._lock:
            if self._client is not None:
                return self._client
            self._lost = anyio.Event()
            try:
                with anyio.fail_after(self.spec.connect_s):
                    client: Client = await self._tg.start(self._hold)
            except Exception as exc:
                self._lost.set()
                raise UpstreamDown(
                    f"upstream {self.name} cannot be reached: {_said(exc)}"
                ) from None
            self._client = client
            return client

    def drop(self) -> None:
        """Give the connection up (it failed): the next call connects again."""
        self._client = None
        self._lost.set()

    async def list_tools(self) -> list[ToolInfo]:
        """Return the upstream's tools (its ``tools/list``, every page).

        Raises:
            UpstreamDown: it cannot be reached, or its listing cannot be read.
        """
        client = await self.client()
        try:
            with anyio.fail_after(self.spec.timeout_s):
                listed = await client.list_tools()
        except Exception as exc:
            self.drop()
            raise UpstreamDown(f"upstream {self.name}: tools/list failed: {_said(exc)}") from None
        return [
            ToolInfo(
                name=tool.name,
                description=tool.description or "",
                input_schema=dict(tool.input_schema or {}),
            )
            for tool in listed.tools[:MAX_TOOLS]
        ]

    async def call(self, tool: str, arguments: dict[str, Any]) -> CallToolResult:
        """Call ``tool`` once; return its result (an ``isError`` one too).

        Raises:
            AdapterError: classified as the module says.
        """
        try:
            client = await self.client()
        except UpstreamDown as exc:
            # Nothing was sent: a retry cannot double anything.
            raise AdapterError(str(exc), transient=True, outcome_unknown=False) from None
        try:
            with anyio.fail_after(self.spec.timeout_s):
                result = await client.call_tool(tool, arguments)
        except TimeoutError:
            self.drop()
            raise AdapterError(
                f"upstream {self.name}: {tool} did not answer within {self.spec.timeout_s:g} s",
                outcome_unknown=True,
            ) from None
        except Exception as exc:
            self.drop()
            raise AdapterError(
                f"upstream {self.name}: {tool} gave no usable answer: {_said(exc)}",
                outcome_unknown=True,
            ) from None
        if not isinstance(result, CallToolResult):
            raise AdapterError(
                f"upstream {self.name}: {tool} answered {type(result).__name__}, not a result",
                outcome_unknown=True,
            )
        return result


class UpstreamExecutor:
    """The kernel's adapter for one upstream's kinds: an accepted intent is one tool call.

    The intent's key goes into the tool's idempotency argument where its schema has
    one (``Route.key_arg``): an upstream that honours it makes a repeated call (the
    kernel resuming after a crash) harmless. The receipt records what the tool
    answered: its content and structured content.
    """

    def __init__(self, upstream: Upstream, routes: dict[str, Route]) -> None:
        self.upstream = upstream
        self._routes = {route.kind: route for route in routes.values()}
        self.retry_policy = RetryPolicy(
            max_attempts=upstream.spec.attempts,
            base_s=0.2,
            max_s=2.0,
            jitter=0.0,
            on_exhausted="abort",
        )

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        """Call the intent's tool upstream once; return what it answered."""
        route = self._routes.get(intent.kind)
        if route is None:
            raise AdapterError(f"no tool of upstream {self.upstream.name} is {intent.kind}")
        arguments = dict(intent.params)
        if route.key_arg:
            arguments[route.key_arg] = intent.key
        result = await self.upstream.call(route.tool, arguments)
        if result.is_error:
            raise AdapterError(f"{route.tool} refused: {clip(text_of(result), 500)}")
        detail: dict[str, Any] = {
            "content": [block.model_dump(mode="json", by_alias=True) for block in result.content]
        }
        if result.structured_content is not None:
            detail["structured"] = result.structured_content
        return Receipt(external_id=f"{self.upstream.name}:{intent.key}", detail=detail)


def text_of(result: CallToolResult) -> str:
    """The text a result's content carries, joined."""
    return " ".join(b.text for b in result.content if isinstance(b, TextContent)) or "(no text)"


def _said(exc: BaseException) -> str:
    """What an exception says, short, one line (an exception group: its first leaf)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    words = " ".join(str(exc).split())
    return clip(f"{type(exc).__name__}: {words}" if words else type(exc).__name__, 300)
