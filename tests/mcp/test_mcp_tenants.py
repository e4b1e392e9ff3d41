"""Tenants at the MCP door, as an attacker tries it: a real client, a real HTTP server.

A token bound to tenant A reads A's rules and flows only; naming tenant B's namespace is
refused CROSS_TENANT and the refusal is in the journal. No token, a guessed one, and a
forged or expired user token stop at the door (401: UNAUTHORIZED, PRINCIPAL_INVALID).
"""

from __future__ import annotations

import base64
import json
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.identity.tokens import Provider
from tests.support.mcp_kernel import memory_kernel, require_mcp

require_mcp()

from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402

from kernel import Kernel  # noqa: E402
from kernel.audit.attempts import attempts  # noqa: E402
from kernel.core.events import FactAdded, FlowCreated, InputRefused, Member, TenantSpec  # noqa: E402
from kernel.core.events import Principal as User  # noqa: E402
from kernel.mcp import Embedded, Identity, Principal, build_server  # noqa: E402
from kernel.mcp._http import bound, coded_errors, http_auth, no_oauth, serve_http  # noqa: E402

ACME_TOKEN = "acme-token-0123456789abcdef"
GLOBEX_TOKEN = "globex-token-0123456789abcdef"
ALICE = User(tenant="acme", user="alice", vouched_by="mcp:ide")
BOB = User(tenant="globex", user="bob", vouched_by="mcp:ide")
TOKENS = {
    ACME_TOKEN: Principal(role="agent", name="ide", on_behalf=ALICE),
    GLOBEX_TOKEN: Principal(role="agent", name="ide", on_behalf=BOB),
}


async def seed_rules(kernel: Kernel) -> None:
    """One rule in each tenant's namespace, put in force by an operator."""
    for ns, text in (("acme", "Acme refunds need a receipt."), ("globex", "Globex secret plan.")):
        await kernel.propose_rule(
            f"{ns}.rule",
            ns=ns,
            title=f"{ns} rule",
            content=text,
            labels=[],
            operator="rui",
            reason="seed",
            base_version=0,
            override=True,
        )


@asynccontextmanager
async def served(kernel: Kernel, provider: Provider) -> AsyncIterator[str]:
    """The MCP server over ``kernel`` on streamable HTTP with the token file and user tokens."""
    sock = bound("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    users = provider.verifier()
    identity = Identity(tokens=TOKENS, users=users)
    auth, verifier = http_auth(TOKENS, url, users=users)
    server = build_server(Embedded(kernel), identity, auth=auth, token_verifier=verifier)
    app = coded_errors(no_oauth(server.streamable_http_app(stateless_http=True, host="127.0.0.1")))
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_http, app, sock)
        yield url
        tg.cancel_scope.cancel()


@asynccontextmanager
async def over_http(url: str, token: str) -> AsyncIterator[Client]:
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


