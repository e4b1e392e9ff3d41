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
import math
import re
import typing
from collections.abc import Awaitable, Callable, Mapping
from decimal import Decimal
from enum import Enum
from typing import Annotated, Any

import msgspec
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
    ToolAnnotations,
)
from pydantic import BaseModel, WithJsonSchema

from kernel.core.errors import KernelShutdown
from kernel.core.reasons import ReasonCode
from kernel.core.text import free_text_problem, id_problem, value_problem
from kernel.core.wall import InputInvalid, check_value
from kernel.mcp._backend import Principal, ToolRefused
from kernel.mcp._identity import Identity as Identity
from kernel.mcp._words import summary_of

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


# An optional argument is one the caller may leave out: its schema has one `type`, no
# `["string", "null"]` (a portable schema, as the Inspector's --strict asks); a null sent
# anyway is taken as left out.
Id = Annotated[Any, WithJsonSchema({"type": "string"}), Rule.ID]
OptId = Id
Text = Annotated[Any, WithJsonSchema({"type": "string"}), Rule.TEXT]
OptText = Text
Int = Annotated[Any, WithJsonSchema({"type": "integer"}), Rule.NUMBER]
OptInt = Int
Number = Annotated[Any, WithJsonSchema({"type": "number", "minimum": 0, "maximum": 1}), Rule.NUMBER]
Ints = Annotated[Any, WithJsonSchema({"type": "array", "items": {"type": "integer"}}), Rule.VALUE]
Labels = Annotated[Any, WithJsonSchema({"type": "array", "items": {"type": "string"}}), Rule.IDS]
Obj = Annotated[Any, WithJsonSchema({"type": "object"}), Rule.VALUE]
Confidence = Annotated[
    Any,
    WithJsonSchema(
        {"type": "string", "pattern": r"^(0(\.[0-9]{1,9})?|1(\.0{1,9})?)$", "default": "1"}
    ),
    Rule.ID,
]
"""A confidence from 0 to 1 as a decimal string ("0.9"); a JSON number is taken too."""
Priority = Annotated[
    Any,
    WithJsonSchema({"type": "string", "enum": ["required", "learned", "preferred"]}),
    Rule.ID,
]

MAX_RESULTS = 100
"""The most items a listing or a search returns."""


class Answer(BaseModel):
    """What every tool answers (its structured content).

    The fields are for machines, as the kernel recorded them: ``detail`` quotes amounts
    in the minor units the pack counts in (the units the agent proposed in, so it
    revises against them) and durations as recorded. ``summary`` is the same answer for
    a person: amounts in major units with their currency, durations in the largest
    sensible unit (kernel.audit.units.readable); it is also the result's first text.
    """

    verdict: str
    """ACCEPTED, REJECTED, ESCALATED (proposals); APPLIED, QUEUED, REFUSED (operator acts);
    OK (reads); ERROR (refused input)."""
    dfid: str = ""
    status: str = ""
    reason_code: str | None = None
    detail: str = ""
    field: str = ""
    result: dict[str, Any] = {}
    summary: str = ""
    """The answer in words, as a person reads it (filled in when the tool leaves it empty)."""


Reply = Annotated[CallToolResult, Answer]


