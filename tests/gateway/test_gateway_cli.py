"""``dirk mcp proxy`` as hosts launch it: a stdio subprocess, and streamable HTTP with tokens.

The gateway runs as its own process here, in front of the upstream it starts; its
clients authenticate as ``dirk mcp``'s do (the stdio ``--agent``; a bearer token per
agent over HTTP). The attacker is a real HTTP client with no token.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from kernel.audit import open_journal
from kernel.cli import main
from kernel.gateway import UpstreamDown, config_of
from tests.gateway.support import UPSTREAM, Upstream, body, gateway, meta, upstream_in
from tests.support.sigterm import exits_on_sigterm

TOKEN = "gateway-agent-token-0123456789"


def write_config(tmp: Path, up: Upstream) -> Path:
    """The gateway's TOML file over the upstream as a stdio command."""
    config = tmp / "gateway.toml"
    config.write_text(
        f"""
max_attempts = 3

[upstreams.notes]
command = [{sys.executable!r}, {str(UPSTREAM)!r}]
env = {{ UPSTREAM_LOG = {str(up.log)!r} }}

[tools."notes.add_note"]
impact = "LOW_IMPACT"
""",
        encoding="utf-8",
    )
    return config


async def new_journal(path: Path) -> Path:
    async with open_journal(path):
        pass
    return path


async def test_stdio_serves_the_governed_tools_as_the_agent(tmp_path: Path) -> None:
    up = upstream_in(tmp_path)
    config = write_config(tmp_path, up)
    db = tmp_path / "j.db"  # none yet: the gateway creates its journal on first use
    listing = tmp_path / "listing.json"
    args = ["-m", "kernel", "mcp", "proxy", "--config", str(config), "--db", str(db)]
    args += ["--listing", str(listing)]
    params = StdioServerParameters(command=sys.executable, args=[*args, "--agent", "ide"])
    async with Client(params) as c:
        names = [tool.name for tool in (await c.list_tools()).tools]
        result = await c.call_tool("notes_add_note", {"text": "over stdio"})
    assert names == ["notes_add_note", "wait_flow"]
    assert not result.is_error and result.content[0].text == "note 1: over stdio"  # type: ignore[union-attr]
    async with open_journal(db, readonly=True) as journal:
        [done] = await journal.read(types=["ExecutionSucceeded"])
        stopped = await journal.read(types=["KernelStopped"])
    assert done.agent_id == "ide" and stopped
    assert len(up.calls()) == 1
    # The verdicts judge again with the pack made from the config and the saved listing.
    pack_file = tmp_path / "gateway_pack.py"
    pack_file.write_text(
        f"from kernel.gateway import pack_of\nPACK = pack_of({str(config)!r}, {str(listing)!r})\n"
    )
    verify = ["verify", "--db", str(db), "--verdicts", "--pack", f"{pack_file}:PACK"]
    assert await anyio.to_thread.run_sync(main, verify) == 0
    # Another listing makes another pack, whose hash no verdict recorded: verify says so.
    listing.write_text(listing.read_text().replace("Add a note with a tag.", "Add a note."))
    assert await anyio.to_thread.run_sync(main, verify) == 1


@pytest.fixture
def http_gateway(tmp_path: Path) -> Iterator[tuple[str, Path, Upstream]]:
    """``dirk mcp proxy --http 127.0.0.1:0 --token-file``; yields its URL, journal, upstream."""
    up = upstream_in(tmp_path)
    config = write_config(tmp_path, up)
    db = anyio.run(new_journal, tmp_path / "j.db")
    tokens = tmp_path / "tokens"
    tokens.write_text(f"agent:ide {TOKEN}\n")
    command = [sys.executable, "-m", "kernel", "mcp", "proxy", "--config", str(config)]
    command += ["--db", str(db), "--http", "127.0.0.1:0", "--token-file", str(tokens)]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        lines = [proc.stderr.readline(), proc.stderr.readline()]
        assert "governing notes.add_note" in lines[0], lines
        assert "serving http://" in lines[1], lines
        yield lines[1].split()[-1], db, up
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
        assert TOKEN not in err + "".join(lines)  # a token is never logged


@asynccontextmanager
async def over_http(url: str, token: str) -> AsyncIterator[Client]:
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


