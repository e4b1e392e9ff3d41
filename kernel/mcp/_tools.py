"""What every MCP tool of dirk shares: the answer, the caller's identity, argument checks.

Arguments are declared with their JSON types for hosts and models, but taken
as they come (``Any`` with a declared schema), so a wrong type reaches the
kernel's own checks, and its record, instead of stopping in the SDK's
validation with no reason code.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import msgspec
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel, WithJsonSchema

from kernel.core.errors import KernelShutdown
from kernel.core.reasons import ReasonCode
from kernel.mcp._backend import Principal, ToolRefused

log = logging.getLogger(__name__)

Text = Annotated[Any, WithJsonSchema({"type": "string"})]
OptText = Annotated[Any, WithJsonSchema({"type": ["string", "null"]})]
Int = Annotated[Any, WithJsonSchema({"type": "integer"})]
OptInt = Annotated[Any, WithJsonSchema({"type": ["integer", "null"]})]
Number = Annotated[Any, WithJsonSchema({"type": "number", "minimum": 0, "maximum": 1})]
Ints = Annotated[Any, WithJsonSchema({"type": "array", "items": {"type": "integer"}})]
Labels = Annotated[Any, WithJsonSchema({"type": "array", "items": {"type": "string"}})]
Obj = Annotated[Any, WithJsonSchema({"type": ["object", "null"]})]
Priority = Annotated[
    Any, WithJsonSchema({"type": "string", "enum": ["required", "learned", "preferred"]})
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
    text = msgspec.json.encode(body).decode()
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=body,
        is_error=answer.verdict == "ERROR",
    )


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


def registrar(server: MCPServer[Any], identity: Identity) -> Callable[[str | None], Register]:
    """Return ``tool(role)``: a decorator that adds a tool to ``server``.

    The decorated coroutine takes the calling :class:`Principal` first and answers
    an :class:`Answer`; the tool checks the caller's role (None: anyone), answers
    a refusal, a stopped kernel or a fault as an ERROR answer.
    """

    def tool(role: str | None = None) -> Register:

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            async def run(ctx: Context[Any, Any], **kw: Any) -> CallToolResult:
                try:
                    who = identity.of(ctx)
                    if role is not None and who.role != role:
                        raise ToolRefused(
                            ReasonCode.UNAUTHORIZED,
                            f"{fn.__name__} is for {role}s; {who.name} is an {who.role}",
                        )
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
