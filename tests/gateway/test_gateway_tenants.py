"""The gateway's door, per user: tools/list by the token's scopes, a flow per tenant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from kernel.core.events import InputRefused, Member, TenantSpec
from kernel.core.events import Principal as User
from kernel.gateway import GatewayConfig, config_of, open_gateway
from kernel.mcp import Identity, Principal
from tests.gateway.support import AGENT, LIMITS, Client, gateway, kernel_config, upstream_in
from tests.gateway.support import stdio_config as _stdio_config

SCOPED: dict[str, Any] = {
    "notes.add_note": {"impact": "LOW_IMPACT", "scopes": ["notes:write"], "read_only": False},
    "notes.transfer": {"scopes": ["notes:write", "money:move"]},
}


def scoped_config(tmp: Path) -> GatewayConfig:
    """The tests' upstream, two of its tools named with the scopes they need."""
    spec = _stdio_config(upstream_in(tmp)).upstreams["notes"]
    upstreams = {"notes": {"command": spec.command, "env": spec.env}}
    return config_of({"upstreams": upstreams, "tools": SCOPED, "limits": LIMITS})


def caller(scopes: list[str] | None, tenant: str = "acme") -> Principal:
    user = User(tenant=tenant, user="alice", scopes=scopes, vouched_by="mcp:ide")
    return Principal(role="agent", name=AGENT, on_behalf=user)


async def listed(tmp: Path, who: Principal) -> set[str]:
    await anyio.Path(tmp).mkdir()
    async with gateway(scoped_config(tmp), tmp / "j.db", who) as gw, Client(gw.server) as c:
        return {tool.name for tool in (await c.list_tools()).tools}


async def test_tools_list_shows_a_user_the_tools_its_scopes_cover(tmp_path: Path) -> None:
    assert await listed(tmp_path / "a", caller(["notes:write"])) == {"notes_add_note", "wait_flow"}
    everything = {"notes_add_note", "notes_transfer", "wait_flow"}
    assert await listed(tmp_path / "b", caller(["notes:write", "money:move"])) == everything
    assert await listed(tmp_path / "c", caller([])) == {"wait_flow"}
    # No scope claimed: the tenant's grants decide at the DIM; every tool is listed.
    assert await listed(tmp_path / "d", caller(None)) == everything


async def test_two_users_tenant_scopes_give_their_agent_different_tools(tmp_path: Path) -> None:
    members = {"alice": Member(scopes=["notes:write"]), "bob": Member(scopes=["money:move"])}
    async with gateway(scoped_config(tmp_path), tmp_path / "j.db", caller(None)) as gw:
        await gw.kernel.declare_tenant(TenantSpec(id="acme", members=members))
        async with Client(gw.server) as c:
            alice = {tool.name for tool in (await c.list_tools()).tools}
            hidden = await c.call_tool("notes_transfer", {"amount_cents": 5, "to": "bo"})
        bob = Principal(
            role="agent", name=AGENT, on_behalf=User(tenant="acme", user="bob", vouched_by="t")
        )
        gw.server.identity = Identity(bob)
        async with Client(gw.server) as c:
            bobs = {tool.name for tool in (await c.list_tools()).tools}
        rejected = await gw.kernel.journal.read(types=["ProposalRejected"])
    assert alice == {"notes_add_note", "wait_flow"}
    assert bobs == {"wait_flow"}  # transfer needs notes:write too
    assert hidden.meta is not None and hidden.meta["dirk/verdict"] == "REFUSED"
    assert hidden.structured_content is not None
    assert hidden.structured_content["reason_code"] == "SCOPE_MISSING"
    assert len(rejected) == 1  # refused on record, by the DIM


async def test_two_agents_list_the_tools_their_manifests_name(tmp_path: Path) -> None:
    spec = _stdio_config(upstream_in(tmp_path)).upstreams["notes"]
    upstreams = {"notes": {"command": spec.command, "env": spec.env}}
    config = config_of(
        {"upstreams": upstreams, "tools": SCOPED, "agents": {"bot": ["notes.add_note"]}}
    )
    ide, bot = (Principal(role="agent", name=name) for name in ("ide", "bot"))
    async with open_gateway(
        config,
        tmp_path / "j.db",
        identity=Identity(ide),
        agents=["ide", "bot"],
        kernel_config=kernel_config(),
    ) as gw:
        async with Client(gw.server) as c:
            ides = {tool.name for tool in (await c.list_tools()).tools}
        gw.server.identity = Identity(bot)
        async with Client(gw.server) as c:
            bots = {tool.name for tool in (await c.list_tools()).tools}
            hidden = await c.call_tool("notes_transfer", {"amount_cents": 5, "to": "bo"})
        flows = [f for f in gw.kernel.flows() if f.agent_id == "bot"]
    assert ides == {"notes_add_note", "notes_transfer", "wait_flow"}
    assert bots == {"notes_add_note", "wait_flow"}
    assert hidden.structured_content is not None and hidden.is_error
    assert hidden.structured_content["reason_code"] == "UNAUTHORIZED", hidden.structured_content
    assert [f.reason_code for f in flows] == ["UNAUTHORIZED"]  # refused on record


async def test_the_tool_kind_declares_the_scopes_and_read_only(tmp_path: Path) -> None:
    async with gateway(scoped_config(tmp_path), tmp_path / "j.db") as gw:
        kinds = gw.kernel.catalog.kinds
    assert kinds["notes.transfer"].scopes == ("notes:write", "money:move")
    assert kinds["notes.add_note"].read_only is False


async def test_another_tenants_flow_is_unknown_to_wait_flow_and_recorded(tmp_path: Path) -> None:
    async with gateway(scoped_config(tmp_path), tmp_path / "j.db", caller(None)) as gw:
        async with Client(gw.server) as c:
            made = await c.call_tool("notes_add_note", {"text": "hi", "tag": "misc"})
        assert made.meta is not None and made.meta["dirk/verdict"] == "EXECUTED"
        dfid = made.meta["dirk/dfid"]
        gw.server.identity = Identity(caller(None, tenant="globex"))  # the next caller
        async with Client(gw.server) as c:
            waited = await c.call_tool("wait_flow", {"dfid": dfid})
        assert waited.structured_content is not None
        assert waited.structured_content["reason_code"] == "UNKNOWN_FLOW"
        events = await gw.kernel.journal.read(types=["InputRefused"])
    [refused] = [e.payload for e in events if isinstance(e.payload, InputRefused)]
    assert (refused.entry, refused.target, str(refused.reason_code)) == (
        "gateway.wait_flow",
        dfid,
        "CROSS_TENANT",
    )
