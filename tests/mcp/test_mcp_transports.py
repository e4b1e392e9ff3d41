"""``dirk mcp`` as hosts launch it: a stdio subprocess, and streamable HTTP with bearer tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support import SUPPORT
from tests.support.mcp_kernel import require_mcp

require_mcp()

from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402

from kernel.audit import open_journal  # noqa: E402
from kernel.cli import main  # noqa: E402
from kernel.mcp import Follower, Identity, Principal, build_server  # noqa: E402

AGENT_TOKEN = "agent-token-0123456789abcdef"
OPERATOR_TOKEN = "operator-token-0123456789abcdef"


async def new_journal(path: Path) -> Path:
    async with open_journal(path):
        pass
    return path


async def test_stdio_subprocess_proposes_through_a_kernel_it_opens(tmp_path: Path) -> None:
    db = await new_journal(tmp_path / "j.db")
    command = [sys.executable, "-m", "kernel", "mcp", "--db", str(db), "--kernel", "--agent", "ide"]
    params = StdioServerParameters(command=command[0], args=command[1:])
    async with Client(params) as c:
        result = await c.call_tool("add_fact", {"name": "lang", "value": "python"})
        assert result.structured_content is not None
        assert result.structured_content["verdict"] == "ACCEPTED"
        refused = await c.call_tool("list_escalations", {})
        assert refused.is_error
    async with open_journal(db, readonly=True) as journal:
        [fact] = await journal.read(types=["FactAdded"])
        [stopped] = await journal.read(types=["KernelStopped"])
    assert fact.agent_id == "ide" and stopped.seq > fact.seq


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``dirk mcp --kernel --http 127.0.0.1:0`` with a token file; yields its URL and journal."""
    db = anyio.run(new_journal, tmp_path / "j.db")
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# who may call\nagent:ide {AGENT_TOKEN}\noperator:rui {OPERATOR_TOKEN}\n")
    command = [sys.executable, "-m", "kernel", "mcp", "--db", str(db), "--kernel"]
    command += ["--http", "127.0.0.1:0", "--token-file", str(tokens)]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # the server prints its URL once the port is bound
        assert "serving http://" in line, line
        yield line.split()[-1], db
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
        # Tokens are never logged, whatever happened.
        assert AGENT_TOKEN not in err + line and OPERATOR_TOKEN not in err + line


@asynccontextmanager
async def over_http(url: str, token: str) -> AsyncIterator[Client]:
    """An SDK client whose requests carry ``token`` (the SDK leaves a given client open)."""
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


