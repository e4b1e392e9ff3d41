"""Hostile arguments to every MCP tool, in process (beside a kernel, following a journal) and
over HTTP to a real ``dirk mcp``: every refusal carries a code, no fault, the kernel runs on.

Strings come from tests/support/hostile.py: lone surrogates, C0/C1 controls, DEL,
terminal escapes. The tools and their arguments are read from the server itself
(each tool's input schema and role), so a tool added later is covered too. What
must hold for every call: a structured answer; a reason code on every ERROR,
REJECTED or REFUSED; never KERNEL_FAULT; and whenever a caller allowed to use the
tool sends a string argument with a lone surrogate or a control character other
than tab and line breaks (or a lone surrogate anywhere in an object), the answer
is ERROR with SCHEMA_INVALID. Afterwards the kernel still runs, a good call still
succeeds, nothing was logged as a failure and the journal verifies; following a
journal, no inbox row holds a string that is not UTF-8.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.hostile import hostile_scalars, hostile_text, hostile_values, is_utf8
from tests.support.mcp_kernel import memory_kernel, require_mcp

require_mcp()

import httpx2  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402
from mcp_types import CallToolResult  # noqa: E402

from kernel.audit import open_journal, verify_journal  # noqa: E402
from kernel.core.reasons import CliError, ReasonCode, StopReason  # noqa: E402
from kernel.journal.inbox_store import open_inbox  # noqa: E402
from kernel.mcp import Embedded, Follower, Identity, Principal, build_server  # noqa: E402
from kernel.mcp._tools import CodedServer  # noqa: E402

CODES = {str(c) for c in ReasonCode} | {str(c) for c in CliError} | {str(c) for c in StopReason}
VERDICTS = {"ACCEPTED", "REJECTED", "ESCALATED", "APPLIED", "QUEUED", "REFUSED", "OK", "ERROR"}
FORBIDDEN = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
"""What no string argument may hold, whatever its rule (ids refuse tab and line breaks too)."""
AGENT = Principal(role="agent", name="ide")
OPERATOR = Principal(role="operator", name="rui")
AGENT_TOKEN = "agent-token-0123456789abcdef"
OPERATOR_TOKEN = "operator-token-0123456789abcdef"


def catalogue() -> tuple[dict[str, dict[str, Any]], dict[str, str | None]]:
    """Each tool's input schema, and its role (None: anyone), read from a built server."""
    server = build_server(Follower(":memory:"), Identity(AGENT))
    assert isinstance(server, CodedServer)
    schemas = {t.name: t.parameters for t in server._tool_manager.list_tools()}
    return schemas, dict(server.roles)


SCHEMAS, ROLES = catalogue()
PLAUSIBLE = ["ide", "rui", "approve", "reject", "required", "ACTIVE", "r1", "memory.add_fact"]


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type", "object" if "anyOf" in schema else "string")
    return set(kind) if isinstance(kind, list) else {kind}