def reply(answer: Answer, currency: str = "none") -> CallToolResult:
    """Return ``answer`` as a tool result: structured, its summary and a JSON copy as text.

    The first text is the summary a person (and a host's model) reads, amounts shown in
    ``currency`` (``none``: as recorded); the second is the structured content as JSON,
    for hosts that read no structured content.
    """
    body = answer.model_dump(mode="json")
    body["summary"] = body["summary"] or summary_of(body, currency)
    try:
        text = msgspec.json.encode(body).decode()
    except UnicodeEncodeError:
        # Never expected (arguments are checked), but an answer must always go out:
        # whatever string holds a lone surrogate is sent with it escaped.
        body = _scrubbed(body)
        text = msgspec.json.encode(body).decode()
    return CallToolResult(
        content=[
            TextContent(type="text", text=body["summary"]),
            TextContent(type="text", text=text),
        ],
        structured_content=body,
        is_error=answer.verdict == "ERROR",
        # As the gateway's answers carry it: a client reads the verdict without the body.
        _meta={"dirk/verdict": body["verdict"], "dirk/dfid": body["dfid"]},
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


def refused(code: str, detail: str, field: str = "", currency: str = "none") -> CallToolResult:
    """An ERROR answer: the code, the detail as it is, the field; its summary in ``currency``."""
    answer = Answer(verdict="ERROR", reason_code=code, detail=detail, field=field)
    return reply(answer, currency)


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


_CONFIDENCE = re.compile(r"(0(\.[0-9]{1,9})?|1(\.0{1,9})?)")


def checked_confidence(value: Any) -> str:
    """Return a confidence as the decimal string the memory pack records ("0.9").

    A JSON number from 0 to 1 is taken as what it means (models send 0.9 for a
    confidence); a string must be a decimal from 0 to 1 already. Anything else
    (``"NaN"``, ``"1e-3"``, ``2``, ``true``) is refused here: the pack would record it.

    Raises:
        ToolRefused: SCHEMA_INVALID on field ``confidence``.
    """
    text = value
    if isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value) and 0 <= value <= 1:
            # At most 9 places, as the pattern allows: 0.1 + 0.2 is "0.3".
            text = format(Decimal(repr(value)).quantize(Decimal("1e-9")).normalize(), "f")
    if isinstance(text, str) and _CONFIDENCE.fullmatch(text):
        return text
    raise ToolRefused(
        ReasonCode.SCHEMA_INVALID, 'a decimal from 0 to 1, such as "0.9"', "confidence"
    )


Register = Callable[[Callable[..., Any]], Callable[..., Any]]


class CodedServer(MCPServer[Any]):
    """The SDK's server, but every call of a tool is answered with a reason code.

    The SDK answers an unknown tool, a missing argument or one it fails to
    validate with bare text (``Error executing tool ...``), no code, no field.
    Here an unknown tool is the JSON-RPC error the spec asks for (-32602, invalid
    params, ``data`` with SCHEMA_INVALID and field ``name``); each other is an ERROR
    answer with SCHEMA_INVALID and the field, and an
    argument the tool does not declare is refused as the wall refuses an unknown
    field, instead of being dropped unseen. Who calls is checked first: a caller
    without the tool's role learns nothing about its arguments.
    """

    identity: Identity | None = None
    roles: dict[str, str | None]
    offered: Callable[[Principal], Awaitable[Any]] | None = None
    """What an agent is offered (kernel.mcp._offered.Offer), when the server knows."""
    kind_options: Mapping[str, dict[str, Any]] = {}
    """Each kind's option of ``propose``'s ``policy`` schema, by name."""
    currency: str = "none"
    """The currency whose minor units reasons quote, as summaries show them (``none``: as
    recorded)."""

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
        offered = getattr(self, "offered", None)
        if who is not None and who.role == "agent" and offered is not None:
            tools = _offered_tools(tools, await offered(who), getattr(self, "kind_options", {}))
        return ListToolsResult(tools=tools)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> Any:
        tool = self._tool_manager.get_tool(name)
        if tool is None:
            # The spec's answer to an unknown tool: a JSON-RPC error, invalid params.
            raise MCPError(
                INVALID_PARAMS,
                f"no tool {_shown(name)!r}",
                {"reason_code": str(ReasonCode.SCHEMA_INVALID), "field": "name"},
            )
        if context is None:
            context = Context(mcp_server=self)
        try:
            allowed(self.identity, getattr(self, "roles", {}).get(name), context, name)
        except ToolRefused as exc:
            return refused(str(exc.code), exc.detail, exc.field, self.currency)
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

    async def get_prompt(
        self, name: str, arguments: dict[str, Any] | None = None, context: Any = None
    ) -> Any:
        """Render a prompt; an unknown one or a bad argument is a JSON-RPC error with a code.

        The SDK answers an unknown prompt with error code 0 and logs a traceback; the
        spec asks for -32602 (invalid params). Every argument is text (prompts take
        strings only), checked as free text, so no lone surrogate reaches the prompt.
        """
        prompt = self._prompt_manager.get_prompt(name)
        if prompt is None:
            raise MCPError(
                INVALID_PARAMS,
                f"no prompt {_shown(name)!r}",
                {"reason_code": str(ReasonCode.SCHEMA_INVALID), "field": "name"},
            )
        declared = {a.name: a for a in prompt.arguments or []}
        for key, value in (arguments or {}).items():
            problem = (
                f"{name} takes no argument {_shown(key)!r}"
                if key not in declared
                else free_text_problem(value)
                if isinstance(value, str)
                else "not text"
            )
            if problem is not None:
                raise MCPError(
                    INVALID_PARAMS,
                    problem,
                    {"reason_code": str(ReasonCode.SCHEMA_INVALID), "field": _shown(key)},
                )
        for arg in declared.values():
            if arg.required and arg.name not in (arguments or {}):
                raise MCPError(
                    INVALID_PARAMS,
                    f"{name} needs {arg.name}",
                    {"reason_code": str(ReasonCode.SCHEMA_INVALID), "field": arg.name},
                )
        try:
            return await super().get_prompt(name, arguments, context)
        except ValueError as exc:
            # What the prompt's own validation refuses (a k that is not a number).
            log.info("MCP prompt %r refused: %s", name, type(exc.__cause__).__name__)
            raise MCPError(
                INVALID_PARAMS,
                f"{name}: arguments do not validate",
                {"reason_code": str(ReasonCode.SCHEMA_INVALID)},
            ) from None


