"""What every MCP tool of dirk shares: the answer, the caller's identity, argument checks.

Arguments are declared with their JSON types for hosts and models, but taken
as they come (``Any`` with a declared schema), so no call stops in the SDK's
validation with no reason code. Each argument is checked here instead, by the
rule its annotation names (kernel.core.text): an id or a name takes no control
character, free text keeps tabs and line breaks only, and no string anywhere,
however deep in an object, may hold a lone surrogate. On an agent's tool a
value that is not a string goes on into the proposal, where the kernel judges
it and records the refusal; on the others it is refused here. Every refusal is
an ERROR answer with SCHEMA_INVALID (or another code) and the field.
"""

from __future__ import annotations

import inspect
import logging
import typing
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Annotated, Any

import msgspec
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp_types import CallToolResult, ListToolsResult, PaginatedRequestParams, TextContent
from pydantic import BaseModel, WithJsonSchema

from kernel.core.errors import KernelShutdown
from kernel.core.reasons import ReasonCode
from kernel.core.text import free_text_problem, id_problem, value_problem
from kernel.core.wall import InputInvalid, check_value
from kernel.mcp._backend import Principal, ToolRefused

log = logging.getLogger(__name__)


class Rule(Enum):
    """How an argument is checked before its tool runs (kernel.core.text)."""

    ID = "id"
    """A name, an id, a choice or a hash: a string with no control character."""
    TEXT = "text"
    """Free text: a string whose only control characters are tab, line feed, carriage return."""
    IDS = "ids"
    """A list of ids (labels)."""
    VALUE = "value"
    """A free-form value (an object, a list): bounded as the wall bounds it, no lone surrogate."""
    NUMBER = "number"
    """A number or an integer: the tool checks its range."""


Id = Annotated[Any, WithJsonSchema({"type": "string"}), Rule.ID]
OptId = Annotated[Any, WithJsonSchema({"type": ["string", "null"]}), Rule.ID]
Text = Annotated[Any, WithJsonSchema({"type": "string"}), Rule.TEXT]
OptText = Annotated[Any, WithJsonSchema({"type": ["string", "null"]}), Rule.TEXT]
Int = Annotated[Any, WithJsonSchema({"type": "integer"}), Rule.NUMBER]
OptInt = Annotated[Any, WithJsonSchema({"type": ["integer", "null"]}), Rule.NUMBER]
Number = Annotated[Any, WithJsonSchema({"type": "number", "minimum": 0, "maximum": 1}), Rule.NUMBER]
Ints = Annotated[Any, WithJsonSchema({"type": "array", "items": {"type": "integer"}}), Rule.VALUE]
Labels = Annotated[Any, WithJsonSchema({"type": "array", "items": {"type": "string"}}), Rule.IDS]
Obj = Annotated[Any, WithJsonSchema({"type": ["object", "null"]}), Rule.VALUE]
Priority = Annotated[
    Any,
    WithJsonSchema({"type": "string", "enum": ["required", "learned", "preferred"]}),
    Rule.ID,
]

MAX_RESULTS = 100
"""The most items a listing or a search returns."""


class Answer(BaseModel):
    """What every tool answers (its structured content)."""

    verdict: str
    """ACCEPTED, REJECTED, ESCALATED (proposals); APPLIED, QUEUED, REFUSED (operator acts);
    OK (reads); ERROR (refused input)."""
    dfid: str = ""
    status: str = ""
    reason_code: str | None = None
    detail: str = ""
    field: str = ""
    result: dict[str, Any] = {}


Reply = Annotated[CallToolResult, Answer]


def reply(answer: Answer) -> CallToolResult:
    """Return ``answer`` as a tool result: structured, with a text copy for older hosts."""
    body = answer.model_dump(mode="json")
    try:
        text = msgspec.json.encode(body).decode()
    except UnicodeEncodeError:
        # Never expected (arguments are checked), but an answer must always go out:
        # whatever string holds a lone surrogate is sent with it escaped.
        body = _scrubbed(body)
        text = msgspec.json.encode(body).decode()
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=body,
        is_error=answer.verdict == "ERROR",
    )


