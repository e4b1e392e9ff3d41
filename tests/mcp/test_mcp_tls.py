"""``dirk mcp --http`` over TLS: the SDK's own client over HTTPS, plain HTTP not served, refusals.

A CA and a certificate for 127.0.0.1 are made in the test (trustme); the server is
``dirk mcp`` as a host launches it, a separate process with the kernel inside.
``127.1`` stands for an address off loopback (see tests/console/test_console_tls.py:
the loopback check cannot read it as loopback, the system binds it to 127.0.0.1).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.support.mcp_kernel import require_mcp
from tests.support.sigterm import exits_on_sigterm
from tests.support.tls import Certificates, certificates

require_mcp()

import httpx2  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from kernel.audit import open_journal  # noqa: E402
from kernel.cli import main  # noqa: E402

AGENT_TOKEN = "agent-token-0123456789abcdef"
CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


async def new_journal(path: Path) -> Path:
    async with open_journal(path):
        pass
    return path


@pytest.fixture
def certs(tmp_path: Path) -> Certificates:
    return certificates(tmp_path)


def serve(db: Path, tokens: Path, *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "kernel", "mcp", "--db", str(db), "--kernel"]
    command += ["--token-file", str(tokens), *args]
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text(f"agent:ide {AGENT_TOKEN}\n")
    return path


@pytest.fixture
def https_server(
    tmp_path: Path, certs: Certificates, tokens: Path
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    db = anyio.run(new_journal, tmp_path / "j.db")
    tls = ("--tls-cert", str(certs.cert), "--tls-key", str(certs.key))
    proc = serve(db, tokens, "--http", "127.0.0.1:0", *tls)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "serving https://127.0.0.1:" in line, line
        yield line.split()[-1], proc
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
        assert AGENT_TOKEN not in err and "Traceback" not in err, err


def test_the_sdk_client_proposes_over_https(
    https_server: tuple[str, subprocess.Popen[str]], certs: Certificates
) -> None:
    url, proc = https_server

    async def drive() -> None:
        async with httpx2.AsyncClient(
            verify=certs.client_context(),
            headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
            timeout=30,
        ) as http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                result = await client.call_tool("add_fact", {"name": "lang", "value": "python"})
        assert result.structured_content is not None
        assert result.structured_content["verdict"] == "ACCEPTED"

    anyio.run(drive)
    assert proc.poll() is None


def test_plain_http_to_the_tls_port_is_not_served(
    https_server: tuple[str, subprocess.Popen[str]], certs: Certificates
) -> None:
    url, proc = https_server
    headers = {"Authorization": f"Bearer {AGENT_TOKEN}"}
    # The bearer token would cross the network readable: no plain answer, no token taken.
    with pytest.raises(httpx2.TransportError):
        httpx2.post(url.replace("https://", "http://", 1), json=CALL, headers=headers, timeout=10)
    # A client that does not trust the CA is refused by its own TLS check.
    with pytest.raises(httpx2.ConnectError):
        httpx2.post(url, json=CALL, headers=headers, timeout=10)
    # Without a token, over TLS: 401, as before.
    with httpx2.Client(verify=certs.client_context(), timeout=10) as http:
        assert http.post(url, json=CALL).status_code == 401
    assert proc.poll() is None


def test_off_loopback_without_tls_is_refused_with_why_and_what_to_do(
    tmp_path: Path, tokens: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = anyio.run(new_journal, tmp_path / "j.db")
    for host in ("0.0.0.0", "[::]", "192.0.2.7", "127.1"):
        status = main(
            ["mcp", "--db", str(db), "--http", f"{host}:8765", "--token-file", str(tokens)]
        )
        assert status == 2
        err = capsys.readouterr().err
        shown = host.strip("[]")
        assert err.startswith(f"error: BAD_ARGUMENT: refusing to serve plain HTTP on {shown}")
        assert "--tls-cert FILE and --tls-key FILE" in err and "--insecure-http" in err


def test_tls_flags_go_with_http_and_with_each_other(
    tmp_path: Path, tokens: Path, certs: Certificates, capsys: pytest.CaptureFixture[str]
) -> None:
    db = anyio.run(new_journal, tmp_path / "j.db")
    base = ["mcp", "--db", str(db)]
    http = ["--http", "127.0.0.1:0", "--token-file", str(tokens)]
    pair = ["--tls-cert", str(certs.cert), "--tls-key", str(certs.key)]
    cases = {
        "go with --http": [*base, "--agent", "ide", *pair],
        "TLS takes both": [*base, *http, "--tls-key", str(certs.key)],
        "not a certificate chain and its key": [
            *base,
            *http,
            *("--tls-cert", str(certs.ca), "--tls-key", str(certs.ca)),
        ],
        "--insecure-http contradicts": [*base, *http, *pair, "--insecure-http"],
    }
    for message, args in cases.items():
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: BAD_ARGUMENT: ") and message in err, err


def test_insecure_http_off_loopback_is_served_only_when_asked_and_warns(
    tmp_path: Path, tokens: Path
) -> None:
    db = anyio.run(new_journal, tmp_path / "j.db")
    proc = serve(db, tokens, "--http", "127.1:0", "--insecure-http")
    try:
        assert proc.stderr is not None
        warning = proc.stderr.readline()
        assert warning.startswith("WARNING: --insecure-http: serving plain HTTP on 127.1")
        assert "bearer tokens" in warning and "readable" in warning
        line = proc.stderr.readline()
        assert "serving http://127.1:" in line, line
        port = line.rsplit(":", 1)[1].split("/")[0]
        # Served, and still behind the tokens: no token, no tool.
        answer = httpx2.post(f"http://127.0.0.1:{port}/mcp", json=CALL, timeout=10)
        assert answer.status_code == 401
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def test_sigterm_stops_it_while_a_refused_client_holds_its_connection(
    https_server: tuple[str, subprocess.Popen[str]], certs: Certificates
) -> None:
    url, proc = https_server
    # A client refused (401, no token) that keeps its TLS connection open, idle.
    assert exits_on_sigterm(proc, url, certs.client_context()) is not None, "still running"
