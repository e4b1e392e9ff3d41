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
  happened: the flow goes to a human, OUTCOME_UNKNOWN (reconcile or retry);
- a call the kernel resumes after a restart: an MCP server cannot be asked what became
  of it (``UpstreamExecutor.lookup``), so it goes to a human as well.
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


class _Link:
    """One connection to an upstream: its client, and how it ended."""

    def __init__(self) -> None:
        self.client: Client | None = None
        self.lost = anyio.Event()
        """Set to give the connection up."""
        self.closed = anyio.Event()
        """Set once the connection is closed."""
        self.error: BaseException | None = None
        """What broke it, if anything did."""
        self.inflight = 0


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
        self._link: _Link | None = None
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

    async def _hold(self, link: _Link, *, task_status: TaskStatus[Client]) -> None:
        """Keep one connection open until it is lost or given up; its errors end here."""
        try:
            async with AsyncExitStack() as stack:
                target = self._target()
                if isinstance(target, str):
                    http = await stack.enter_async_context(
                        create_mcp_http_client(headers=dict(self.spec.headers) or None)
                    )
                    target = streamable_http_client(target, http_client=http)
                client = await stack.enter_async_context(Client(target))
                link.client = client
                task_status.started(client)
                await link.lost.wait()
        except Exception as exc:
            if link.client is None:
                raise
            # The server went away under the connection: the next call connects again.
            link.error = exc
            log.warning("upstream %s: connection lost: %s", self.name, _said(exc))
        finally:
            if self._link is link:
                self._link = None
            link.closed.set()

    async def _open(self) -> _Link:
        """Return the open connection, connecting (starting the command) first if needed.

        Raises:
            UpstreamDown: it cannot be reached within ``connect_s``.
        """
        async with self._lock:
            if self._link is not None and not self._link.lost.is_set():
                return self._link
            link = _Link()
            try:
                with anyio.fail_after(self.spec.connect_s):
                    await self._tg.start(self._hold, link)
            except Exception as exc:
                link.lost.set()
                raise UpstreamDown(
                    f"upstream {self.name} cannot be reached: {_said(exc)}"
                ) from None
            self._link = link
            return link

    def drop(self) -> None:
        """Give the connection up (it failed, or the gateway stops)."""
        if self._link is not None:
            self._link.lost.set()
            self._link = None

    async def list_tools(self) -> list[ToolInfo]:
        """Return the upstream's tools (its ``tools/list``, page by page).

        Raises:
            UpstreamDown: it cannot be reached, or its listing cannot be read.
        """
        link = await self._open()
        assert link.client is not None
        tools: list[Any] = []
        cursor: str | None = None
        try:
            with anyio.fail_after(self.spec.timeout_s):
                # Every page, up to MAX_TOOLS: a server that pages forever is not followed.
                while len(tools) < MAX_TOOLS:
                    page = await link.client.list_tools(cursor=cursor, cache_mode="refresh")
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except Exception as exc:
            self.drop()
            raise UpstreamDown(f"upstream {self.name}: tools/list failed: {_said(exc)}") from None
        return [
            ToolInfo(
                name=tool.name,
                description=tool.description or "",
                input_schema=dict(tool.input_schema or {}),
            )
            for tool in tools[:MAX_TOOLS]
        ]

    async def call(self, tool: str, arguments: dict[str, Any]) -> CallToolResult:
        """Call ``tool`` once; return its result (an ``isError`` one too).

        Raises:
            AdapterError: classified as the module says.
        """
        try:
            link = await self._open()
        except UpstreamDown as exc:
            # Nothing was sent: a retry cannot double anything.
            raise AdapterError(str(exc), transient=True, outcome_unknown=False) from None
        assert link.client is not None
        link.inflight += 1
        alone = link.inflight == 1
        try:
            with anyio.fail_after(self.spec.timeout_s):
                result = await link.client.call_tool(tool, arguments)
        except TimeoutError:
            self._give_up(link)
            raise AdapterError(
                f"upstream {self.name}: {tool} did not answer within {self.spec.timeout_s:g} s",
                outcome_unknown=True,
            ) from None
        except Exception as exc:
            self._give_up(link)
            cause = await self._cause(link, exc, alone)
            if _never_sent(cause):
                # Refused at connect (an HTTP upstream that went away): nothing reached it.
                raise AdapterError(
                    f"upstream {self.name} cannot be reached: {_said(cause)}",
                    transient=True,
                    outcome_unknown=False,
                ) from None
            raise AdapterError(
                f"upstream {self.name}: {tool} gave no usable answer: {_said(cause)}",
                outcome_unknown=True,
            ) from None
        finally:
            link.inflight -= 1
        if not isinstance(result, CallToolResult):
            raise AdapterError(
                f"upstream {self.name}: {tool} answered {type(result).__name__}, not a result",
                outcome_unknown=True,
            )
        return result

    def _give_up(self, link: _Link) -> None:
        link.lost.set()
        if self._link is link:
            self._link = None

    async def _cause(self, link: _Link, exc: BaseException, alone: bool) -> BaseException:
        """What made a call fail: its own error, or what broke the connection under it.

        The SDK answers a request whose connection broke with "Connection closed"; what
        broke it (a refused connect) ended the connection's task. That counts for this
        call only when it was the connection's one request in flight: another's failure
        says nothing about whether this one was sent.
        """
        if not alone:
            return exc
        with anyio.move_on_after(5):
            await link.closed.wait()
        return link.error if link.error is not None and _never_sent(link.error) else exc


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
        self._unsent: set[str] = set()
        """Keys whose last call never reached the upstream (kept in memory only)."""
        self.retry_policy = RetryPolicy(
            max_attempts=upstream.spec.attempts,
            base_s=0.2,
            max_s=2.0,
            jitter=0.0,
            on_exhausted="abort",
        )

    async def lookup(self, key: str) -> Receipt | None:
        """Say what became of a call with ``key`` before the kernel calls again.

        An MCP server cannot be asked that. What this process knows: a key whose last
        call never reached the upstream (a refused connect) has no effect, so it may be
        called again (None). Any other key (a call that may have been carried out, or
        one the kernel resumes after a restart) has an unknown outcome: a human
        reconciles or retries it (OUTCOME_UNKNOWN), nothing calls it again blindly.

        Raises:
            AdapterError: the outcome is unknown.
        """
        if key in self._unsent:
            return None
        raise AdapterError(
            f"upstream {self.upstream.name} cannot be asked what became of call {key}",
            outcome_unknown=True,
        )

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        """Call the intent's tool upstream once; return what it answered."""
        route = self._routes.get(intent.kind)
        if route is None:
            raise AdapterError(f"no tool of upstream {self.upstream.name} is {intent.kind}")
        arguments = dict(intent.params)
        if route.key_arg:
            arguments[route.key_arg] = intent.key
        try:
            result = await self.upstream.call(route.tool, arguments)
        except AdapterError as exc:
            if exc.outcome_unknown:
                self._unsent.discard(intent.key)
            else:
                self._unsent.add(intent.key)  # nothing reached the upstream
            raise
        self._unsent.discard(intent.key)
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


_UNSENT = frozenset({"ConnectError", "ConnectTimeout", "ConnectionRefusedError"})
"""Errors that say a request never reached the server (httpx's and httpx2's, the OS's)."""


def _never_sent(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) says the request never reached the server."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if type(current).__name__ in _UNSENT:
            return True
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False


def _said(exc: BaseException) -> str:
    """What an exception says, short, one line (an exception group: its first leaf)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    words = " ".join(str(exc).split())
    return clip(f"{type(exc).__name__}: {words}" if words else type(exc).__name__, 300)