def _scrubbed(value: Any) -> Any:
    """``value`` with each lone surrogate in its strings written out as ``\\udXXX`` text."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, dict):
        return {_scrubbed(k): _scrubbed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v) for v in value]
    return value


def refused(code: str, detail: str, field: str = "") -> CallToolResult:
    return reply(Answer(verdict="ERROR", reason_code=code, detail=detail, field=field))


class Identity:
    """Who calls: a fixed principal (stdio, in process), or one per bearer token (HTTP).

    Args:
        default: the principal of a call that carries no token (stdio, in process).
        tokens: principals by bearer token; when given, a call must carry one.
    """

    def __init__(
        self, default: Principal | None = None, tokens: Mapping[str, Principal] | None = None
    ) -> None:
        self.default = default
        self.tokens = dict(tokens or {})

    def of(self, ctx: Context[Any, Any]) -> Principal:
        headers = None
        try:
            headers = ctx.headers
        except ValueError:
            headers = None
        if self.tokens:
            value = (headers or {}).get("authorization", "")
            scheme, _, token = value.partition(" ")
            principal = self.tokens.get(token) if scheme.lower() == "bearer" else None
            if principal is None:
                raise ToolRefused(ReasonCode.INVALID_SESSION, "no valid bearer token")
            return principal
        if self.default is None:
            raise ToolRefused(ReasonCode.UNAUTHORIZED, "this server has no principal")
        return self.default


def checked_text(value: Any, field: str, limit: int = 4096) -> str:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise ToolRefused(
            ReasonCode.SCHEMA_INVALID, f"a non-empty string of at most {limit} characters", field
        )
    return value


def checked_seq(value: Any, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value >= 2**63:
        raise ToolRefused(ReasonCode.SCHEMA_INVALID, "a non-negative integer (an event seq)", field)
    return value


Register = Callable[[Callable[..., Any]], Callable[..., Any]]


class CodedServer(MCPServer[Any]):
    """The SDK's server, but every call of a tool is answered with a reason code.

    The SDK answers an unknown tool, a missing argument or one it fails to
    validate with bare text (``Error executing tool ...``), no code, no field.
    Here each is an ERROR answer with SCHEMA_INVALID and the field, and an
    argument the tool does not declare is refused as the wall refuses an unknown
    field, instead of being dropped unseen. Who calls is checked first: a caller
    without the tool's role learns nothing about its arguments.
    """

    identity: Identity | None = None
    roles: dict[str, str | None]

    async def _handle_list_tools(
        self, ctx: Any, params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        """``tools/list``: each principal sees only the tools its role may call."""
        roles = getattr(self, "roles", {})
        try:
            who: Principal | None = (
                self.identity.of(Context(request_context=ctx, mcp_server=self))
                if self.identity is not None
                else None
            )
        except ToolRefused:
            who = None  # no valid token: only the tools anyone may call
        role = who.role if who is not None else None
        tools = [t for t in await self.list_tools() if roles.get(t.name) in (None, role)]
        return ListToolsResult(tools=tools)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> Any:
        tool = self._tool_manager.get_tool(name)
        if tool is None:
            return refused(ReasonCode.SCHEMA_INVALID, f"no tool {_shown(name)!r}", "name")
        if context is None:
            context = Context(mcp_server=self)
        try:
            allowed(self.identity, getattr(self, "roles", {}).get(name), context, name)
        except ToolRefused as exc:
            return refused(str(exc.code), exc.detail, exc.field)
        if not isinstance(arguments, dict):
            return refused(ReasonCode.SCHEMA_INVALID, "arguments are an object", "arguments")
        declared = tool.parameters.get("properties", {})
        for given in arguments:
            if given not in declared:
                return refused(
                    ReasonCode.SCHEMA_INVALID,
                    f"{name} takes no argument {_shown(given)!r}",
                    _shown(given),
                )
        for needed in tool.parameters.get("required", []):
            if needed not in arguments:
                return refused(ReasonCode.SCHEMA_INVALID, f"{name} needs {needed}", needed)
        try:
            return await super().call_tool(name, arguments, context)
        except UnexpectedToolError:
            log.exception("MCP tool %r failed in the SDK", name)
            return refused(ReasonCode.KERNEL_FAULT, f"{name}: the answer could not be sent")
        except ToolError as exc:
            # What the SDK still refuses (arguments are declared Any, so rarely anything).
            log.info("MCP tool %r refused by the SDK: %s", name, type(exc.__cause__).__name__)
            return refused(ReasonCode.SCHEMA_INVALID, f"{name}: arguments do not validate")


def allowed(
    identity: Identity | None, role: str | None, ctx: Context[Any, Any], tool: str
) -> Principal:
    """Return who calls, if allowed to call a tool for ``role`` (None: anyone).

    Raises:
        ToolRefused: no principal, or one of another role (UNAUTHORIZED, INVALID_SESSION).
    """
    if identity is None:
        raise ToolRefused(ReasonCode.UNAUTHORIZED, "this server has no principal")
    who = identity.of(ctx)
    if role is not None and who.role != role:
        raise ToolRefused(
            ReasonCode.UNAUTHORIZED, f"{tool} is for {role}s; {who.name} is an {who.role}"
        )
    return who


def _shown(text: Any) -> str:
    """A caller's name for something, cut short and safe to send back (no lone surrogate)."""
    shown = text if isinstance(text, str) else repr(text)
    return shown[:64].encode("utf-8", "backslashreplace").decode()