def _offered_tools(tools: list[Tool], offer: Any, options: Mapping[str, Any]) -> list[Tool]:
    """``tools`` as an agent is offered them: its kinds' tools, ``propose`` its kinds only."""
    hidden = offer.hidden()
    shown = []
    for tool in tools:
        if tool.name in hidden:
            continue
        if tool.name == "propose" and options:
            schema = dict(tool.input_schema)
            properties = dict(schema.get("properties", {}))
            policy = dict(properties.get("policy", {}))
            policy["anyOf"] = [options[k] for k in sorted(options) if k in offer.kinds]
            properties["policy"] = policy
            schema["properties"] = properties
            tool = tool.model_copy(update={"input_schema": schema})
        shown.append(tool)
    return shown


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
        refused = _refusal_of(name, value, rule, strict)
        if refused is not None:
            return refused
    return None


def _refusal_of(name: str, value: Any, rule: Rule | None, strict: bool) -> ToolRefused | None:
    """The refusal of one argument's value, or None (see :func:`argument_refusal`)."""
    if isinstance(value, str):
        problem = (free_text_problem if rule is Rule.TEXT else id_problem)(value)
        if problem is not None:
            return ToolRefused(ReasonCode.SCHEMA_INVALID, problem, name)
        return None
    refused = _rule_refusal(name, value, rule, strict)
    if refused is not None:
        return refused
    # Whatever goes on into a proposal or a row: no lone surrogate, however deep.
    found = value_problem(value)
    if found is not None:
        path, problem = found
        field = name if path == "$" else f"{name}.{path}" if path[0] != "[" else name + path
        return ToolRefused(ReasonCode.SCHEMA_INVALID, problem, field)
    return None


def _rule_refusal(name: str, value: Any, rule: Rule | None, strict: bool) -> ToolRefused | None:
    """The refusal of a value that is not a string by its parameter's rule, or None."""
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


READ = ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
"""A read of the journal's projections: changes nothing, safe to call again."""
PROPOSE = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)
"""A proposal the kernel judges and records: it adds to the record, never removes."""
ACT = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False
)
"""An operator's act that replaces or ends something (a rule, a flow, an agent's status)."""
EFFECT = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=True
)
"""A proposal or decision whose accepted action an executor carries out in the world."""