async def answer(c: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await c.call_tool(tool, args)
    assert result.structured_content is not None
    return dict(result.structured_content)


async def refusals(kernel: Kernel) -> list[InputRefused]:
    events = await kernel.journal.read(types=["InputRefused"])
    return [e.payload for e in events if isinstance(e.payload, InputRefused)]


@pytest.fixture
def provider(tmp_path: Path) -> Provider:
    return Provider(tmp_path)


async def test_a_tenant_token_reads_its_own_rules_and_is_refused_anothers(
    tmp_path: Path, provider: Provider
) -> None:
    async with memory_kernel(tmp_path / "j.db") as kernel:
        await seed_rules(kernel)
        async with served(kernel, provider) as url, over_http(url, ACME_TOKEN) as acme:
            mine = await answer(acme, "search_rules", q="refunds receipt")
            assert mine["verdict"] == "OK" and mine["result"]["ns"] == "acme"
            assert [r["id"] for r in mine["result"]["rules"]] == ["acme.rule"]
            for tool, args in (
                ("search_rules", {"q": "plan"}),
                ("get_rule", {"item_id": "globex.rule"}),
                ("why", {"item_id": "globex.rule"}),
                ("compile_memory", {"prompt": "plan"}),
            ):
                theirs = await answer(acme, tool, ns="globex", **args)
                assert theirs["verdict"] == "ERROR", tool
                assert theirs["reason_code"] == "CROSS_TENANT", tool
                assert "Globex" not in json.dumps(theirs)
            context = await answer(acme, "get_memory_context")
            assert [r["id"] for r in context["result"]["rules"]] == ["acme.rule"]
        recorded = await refusals(kernel)
    assert [(r.entry, r.target, str(r.reason_code)) for r in recorded] == [
        ("mcp.search_rules", "globex", "CROSS_TENANT"),
        ("mcp.get_rule", "globex", "CROSS_TENANT"),
        ("mcp.why", "globex", "CROSS_TENANT"),
        ("mcp.compile_memory", "globex", "CROSS_TENANT"),
    ]
    assert all(r.operator == "agent:ide" for r in recorded)


async def test_a_user_token_is_its_tenant_and_a_forged_one_is_principal_invalid(
    tmp_path: Path, provider: Provider
) -> None:
    good = provider.token("carol", "globex", azp="ide")
    forged_head, forged_body, sig = good.split(".")
    claims = json.loads(_unb64(forged_body))
    claims["tenant"] = "acme"
    forged = f"{forged_head}.{_b64(json.dumps(claims).encode())}.{sig}"
    expired = provider.token("carol", "globex", azp="ide", exp=int(time.time()) - 3600)
    async with memory_kernel(tmp_path / "j.db") as kernel:
        await seed_rules(kernel)
        async with served(kernel, provider) as url:
            async with over_http(url, good) as carol:
                theirs = await answer(carol, "get_rule", item_id="acme.rule", ns="acme")
                assert theirs["reason_code"] == "CROSS_TENANT"
                mine = await answer(carol, "get_rule", item_id="globex.rule")
                assert mine["verdict"] == "OK"
            call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
            for token, code in (
                (None, "UNAUTHORIZED"),
                ("acme-token-guessed-wrongly", "UNAUTHORIZED"),
                (forged, "PRINCIPAL_INVALID"),
                (expired, "PRINCIPAL_INVALID"),
                (provider.token("carol", "globex", aud="another", azp="ide"), "PRINCIPAL_INVALID"),
            ):
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                async with create_mcp_http_client(headers=headers) as http:
                    response = await http.post(url, json=call)
                assert response.status_code == 401, token
                assert response.json()["reason_code"] == code, token
        recorded = await refusals(kernel)
    assert [(r.entry, r.target) for r in recorded] == [("mcp.get_rule", "acme")]


def _b64(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    import base64

    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


async def test_a_users_proposal_is_on_its_flow_and_unknown_to_another_tenant(
    tmp_path: Path,
) -> None:
    """The flow records whom it acts for; another tenant's wait_flow: UNKNOWN_FLOW, recorded."""
    async with memory_kernel(tmp_path / "j.db") as kernel:
        alice = Principal(role="agent", name="ide", on_behalf=ALICE)
        async with Client(build_server(Embedded(kernel), Identity(alice))) as c:
            fact = await answer(c, "add_fact", name="lang", value="python")
            assert fact["verdict"] == "ACCEPTED"
            assert (await answer(c, "wait_flow", dfid=fact["dfid"]))["verdict"] == "ACCEPTED"
        [created] = await kernel.journal.read(dfid=fact["dfid"], types=["FlowCreated"])
        assert isinstance(created.payload, FlowCreated)
        assert created.payload.on_behalf is not None
        assert created.payload.on_behalf.principal == ALICE
        bob = Principal(role="agent", name="ide", on_behalf=BOB)
        async with Client(build_server(Embedded(kernel), Identity(bob))) as c:
            waited = await answer(c, "wait_flow", dfid=fact["dfid"])
            assert waited["reason_code"] == "UNKNOWN_FLOW"
            traced = await answer(c, "trace_provenance", seq=created.seq)
            assert traced["reason_code"] == "UNKNOWN_FLOW"
        recorded = await refusals(kernel)
    assert [(r.entry, r.target) for r in recorded] == [
        ("mcp.wait_flow", fact["dfid"]),
        ("mcp.trace_provenance", fact["dfid"]),
    ]


async def test_an_artifact_of_one_tenants_flow_is_refused_to_another_tenants_caller(
    tmp_path: Path,
) -> None:
    """The same agent serves two tenants: Bob's session names Alice's flow to read an artifact
    her context referenced; answered as an unknown flow, CROSS_TENANT on record, no bytes."""
    async with memory_kernel(tmp_path / "j.db") as kernel:
        ref = await kernel.put_artifact(b"Acme's floor plan", media_type="text/plain", by="app")
        await kernel.trigger("mcp.ide.plan", {"mcp.ide.plan.doc": ref})
        await kernel.wait_quiet()
        alice = Principal(role="agent", name="ide", on_behalf=ALICE)
        async with Client(build_server(Embedded(kernel), Identity(alice))) as c:
            asked = await answer(c, "query_memory", topic="plan")
            assert asked["result"]["artifacts"] == {"mcp.ide.plan.doc": ref}
            mine = await answer(c, "fetch_artifact", dfid=asked["dfid"], ref=ref)
        assert base64.b64decode(mine["result"]["data_base64"]) == b"Acme's floor plan"
        bob = Principal(role="agent", name="ide", on_behalf=BOB)
        async with Client(build_server(Embedded(kernel), Identity(bob))) as c:
            stolen = await answer(c, "fetch_artifact", dfid=asked["dfid"], ref=ref)
        assert (stolen["verdict"], stolen["reason_code"]) == ("ERROR", "UNKNOWN_FLOW")
        assert "data_base64" not in json.dumps(stolen)
        recorded = await refusals(kernel)
        # The refusal is an attempt in Bob's tenant's audit, and in no other.
        [row] = [a async for a in attempts(kernel.journal, tenant="globex")]
        theirs = [a async for a in attempts(kernel.journal, tenant="acme")]
    assert [(r.reason_code, r.entry, r.target) for r in recorded] == [
        ("CROSS_TENANT", "mcp.fetch_artifact", asked["dfid"])
    ]
    assert recorded[0].principal == BOB
    assert (row.user, row.agent, row.kind, row.decision, row.reason_code, row.layer) == (
        "bob",
        "ide",
        "mcp.fetch_artifact",
        "deny",
        "CROSS_TENANT",
        "door",
    )
    assert [a.kind for a in theirs] == ["memory.query"]  # Alice's own call, not Bob's refusal


async def test_a_tenants_memory_is_unread_by_another_tenants_token_over_http(
    tmp_path: Path, provider: Provider
) -> None:
    """As the attacker: Bob's real token, a real HTTP client; every memory read of MCP
    (the context, provenance by fact name, time travel) shows his tenant's facts only."""
    async with memory_kernel(tmp_path / "j.db") as kernel:
        for tenant, user in (("acme", "alice"), ("globex", "bob")):
            await kernel.declare_tenant(TenantSpec(id=tenant, members={user: Member()}))
        async with served(kernel, provider) as url:
            async with over_http(url, ACME_TOKEN) as acme:
                fact = await answer(acme, "add_fact", name="plan", value="acme buys initech")
                assert (await answer(acme, "wait_flow", dfid=fact["dfid"]))["verdict"] == "ACCEPTED"
            at = kernel.journal.head_seq
            async with over_http(url, GLOBEX_TOKEN) as globex:
                context = await answer(globex, "get_memory_context")
                traced = await answer(globex, "trace_provenance", fact="plan")
                then = await answer(globex, "time_travel", at=at)
            async with over_http(url, ACME_TOKEN) as acme:
                own = await answer(acme, "get_memory_context")
        [added] = await kernel.journal.read(types=["FactAdded"])
    assert isinstance(added.payload, FactAdded) and added.payload.tenant == "acme"
    assert "plan" in own["result"]["facts"]
    assert context["verdict"] == "OK" and "initech" not in json.dumps(context)
    assert (traced["verdict"], traced["reason_code"]) == ("ERROR", "BAD_ARGUMENT")
    assert then["verdict"] == "OK" and "initech" not in json.dumps(then["result"]["facts"])


async def test_a_caller_for_nobody_is_refused_principal_missing_on_record(tmp_path: Path) -> None:
    """No user bound and no default principal: refused, never run as a service identity."""
    async with memory_kernel(tmp_path / "j.db", principal=None) as kernel:
        bare = Principal(role="agent", name="ide")
        async with Client(build_server(Embedded(kernel), Identity(bare))) as c:
            fact = await answer(c, "add_fact", name="lang", value="python")
        assert fact["verdict"] == "REJECTED" and fact["reason_code"] == "PRINCIPAL_MISSING"
        assert await kernel.journal.read(types=["FactAdded"]) == []


NAMES = st.sampled_from(["acme", "globex", "default", "initech", "acme2"])


@settings(max_examples=30, deadline=None)
@given(tenant=st.sampled_from(["acme", "globex", "initech"]), ns=st.none() | NAMES)
def test_every_rule_read_is_confined_to_the_callers_tenant(tenant: str, ns: str | None) -> None:
    """Whatever namespace a caller names, it reads its own tenant's or is refused on record."""

    async def scenario(path: Path) -> None:
        async with memory_kernel(path) as kernel:
            await seed_rules(kernel)
            who = Principal(role="agent", name="ide", on_behalf=User(tenant=tenant, user="u"))
            args = {} if ns is None else {"ns": ns}
            async with Client(build_server(Embedded(kernel), Identity(who))) as c:
                for tool, more in (
                    ("search_rules", {"q": "rule"}),
                    ("get_rule", {"item_id": f"{tenant}.rule"}),
                    ("compile_memory", {"prompt": "rule"}),
                    ("why", {"item_id": f"{tenant}.rule"}),
                ):
                    got = await answer(c, tool, **args, **more)
                    own = ns in (None, "default", tenant)
                    if own:
                        assert got["reason_code"] != "CROSS_TENANT", tool
                        assert "globex" not in json.dumps(got) or tenant == "globex"
                        assert "acme." not in json.dumps(got) or tenant == "acme"
                    else:
                        assert got["reason_code"] == "CROSS_TENANT", tool
            recorded = await refusals(kernel)
            assert len(recorded) == (0 if ns in (None, "default", tenant) else 4)

    with tempfile.TemporaryDirectory() as folder:
        anyio.run(scenario, Path(folder) / "j.db")
