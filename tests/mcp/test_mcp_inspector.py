"""``dirk mcp`` under the official MCP Inspector's CLI, as a third-party host sees it.

``--strict`` reports every tool-schema portability problem and exits 6 on an error;
here it must report none, not even a warning. Over HTTP a wrong bearer token must not
send the Inspector into an OAuth flow it cannot finish: it stops at its first OAuth
request with the server's sentence (tokens come from the operator).
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.support.inspector import ROOT, inspector
from tests.support.mcp_kernel import require_mcp

require_mcp()

from kernel.audit import open_journal  # noqa: E402

TOKEN = "operator-token-0123456789abcdef"


async def _new_journal(path: Path) -> Path:
    async with open_journal(path):
        pass
    return path


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    return anyio.run(_new_journal, tmp_path / "j.db")


def run(args: list[str], *, tty: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the Inspector's CLI with ``args``; with ``tty``, its stdin is a terminal."""
    command, env = inspector()
    # The Inspector starts stdio servers with a clean environment: -e passes this one on.
    if args and args[0] == sys.executable:
        args = ["-e", f"PYTHONPATH={ROOT}", *args]
    if not tty:
        return subprocess.run(
            [*command, *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    # A person at a terminal: the Inspector would start interactive OAuth if it could.
    main, other = pty.openpty()
    try:
        return subprocess.run(
            [*command, *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            stdin=other,
            check=False,
        )
    finally:
        os.close(main)
        os.close(other)


def test_the_strict_listing_passes_with_no_warning(journal: Path) -> None:
    server = [sys.executable, "-m", "kernel", "mcp", "--db", str(journal)]
    # Each principal lists only the tools it may call: 15 of 25 for an agent, 19 for an operator.
    for who, count in ((["--agent", "ide"], 15), (["--operator", "rui"], 19)):
        listed = run([*server, *who, "--method", "tools/list", "--strict"])
        assert listed.returncode == 0, listed.stderr
        # Each portability problem is a "Warning:" or "Error:" block on stderr.
        assert "Warning" not in listed.stderr and "Error" not in listed.stderr, listed.stderr
        tools = json.loads(listed.stdout)["tools"]
        assert len(tools) == count, who
        for tool in tools:
            hints = tool["annotations"]
            assert tool["title"] and hints["title"] == tool["title"]
            for hint in ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"):
                assert isinstance(hints[hint], bool), (tool["name"], hint)
            for name, schema in tool["inputSchema"].get("properties", {}).items():
                assert schema["description"], (tool["name"], name)


def test_an_unknown_prompt_is_an_error_the_inspector_shows(journal: Path) -> None:
    server = [sys.executable, "-m", "kernel", "mcp", "--db", str(journal), "--agent", "ide"]
    unknown = run([*server, "--method", "prompts/get", "--prompt-name", "no_such_prompt"])
    assert unknown.returncode != 0
    assert "no prompt 'no_such_prompt'" in unknown.stdout + unknown.stderr
    # The server logged no traceback for it (its stderr reaches the Inspector's).
    assert "Traceback" not in unknown.stderr
    prompt = ["--prompt-name", "apply_rulebook_prompt", "--prompt-args", "task=book a room"]
    known = run([*server, "--method", "prompts/get", *prompt])
    assert known.returncode == 0, known.stderr
    assert "book a room" in json.loads(known.stdout)["messages"][0]["content"]["text"]


@pytest.fixture
def http_url(journal: Path, tmp_path: Path) -> Iterator[str]:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"operator:rui {TOKEN}\n")
    command = [sys.executable, "-m", "kernel", "mcp", "--db", str(journal)]
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


def test_over_http_a_token_lists_and_a_wrong_one_stops_short_of_oauth(http_url: str) -> None:
    over = [http_url, "--transport", "http", "--method", "tools/list"]
    listed = run([*over, "--header", f"Authorization: Bearer {TOKEN}", "--strict"])
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)["tools"]) == 19  # the token is an operator's
    # A person at a terminal with a wrong token: the Inspector reads the 401's metadata,
    # finds no OAuth server, and stops with the server's reason, no browser, no wait.
    wrong = run([*over, "--header", "Authorization: Bearer not-a-token-of-this-server"], tty=True)
    assert wrong.returncode != 0
    said = wrong.stdout + wrong.stderr
    assert "ask the operator for a token" in said, said
    assert "/authorize" not in said
