"""``dirk mcp --user-keys``: signed user tokens at the command line, as an attacker tries it.

A real ``dirk mcp --kernel --http`` trusts an identity provider's public keys; a real
client presenting a token the provider signed acts for its subject, in its tenant, and the
flow records that user; a forged token (claims changed after signing) and one signed by
another key stop at the door with 401 PRINCIPAL_INVALID. The protected-resource metadata
names the provider as the authorization server, and nothing else.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.identity.tokens import ISSUER, Provider
from tests.support.mcp_kernel import require_mcp

require_mcp()

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402
from joserfc.jwk import OKPKey  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402

from kernel.core.events import FlowCreated  # noqa: E402
from kernel.journal.opening import open_journal  # noqa: E402


@pytest.fixture
def provider(tmp_path: Path) -> Provider:
    return Provider(tmp_path)


@pytest.fixture
def served(tmp_path: Path, provider: Provider) -> Iterator[tuple[str, Path]]:
    """``dirk mcp --kernel --http`` taking the provider's user tokens, calling as ``ide``."""
    db = tmp_path / "j.db"
    anyio.run(_create, db)
    command = [sys.executable, "-m", "kernel", "mcp", "--db", str(db), "--kernel"]
    command += ["--http", "127.0.0.1:0", "--user-keys", str(provider.jwks)]
    command += ["--user-issuer", ISSUER, "--user-audience", "dirk", "--token-agent", "ide"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "serving http://" in line, line
        yield line.split()[-1], db
        assert proc.poll() is None
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err


async def _create(db: Path) -> None:
    async with open_journal(db):
        pass


async def add_fact(url: str, token: str) -> dict[str, Any]:
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            result = await client.call_tool("add_fact", {"name": "lang", "value": "python"})
    assert result.structured_content is not None
    return dict(result.structured_content)


async def refused(url: str, token: str) -> tuple[int, dict[str, Any]]:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
        response = await http.post(url, json=call)
    return response.status_code, response.json()


def forged(token: str) -> str:
    """``token`` with its tenant claim changed after signing (the signature kept)."""
    head, body, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["tenant"] = "globex"
    raw = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{head}.{raw}.{sig}"


async def flow_users(db: Path) -> list[tuple[str, str, str]]:
    async with open_journal(db, readonly=True) as journal:
        events = await journal.read(types=["FlowCreated"])
    users = []
    for event in events:
        if isinstance(event.payload, FlowCreated) and event.payload.on_behalf is not None:
            who = event.payload.on_behalf.principal
            users.append((event.agent_id or "", who.tenant, who.user))
    return users


def test_a_signed_user_token_acts_for_its_user_and_a_forged_one_is_refused(
    served: tuple[str, Path], provider: Provider
) -> None:
    url, db = served
    good = provider.token("carol", "acme")
    stranger = OKPKey.import_key(Ed25519PrivateKey.generate(), parameters={"kid": "ed"})

    async def drive() -> None:
        answer = await add_fact(url, good)
        assert answer["verdict"] == "ACCEPTED", answer
        for token in (forged(good), provider.token("carol", "acme", key=stranger)):
            status, body = await refused(url, token)
            assert (status, body["reason_code"]) == (401, "PRINCIPAL_INVALID")
        metadata = url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
        async with create_mcp_http_client() as http:
            document = (await http.get(metadata)).json()
        assert document["resource"] == url
        assert document["authorization_servers"] == [ISSUER]
        assert await flow_users(db) == [("ide", "acme", "carol")]

    anyio.run(drive)