async def content(c: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await c.call_tool(tool, args)
    assert result.structured_content is not None
    return dict(result.structured_content)


def test_http_with_tokens(http_server: tuple[str, Path]) -> None:
    url, _ = http_server

    async def drive() -> None:
        async with over_http(url, AGENT_TOKEN) as agent:
            fact = await content(agent, "add_fact", name="lang", value="python")
            assert fact["verdict"] == "ACCEPTED"
            # An agent token is refused on operator tools, whatever it claims.
            refused = await content(agent, "list_escalations")
            assert refused["verdict"] == "ERROR" and refused["reason_code"] == "UNAUTHORIZED"
            status = await content(agent, "agent_status", agent_id="ide", status="RETIRED")
            assert status["reason_code"] == "UNAUTHORIZED"
        async with over_http(url, OPERATOR_TOKEN) as operator:
            listed = await content(operator, "list_escalations")
            assert listed["verdict"] == "OK"
            assert (await content(operator, "get_memory_context"))["result"]["facts"] == {
                "lang": "python"
            }
        # Without a known token the request stops at the SDK's bearer check: 401, no tool
        # runs, and the answer names the server's protected-resource metadata (RFC 9728).
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        metadata = url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
        for token in (None, "agent-token-guessed-wrongly", AGENT_TOKEN[:-1]):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with create_mcp_http_client(headers=headers) as http:
                response = await http.post(url, json=call)
            assert response.status_code == 401
            assert response.json()["error"] == "invalid_token"
            assert response.json()["reason_code"] == "UNAUTHORIZED"
            challenge = response.headers["www-authenticate"]
            assert (
                challenge.startswith("Bearer ") and f'resource_metadata="{metadata}"' in challenge
            )
        # The metadata is public: what this resource is and how a token is presented.
        async with create_mcp_http_client() as http:
            document = (await http.get(metadata)).json()
            assert document["resource"] == url
            assert document["bearer_methods_supported"] == ["header"]
            # The operator provisions the tokens: no authorization server is named, none runs.
            assert "authorization_servers" not in document
            # No OAuth server behind it: a host that tries one is told why, and stops.
            for path in ("/.well-known/oauth-authorization-server", "/register", "/authorize"):
                answer = await http.post(url.replace("/mcp", path), json={})
                assert answer.status_code == 404
                assert "operator" in answer.json()["error_description"]

    anyio.run(drive)


def test_a_public_bind_without_a_token_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = anyio.run(new_journal, tmp_path / "j.db")
    status = main(["mcp", "--db", str(db), "--agent", "ide", "--http", "0.0.0.0:8765"])
    assert status == 2
    assert "without --token-file" in capsys.readouterr().err


def test_a_short_token_is_refused_and_not_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = anyio.run(new_journal, tmp_path / "j.db")
    tokens = tmp_path / "tokens"
    tokens.write_text("agent:ide shorty\n")
    status = main(["mcp", "--db", str(db), "--http", "127.0.0.1:0", "--token-file", str(tokens)])
    assert status == 2
    err = capsys.readouterr().err
    assert "at least 16" in err and "shorty" not in err


def test_a_follower_proposes_through_the_inbox_of_a_kernel_in_another_process(
    tmp_path: Path,
) -> None:
    db = anyio.run(new_journal, tmp_path / "j.db")
    command = [sys.executable, "-m", "tests.support.memory_kernel_process", str(db)]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.stdout.close()

        async def drive() -> None:
            follower = Follower(str(db), wait_s=60, poll_s=0.05)
            agent = Principal(role="agent", name="ide")
            async with Client(build_server(follower, Identity(agent))) as c:
                fact = await content(c, "add_fact", name="lang", value="python")
                assert fact["verdict"] == "ACCEPTED" and fact["status"] == "CLOSED"
                await content(c, "add_constraint", text="never use eval()")
                refused = await content(c, "record_decision", text="parse it with eval()")
                assert refused["verdict"] == "REJECTED"
                assert refused["reason_code"] == "CONSTRAINT_VIOLATION"
                unknown = Principal(role="agent", name="stranger")
            async with Client(build_server(follower, Identity(unknown))) as c:
                stranger = await content(c, "add_fact", name="a", value="b")
                assert stranger["verdict"] == "ERROR"
                assert stranger["reason_code"] == "UNKNOWN_AGENT"
            async with Client(build_server(follower, Identity(agent))) as c:
                context = await content(c, "get_memory_context")
                assert context["result"]["facts"] == {"lang": "python"}

        anyio.run(drive)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)
    assert proc.returncode == 0


def test_an_mcp_1x_client_over_stdio(tmp_path: Path) -> None:
    """Hosts in the field speak mcp 1.x; mcp 1 and 2 cannot share one environment, so the
    1.x client runs in the Python that ``DIRK_MCP1_PYTHON`` names (one with ``mcp<2``)."""
    python = os.environ.get("DIRK_MCP1_PYTHON")
    if not python:
        pytest.skip("set DIRK_MCP1_PYTHON to a Python with mcp<2 installed (mcp==1.30.0)")
    db = anyio.run(new_journal, tmp_path / "j.db")
    client = SUPPORT / "mcp1_client.py"
    done = subprocess.run(
        [python, str(client), str(db), sys.executable],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["protocol"] == "2025-11-25"
    assert answer["fact"]["verdict"] == "ACCEPTED"
    assert answer["memory"]["result"]["facts"] == {"lang": "python"}


async def test_following_with_a_pack_puts_its_kinds_in_proposes_schema(tmp_path: Path) -> None:
    db = await new_journal(tmp_path / "j.db")
    args = ["-m", "kernel", "mcp", "--db", str(db), "--agent", "ide", "--pack", "policies.booking"]
    async with Client(StdioServerParameters(command=sys.executable, args=args)) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    defs = tools["propose"].input_schema["$defs"]
    assert {"ReserveRoom", "AddFact"} <= set(defs)


def test_packs_dirk_mcp_cannot_serve_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = anyio.run(new_journal, tmp_path / "j.db")
    assert main(["mcp", "--db", str(db), "--operator", "rui", "--pack", "no_such_pack"]) == 2
    assert "BAD_PACK_PATH" in capsys.readouterr().err
    # With the kernel inside, a pack whose adapter is not built in cannot be served.
    status = main(
        ["mcp", "--db", str(db), "--kernel", "--agent", "ide", "--pack", "policies.booking"]
    )
    assert status == 2
    assert "no adapter registered for hotel" in capsys.readouterr().err