def argument(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A value for an argument: mostly of its declared type, hostile; sometimes anything."""
    kinds = _types(schema)
    typed: list[st.SearchStrategy[Any]] = []
    if "string" in kinds:
        typed += [hostile_text(max_size=30), st.sampled_from(PLAUSIBLE)]
    if kinds & {"integer", "number"}:
        typed += [st.integers(min_value=0, max_value=50), hostile_scalars()]
    if "array" in kinds:
        typed += [st.lists(st.one_of(hostile_text(max_size=12), st.integers()), max_size=4)]
    if "object" in kinds:
        policy = st.fixed_dictionaries(
            {"kind": st.sampled_from(["memory.add_fact", "memory.query"])},
            optional={"name": hostile_text(max_size=12), "value": hostile_values(max_leaves=4)},
        )
        typed += [policy, hostile_values(max_leaves=8)]
    return st.one_of(*typed, hostile_values(max_leaves=3))


@st.composite
def calls(draw: st.DrawFn) -> tuple[Principal, str, dict[str, Any]]:
    tool = draw(st.sampled_from(sorted(SCHEMAS)))
    schema = SCHEMAS[tool]
    properties: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))
    names = [n for n in properties if n in required or draw(st.booleans())]
    if names and draw(st.integers(0, 9)) == 0:
        names.remove(draw(st.sampled_from(names)))  # a required one may go missing
    args = {name: draw(argument(properties[name])) for name in names}
    if draw(st.integers(0, 9)) == 0:
        args[draw(hostile_text(min_size=1, max_size=8))] = draw(hostile_scalars())
    # Mostly a caller the tool is for, sometimes the other kind.
    fitting = OPERATOR if ROLES.get(tool) == "operator" else AGENT
    who = draw(st.sampled_from([fitting, fitting, fitting, AGENT, OPERATOR]))
    return who, tool, args


def bad_text(tool: str, args: dict[str, Any]) -> bool:
    """Whether a well-formed call carries a string the text rule refuses."""
    properties = SCHEMAS[tool].get("properties", {})
    if set(args) - set(properties) or set(SCHEMAS[tool].get("required", [])) - set(args):
        return False  # refused for its names first (SCHEMA_INVALID too)
    for value in args.values():
        if isinstance(value, str) and (not is_utf8(value) or FORBIDDEN.search(value)):
            return True
        if isinstance(value, (dict, list)) and not all(is_utf8(s) for s in strings(value)):
            return True
    return False


def strings(value: Any) -> Iterator[str]:
    """Every string (key or value) in a free-form value."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for key, inner in item.items():
                if isinstance(key, str):
                    yield key
                stack.append(inner)
        elif isinstance(item, list):
            stack.extend(item)


def check(who: Principal, tool: str, args: dict[str, Any], body: dict[str, Any] | None) -> None:
    """What every answer must be."""
    assert body is not None, (tool, args)
    assert body["verdict"] in VERDICTS, body
    if body["verdict"] in ("ERROR", "REJECTED", "REFUSED"):
        assert body["reason_code"] in CODES, body
    assert body["reason_code"] != "KERNEL_FAULT", (tool, args, body)
    allowed = ROLES.get(tool) in (None, who.role)
    if allowed and bad_text(tool, args):
        assert body["verdict"] == "ERROR", (tool, args, body)
        assert body["reason_code"] == "SCHEMA_INVALID", (tool, args, body)


def failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


# --- in process ----------------------------------------------------------------------------


async def called(server: Any, tool: str, args: dict[str, Any]) -> CallToolResult:
    """Call a tool where the SDK's dispatch calls it (``MCPServer.call_tool``).

    An in-process client cannot send every hostile value (it encodes each request as
    JSON, and refuses a key holding a lone surrogate), but code embedding the server,
    or another transport, may hand the server any Python value.
    """
    result = await server.call_tool(tool, args)
    assert isinstance(result, CallToolResult)
    return result


@settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(calls(), min_size=1, max_size=4))
def test_beside_a_kernel_any_arguments_get_a_coded_answer_and_the_kernel_runs_on(
    caplog: pytest.LogCaptureFixture, sequence: list[tuple[Principal, str, dict[str, Any]]]
) -> None:
    async def scenario(path: Path) -> None:
        async with memory_kernel(path) as kernel:
            backend = Embedded(kernel)
            for who, tool, args in sequence:
                result = await called(build_server(backend, Identity(who)), tool, args)
                check(who, tool, args, result.structured_content)
                assert result.is_error == ((result.structured_content or {})["verdict"] == "ERROR")
            assert kernel.stopped is None
            async with Client(build_server(backend, Identity(AGENT))) as c:
                good = await c.call_tool("add_fact", {"name": "lang", "value": "python"})
            assert (good.structured_content or {})["verdict"] == "ACCEPTED"
        assert (await verify_journal(path)).ok

    caplog.set_level(logging.INFO)
    caplog.clear()
    with tempfile.TemporaryDirectory() as tmp:
        anyio.run(scenario, Path(tmp) / "j.db")
    assert failures(caplog) == []


def inbox_strings(db: Path) -> list[str]:
    with open_inbox(str(db), readonly=True) as store:
        rows = store.rows(pending=False)
    found = []
    for row in rows:
        # The stdlib reads "\\ud800" escapes back as lone surrogates: what a kernel would read.
        found += list(strings(json.loads(row.body)))
    return found


@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(calls(), min_size=1, max_size=4))
def test_following_a_journal_no_inbox_row_holds_what_a_journal_cannot(
    caplog: pytest.LogCaptureFixture, sequence: list[tuple[Principal, str, dict[str, Any]]]
) -> None:
    async def scenario(path: Path) -> None:
        async with open_journal(path):
            pass
        # No kernel takes the rows: a proposal answers QUEUED at once.
        backend = Follower(str(path), wait_s=0.0, poll_s=0.001, answer_s=0.0)
        for who, tool, args in sequence:
            result = await called(build_server(backend, Identity(who)), tool, args)
            check(who, tool, args, result.structured_content)

    caplog.set_level(logging.INFO)
    caplog.clear()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "j.db"
        anyio.run(scenario, db)
        assert all(is_utf8(s) for s in inbox_strings(db))
    assert failures(caplog) == []