def argument_refusal(
    rules: Mapping[str, tuple[Rule | None, Any]], given: Mapping[str, Any], *, strict: bool
) -> ToolRefused | None:
    """Return the refusal of the first argument that breaks its rule, or None.

    ``rules`` maps each parameter to its rule and its default; ``strict`` (every tool
    but an agent's) refuses a value that is not a string where text is declared.
    A string is checked as free text where free text is declared, as an id anywhere
    else (a string sent for a number or an object is no free text either); no string
    anywhere in any argument may hold a lone surrogate.
    """
    for name, value in given.items():
        rule, default = rules.get(name, (None, inspect.Parameter.empty))
        if value is None and default is None:
            continue  # an optional argument sent as null
        if isinstance(value, str):
            problem = (free_text_problem if rule is Rule.TEXT else id_problem)(value)
            if problem is not None:
                return ToolRefused(ReasonCode.SCHEMA_INVALID, problem, name)
            continue
        if rule in (Rule.ID, Rule.TEXT) and strict:
            return ToolRefused(ReasonCode.SCHEMA_INVALID, f"not text: {type(value).__name__}", name)
        if rule is Rule.IDS and isinstance(value, list):
            for i, item in enumerate(value):
                problem = id_problem(item) if isinstance(item, str) or strict else None
                if problem is not None:
                    return ToolRefused(ReasonCode.SCHEMA_INVALID, problem, f"{name}[{i}]")
        if rule is Rule.VALUE and strict:
            try:
                check_value(value, name)
            except InputInvalid as exc:
                return ToolRefused(exc.reason_code, exc.detail, exc.field)
        # Whatever goes on into a proposal or a row: no lone surrogate, however deep.
        found = value_problem(value)
        if found is not None:
            path, problem = found
            field = name if path == "$" else f"{name}.{path}" if path[0] != "[" else name + path
            return ToolRefused(ReasonCode.SCHEMA_INVALID, problem, field)
    return None


def _rules_of(fn: Callable[..., Any]) -> dict[str, tuple[Rule | None, Any]]:
    """Each parameter of ``fn`` (but the principal) with its Rule and its default."""
    hints = typing.get_type_hints(fn, include_extras=True)
    rules: dict[str, tuple[Rule | None, Any]] = {}
    for name, param in list(inspect.signature(fn).parameters.items())[1:]:
        marks = [m for m in getattr(hints.get(name), "__metadata__", ()) if isinstance(m, Rule)]
        default = param.default  # inspect.Parameter.empty for a required one
        rules[name] = (marks[0] if marks else None, default)
    return rules


def registrar(server: MCPServer[Any], identity: Identity) -> Callable[[str | None], Register]:
    """Return ``tool(role)``: a decorator that adds a tool to ``server``.

    The decorated coroutine takes the calling :class:`Principal` first and answers
    an :class:`Answer`; the tool checks the caller's role (None: anyone) and each
    argument by the Rule its annotation carries, and answers a refusal, a stopped
    kernel or a fault as an ERROR answer.
    """

    def tool(role: str | None = None) -> Register:

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            rules = _rules_of(fn)
            strict = role != "agent"
            if isinstance(server, CodedServer):
                server.identity = identity
                server.roles = {**getattr(server, "roles", {}), fn.__name__: role}

            async def run(ctx: Context[Any, Any], **kw: Any) -> CallToolResult:
                try:
                    who = allowed(identity, role, ctx, fn.__name__)
                    bad = argument_refusal(rules, kw, strict=strict)
                    if bad is not None:
                        raise bad
                    answer = await fn(who, **kw)
                except ToolRefused as exc:
                    return refused(str(exc.code), exc.detail, exc.field)
                except KernelShutdown as exc:
                    # Not a reason code of a decision: the StopReason says why it stopped.
                    return refused(str(exc.reason), f"the kernel stopped: {exc.detail}")
                except Exception as exc:
                    # Fail clear: the caller gets a code, the log the traceback, the kernel runs on.
                    log.exception("MCP tool %s failed", fn.__name__)
                    return refused(ReasonCode.KERNEL_FAULT, f"{fn.__name__}: {type(exc).__name__}")
                return reply(answer)

            run.__signature__ = _signature(fn)  # type: ignore[attr-defined]
            run.__name__ = fn.__name__
            run.__doc__ = fn.__doc__
            server.add_tool(run, name=fn.__name__, description=fn.__doc__)
            return fn

        return register

    return tool


def _signature(fn: Callable[..., Any]) -> Any:
    """``fn``'s signature with the principal replaced by the SDK's Context."""
    sig = inspect.signature(fn, eval_str=True)
    params = list(sig.parameters.values())[1:]
    ctx = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
    return sig.replace(parameters=[ctx, *params], return_annotation=Reply)