def described(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """Split ``fn``'s Google-style docstring into its description and its ``Args:``.

    Returns the text before ``Args:`` (what the tool does) and each argument's
    description by name (continuation lines joined).

    Raises:
        ValueError: an argument of ``fn`` (but the principal) has no description.
    """
    doc = inspect.cleandoc(fn.__doc__ or "")
    head, _, tail = doc.partition("\nArgs:\n")
    args: dict[str, str] = {}
    name = ""
    for line in tail.splitlines():
        if line and not line[0].isspace():
            break  # the next section (Returns:, Raises:)
        text = line.strip()
        key, colon, rest = text.partition(":")
        if colon and key.isidentifier() and line.startswith("    ") and line[4] != " ":
            name, args[key] = key, rest.strip()
        elif name and text:
            args[name] += " " + text
    params = list(inspect.signature(fn).parameters)[1:]
    missing = [p for p in params if not args.get(p)]
    if missing:
        raise ValueError(f"tool {fn.__name__}: no description in Args: for {', '.join(missing)}")
    return head.strip(), args


def registrar(server: MCPServer[Any], identity: Identity) -> Callable[..., Register]:
    """Return ``tool(role, title=..., hints=...)``: a decorator that adds a tool to ``server``.

    The decorated coroutine takes the calling :class:`Principal` first and answers
    an :class:`Answer`; its docstring describes the tool and, under ``Args:``, every
    argument (a tool with an undescribed argument is refused here, when the server is
    built). ``title`` is what a host shows; ``hints`` its annotations (:data:`READ`,
    :data:`PROPOSE`, :data:`ACT`, :data:`EFFECT`). The tool checks the caller's role
    (None: anyone) and each argument by the Rule its annotation carries, and answers
    a refusal, a stopped kernel or a fault as an ERROR answer.
    """

    def tool(role: str | None, *, title: str, hints: ToolAnnotations) -> Register:

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            rules = _rules_of(fn)
            strict = role != "agent"
            description, params = described(fn)
            if isinstance(server, CodedServer):
                server.identity = identity
                server.roles = {**getattr(server, "roles", {}), fn.__name__: role}

            async def run(ctx: Context[Any, Any], **kw: Any) -> CallToolResult:
                currency = getattr(server, "currency", "none")
                try:
                    who = allowed(identity, role, ctx, fn.__name__)
                    bad = argument_refusal(rules, kw, strict=strict)
                    if bad is not None:
                        raise bad
                    answer = await fn(who, **kw)
                except ToolRefused as exc:
                    return refused(str(exc.code), exc.detail, exc.field, currency)
                except KernelShutdown as exc:
                    # Not a reason code of a decision: the StopReason says why it stopped.
                    why = f"the kernel stopped: {exc.detail}"
                    return refused(str(exc.reason), why, currency=currency)
                except Exception as exc:
                    # Fail clear: the caller gets a code, the log the traceback, the kernel runs on.
                    log.exception("MCP tool %s failed", fn.__name__)
                    return refused(ReasonCode.KERNEL_FAULT, f"{fn.__name__}: {type(exc).__name__}")
                return reply(answer, currency)

            run.__signature__ = _signature(fn)  # type: ignore[attr-defined]
            run.__name__ = fn.__name__
            run.__doc__ = description
            server.add_tool(
                run,
                name=fn.__name__,
                title=title,
                description=description,
                annotations=hints.model_copy(update={"title": title}),
            )
            added = server._tool_manager.get_tool(fn.__name__)
            if added is not None:
                # The SDK describes no argument; a host's model reads these to fill them in.
                properties = added.parameters.get("properties", {})
                for name, text in params.items():
                    if name in properties:
                        properties[name] = {**properties[name], "description": text}
                        properties[name].pop("title", None)
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