async def test_http_needs_an_agents_token_and_the_attacker_changes_nothing(
    http_gateway: tuple[str, Path, Upstream],
) -> None:
    url, db, up = http_gateway
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "notes_add_note", "arguments": {"text": "stolen"}},
    }
    headers = {"Accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient(timeout=30) as attacker:
        bare = await attacker.post(url, json=call, headers=headers)
        forged = await attacker.post(
            url, json=call, headers={**headers, "Authorization": "Bearer not-the-token-at-all"}
        )
    assert bare.status_code == 401 and forged.status_code == 401
    # The SDK's bearer check, as `dirk mcp --http` answers: the 401 names its metadata.
    assert bare.json()["error"] == "invalid_token"
    assert "resource_metadata" in bare.headers["www-authenticate"]
    # The gateway serves its agent as before; the attacker's call reached nothing.
    async with over_http(url, TOKEN) as c:
        result = await c.call_tool(
            "notes_add_note",
            {"text": "mine"},
            meta=meta("c", "1"),
        )
    assert not result.is_error, result
    assert [c["args"]["text"] for c in up.calls()] == ["mine"]
    async with open_journal(db, readonly=True) as journal:
        proposals = await journal.read(types=["ProposalSubmitted"])
    assert [e.agent_id for e in proposals] == ["ide"]


def test_a_config_that_cannot_be_used_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = anyio.run(new_journal, tmp_path / "j.db")
    bad = tmp_path / "bad.toml"
    bad.write_text('[upstreams.notes]\nurl = "ftp://x"\n')
    status = main(["mcp", "proxy", "--config", str(bad), "--db", str(db), "--agent", "ide"])
    err = capsys.readouterr().err
    assert status == 2 and "error: BAD_ARGUMENT:" in err and "http:// or https://" in err
    assert "Traceback" not in err


def test_an_upstream_down_at_start_is_a_clear_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = anyio.run(new_journal, tmp_path / "j.db")
    down = tmp_path / "down.toml"
    down.write_text('[upstreams.notes]\nurl = "http://127.0.0.1:9/mcp"\nconnect_s = 5\n')
    status = main(["mcp", "proxy", "--config", str(down), "--db", str(db), "--agent", "ide"])
    err = capsys.readouterr().err
    assert status == 1 and "upstream notes cannot be reached" in err
    assert "Traceback" not in err


@pytest.fixture
def dirk_upstream(tmp_path: Path) -> Iterator[str]:
    """``dirk mcp --kernel --http`` behind a token file: an upstream that wants a bearer token."""
    db = anyio.run(new_journal, tmp_path / "upstream.db")
    tokens = tmp_path / "upstream-tokens"
    tokens.write_text(f"agent:gw {TOKEN}\n")
    command = [sys.executable, "-m", "kernel", "mcp", "--db", str(db), "--kernel"]
    command += ["--http", "127.0.0.1:0", "--token-file", str(tokens)]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "serving http://" in line, line
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


async def test_the_gateway_authenticates_to_an_upstream_as_its_clients_do(
    dirk_upstream: str, tmp_path: Path
) -> None:
    """The upstream is dirk's own MCP server: the gateway sends the bearer token it wants."""
    tool = {"tools": {"dirk.query_memory": {"impact": "LOW_IMPACT"}}}
    without = config_of({"upstreams": {"dirk": {"url": dirk_upstream}}, **tool})
    with pytest.raises(UpstreamDown, match="upstream dirk"):
        async with gateway(without, await new_journal(tmp_path / "a.db")):
            pass
    headers = {"Authorization": f"Bearer {TOKEN}"}
    spec = {"url": dirk_upstream, "headers": headers}
    config = config_of({"upstreams": {"dirk": spec}, **tool})
    async with gateway(config, await new_journal(tmp_path / "b.db")) as gw:
        async with Client(gw.server) as c:
            result = await c.call_tool("dirk_query_memory", {"topic": "rooms"})
    assert not result.is_error, result
    # The upstream's own kernel judged it too, as its agent "gw": governed twice, recorded twice.
    assert body(result)["verdict"] == "ACCEPTED"


def test_sigterm_stops_it_while_a_refused_client_holds_its_connection(tmp_path: Path) -> None:
    up = upstream_in(tmp_path)
    config = write_config(tmp_path, up)
    db = anyio.run(new_journal, tmp_path / "j.db")
    tokens = tmp_path / "tokens"
    tokens.write_text(f"agent:ide {TOKEN}\n")
    command = [sys.executable, "-m", "kernel", "mcp", "proxy", "--config", str(config)]
    command += ["--db", str(db), "--http", "127.0.0.1:0", "--token-file", str(tokens)]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        lines = [proc.stderr.readline(), proc.stderr.readline()]
        assert "serving http://" in lines[1], lines
        # Refused (401, no token); the client keeps the connection open, idle.
        assert exits_on_sigterm(proc, lines[1].split()[-1]) is not None, "still running"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)
