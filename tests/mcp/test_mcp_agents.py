"""MCP for agents: each principal lists only its tools; a flow is read and waited for by DFID."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from tests.support.mcp_kernel import memory_kernel, require_mcp

require_mcp()

from mcp import Client  # noqa: E402

from kernel import Kernel  # noqa: E402
from kernel.mcp import Embedded, Identity, Principal, build_server  # noqa: E402
from kernel.testing import action_of  # noqa: E402
from policies.booking import BOOKING  # noqa: E402
from tests.frameworks.support import Hotel, room  # noqa: E402

AGENT_TOOLS = {
    "add_fact",
    "add_constraint",
    "record_decision",
    "query_memory",
    "fetch_artifact",
    "propose",
}
"""What an agent calls: its writes are proposals; it reads the artifacts its contexts name."""
READS = {
    "wait_flow",
    "get_memory_context",
    "trace_provenance",
    "time_travel",
    "simulate_timeline",
    "search_rules",
    "compile_memory",
    "get_rule",
    "why",
}
"""What anyone may call, with a token or without."""
OPERATOR_TOOLS = {
    "list_escalations",
    "review",
    "decide",
    "agent_status",
    "admin_list_proposals",
    "admin_approve_proposal",
    "admin_reject_proposal",
    "admin_create_rule",
    "admin_update_rule",
    "admin_delete_rule",
}
"""An operator's reads and acts (the rulebook's namespaced admin tools among them)."""
AGENT = Principal(role="agent", name="ide")
OPERATOR = Principal(role="operator", name="rui")
OVER_THRESHOLD = {"kind": "booking.reserve_room", **room(rate=50_000, nights=5)}


def client(kernel: Kernel, who: Principal) -> Client:
    return Client(build_server(Embedded(kernel), Identity(who)))


async def call(c: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await c.call_tool(tool, args)
    assert result.structured_content is not None, result
    return dict(result.structured_content)


async def test_each_principal_lists_only_the_tools_it_may_call(tmp_path: Path) -> None:
    async with memory_kernel(tmp_path / "j.db") as kernel:
        async with client(kernel, AGENT) as agent, client(kernel, OPERATOR) as operator:
            mine = {t.name for t in (await agent.list_tools()).tools}
            theirs = {t.name for t in (await operator.list_tools()).tools}
    assert mine == AGENT_TOOLS | READS
    assert theirs == OPERATOR_TOOLS | READS
    assert (len(mine), len(theirs), len(AGENT_TOOLS | READS | OPERATOR_TOOLS)) == (15, 19, 25)


async def test_an_agent_waits_for_its_escalated_flow_to_end(tmp_path: Path) -> None:
    hotel = Hotel()
    async with memory_kernel(
        tmp_path / "j.db", BOOKING, allow=("ide", "other"), adapters={"hotel": hotel}
    ) as kernel:
        async with client(kernel, AGENT) as c:
            asked = await call(c, "propose", policy=OVER_THRESHOLD, explain="the offsite")
            assert asked["verdict"] == "ESCALATED"
            dfid = asked["dfid"]
            now = await call(c, "wait_flow", dfid=dfid)
            assert now["verdict"] == "ESCALATED" and now["reason_code"] == "APPROVAL_REQUIRED"
            bad = await call(c, "wait_flow", dfid=dfid, timeout_s=-1)
            assert (bad["verdict"], bad["reason_code"]) == ("ERROR", "SCHEMA_INVALID")
            answers: list[dict[str, Any]] = []

            async def wait() -> None:
                answers.append(await call(c, "wait_flow", dfid=dfid, timeout_s=30))

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await kernel.decide(
                    dfid,
                    "approve",
                    operator="rui",
                    reason="ok",
                    action_hash=action_of(kernel, dfid),
                )
            [ended] = answers
            assert ended["verdict"] == "ACCEPTED" and ended["status"] == "CLOSED"
            assert ended["result"]["external_id"] == "bk-1"
        async with client(kernel, Principal(role="agent", name="other")) as other:
            hidden = await call(other, "wait_flow", dfid=dfid)
            assert (hidden["verdict"], hidden["reason_code"]) == ("ERROR", "UNKNOWN_FLOW")
    assert len(hotel.calls) == 1