async def test_a_numeric_dfid_is_a_clean_error_with_a_code(tmp_path: Path) -> None:
    """The audit's KERNEL_FAULT (and logged traceback) for a dfid sent as a number."""
    async with open_journal(tmp_path / "j.db"):
        pass
    async with memory_kernel(tmp_path / "k.db") as kernel:
        for backend in (Follower(str(tmp_path / "j.db"), answer_s=0.0), Embedded(kernel)):
            async with Client(build_server(backend, Identity(OPERATOR))) as c:
                for dfid in (5, 2**70, 1.5, None, ["x"], {"a": 1}):
                    result = await c.call_tool(
                        "decide", {"dfid": dfid, "decision": "reject", "reason": "r"}
                    )
                    body = result.structured_content or {}
                    assert result.is_error and body["reason_code"] == "SCHEMA_INVALID", body
                    assert body["field"] == "dfid"
        assert kernel.stopped is None


async def test_the_sdks_own_validation_answers_with_a_code(tmp_path: Path) -> None:
    """Missing and undeclared arguments, an unknown tool: once bare text, now coded."""
    async with memory_kernel(tmp_path / "k.db") as kernel:
        async with Client(build_server(Embedded(kernel), Identity(OPERATOR))) as c:
            cases: list[tuple[str, dict[str, Any], str]] = [
                ("decide", {}, "dfid"),
                ("decide", {"dfid": "x", "decision": "reject"}, "reason"),
                ("review", {"dfid": "x", "dfdi": "y"}, "dfdi"),
                ("review", {"dfid": "x", "ctx": 1}, "ctx"),
            ]
            for tool, args, field in cases:
                result = await c.call_tool(tool, args)
                body = result.structured_content or {}
                assert result.is_error, (tool, args, result)
                assert body["reason_code"] == "SCHEMA_INVALID" and body["field"] == field, body
            # An unknown tool is the spec's JSON-RPC error: -32602, invalid params.
            with pytest.raises(MCPError) as raised:
                await c.call_tool("no_such_tool", {})
            assert raised.value.error.code == -32602
            assert raised.value.error.data == {"reason_code": "SCHEMA_INVALID", "field": "name"}


# --- over HTTP --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``dirk mcp --kernel --http 127.0.0.1:0`` with tokens for an agent and an operator."""
    where = tmp_path_factory.mktemp("mcp-hostile")

    async def make() -> Path:
        async with open_journal(where / "j.db"):
            pass
        return where / "j.db"

    db = anyio.run(make)
    tokens = where / "tokens"
    tokens.write_text(f"agent:ide {AGENT_TOKEN}\noperator:rui {OPERATOR_TOKEN}\n")
    command = [sys.executable, "-m", "kernel", "mcp", "--db", str(db), "--kernel"]
    command += ["--http", "127.0.0.1:0", "--token-file", str(tokens)]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "serving http://" in line, line
        yield line.split()[-1], db
        assert proc.poll() is None  # alive after everything the tests sent
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "Exception" not in err, err
    assert anyio.run(verify_journal, db).ok


def post(url: str, who: Principal, tool: str, args: dict[str, Any]) -> httpx2.Response:
    token = AGENT_TOKEN if who.role == "agent" else OPERATOR_TOKEN
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    call["params"] = {"name": tool, "arguments": args}
    # As a client in another language might: surrogates as \\ud800 escapes, controls as \\u0001.
    body = json.dumps(call, default=repr).encode()
    headers = {
        "authorization": f"Bearer {token}",
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
    }
    return httpx2.post(url, content=body, headers=headers, timeout=60)


def answered(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC message of a response (JSON, or the data line of one server-sent event)."""
    text = response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        text = next(line[5:] for line in text.splitlines() if line.startswith("data:"))
    return dict(json.loads(text))


@settings(
    max_examples=80,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(call=calls())
def test_over_http_no_5xx_a_code_on_every_refusal(
    http_server: tuple[str, Path], call: tuple[Principal, str, dict[str, Any]]
) -> None:
    url, _ = http_server
    who, tool, args = call
    response = post(url, who, tool, args)
    assert response.status_code < 500, response.text
    message = answered(response)
    if "error" in message:
        # A protocol refusal (JSON that does not parse: a lone surrogate's escape), with its code.
        assert response.status_code == 400 and message["error"]["code"] == -32700, message
        assert message["error"]["data"]["reason_code"] == "SCHEMA_INVALID", message
        assert any(not is_utf8(s) for s in strings(args)) or not is_utf8(tool), args
        return
    result = message["result"]
    check(who, tool, args, result.get("structuredContent"))
    assert result.get("isError", False) == (result["structuredContent"]["verdict"] == "ERROR")


def test_over_http_a_good_call_still_succeeds_after_the_hostile_ones(
    http_server: tuple[str, Path],
) -> None:
    url, _ = http_server
    message = answered(post(url, AGENT, "add_fact", {"name": "lang", "value": "python"}))
    assert message["result"]["structuredContent"]["verdict"] == "ACCEPTED"
