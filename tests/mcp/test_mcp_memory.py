"""Issue 31 through MCP: the DML pair, rulebook namespaces, and artifacts an agent may read."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.mcp_kernel import memory_kernel, require_mcp

require_mcp()

from mcp import Client  # noqa: E402

from kernel import Kernel  # noqa: E402
from kernel.core.events import InputRefused  # noqa: E402
from kernel.mcp import Embedded, Identity, Principal, build_server  # noqa: E402

AGENT = Principal(role="agent", name="ide")
OPERATOR = Principal(role="operator", name="rui")
STATEMENT = b"Hotel Granvia: step-free entrance; room 12 has a roll-in shower.\n" * 80


@pytest.fixture
async def kernel(tmp_path: Path) -> AsyncIterator[Kernel]:
    async with memory_kernel(tmp_path / "j.db") as opened:
        yield opened


def client(kernel: Kernel, who: Principal = AGENT) -> Client:
    return Client(build_server(Embedded(kernel), Identity(who)))


async def call(c: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await c.call_tool(tool, args)
    assert result.structured_content is not None, result
    return dict(result.structured_content)


async def test_book_hotel_granvia_is_refused_until_accessibility_was_queried(
    kernel: Kernel,
) -> None:
    async with client(kernel) as c:
        added = await call(
            c, "add_constraint", text="Verify accessibility before booking", priority="required"
        )
        assert added["verdict"] == "ACCEPTED"
        refused = await call(c, "record_decision", text="Book Hotel Granvia")
        assert (refused["verdict"], refused["reason_code"]) == ("REJECTED", "VERIFICATION_REQUIRED")
        queried = await call(c, "query_memory", topic="accessibility at Granvia")
        assert queried["verdict"] == "ACCEPTED"
        booked = await call(c, "record_decision", text="Book Hotel Granvia")
        assert booked["verdict"] == "ACCEPTED"


async def test_a_contradicting_constraint_is_refused_naming_both(kernel: Kernel) -> None:
    async with client(kernel) as c:
        await call(c, "add_constraint", text="never book Granvia")
        clash = await call(c, "add_constraint", text="always book Granvia")
        unknown = await call(c, "add_constraint", text="never pay", kinds=["no.such_kind"])
    assert clash["reason_code"] == "CONSTRAINT_CONFLICT"
    assert "never book Granvia" in clash["detail"] and "always book Granvia" in clash["detail"]
    assert unknown["verdict"] != "ACCEPTED"


async def test_two_tenants_rules_stay_apart(kernel: Kernel) -> None:
    async with client(kernel, OPERATOR) as c:
        for ns, content in (("acme", "Refunds need a receipt"), ("globex", "Refunds need a PIN")):
            made = await call(
                c,
                "admin_create_rule",
                item_id="refunds",
                title="Refunds",
                content=content,
                reason="tenant policy",
                ns=ns,
            )
            assert made["verdict"] == "APPLIED", made
        acme = await call(c, "search_rules", q="refunds", ns="acme")
        globex = await call(c, "compile_memory", prompt="refunds", ns="globex")
        default = await call(c, "search_rules", q="refunds")
        one = await call(c, "get_rule", item_id="refunds", ns="acme")
        missing = await call(c, "get_rule", item_id="refunds")
    assert [r["content"] for r in acme["result"]["rules"]] == ["Refunds need a receipt"]
    assert [r["content"] for r in globex["result"]["rules"]] == ["Refunds need a PIN"]
    assert globex["result"]["ns"] == "globex"
    assert globex["result"]["generated_at"].endswith("Z")
    assert default["result"]["rules"] == []
    assert one["result"]["content"] == "Refunds need a receipt"
    assert missing["reason_code"] == "UNKNOWN_RULE"


async def test_an_agent_reads_what_its_context_referenced_and_nothing_else(
    kernel: Kernel,
) -> None:
    ref = await kernel.put_artifact(
        STATEMENT, media_type="text/plain", summary="Granvia's accessibility", by="app"
    )
    secret = await kernel.put_artifact(b"the payroll", media_type="text/plain", by="app")
    async with client(kernel) as c:
        # The application puts the statement in the state, where the agent's contexts look.
        await kernel.trigger("mcp.ide.hotel", {"mcp.ide.hotel.access": ref})
        await kernel.wait_quiet()
        answer = await call(c, "query_memory", topic="accessibility")
        assert answer["result"]["artifacts"] == {"mcp.ide.hotel.access": ref}
        dfid = answer["dfid"]
        first = await call(c, "fetch_artifact", dfid=dfid, ref=ref, start=0, length=100)
        rest = await call(c, "fetch_artifact", dfid=dfid, ref=ref, start=100)
        # As the attacker: an artifact its context never named, and another's flow.
        stolen = await call(c, "fetch_artifact", dfid=dfid, ref=secret)
        guessed = await call(c, "fetch_artifact", dfid="no-such-flow", ref=ref)
        still = await call(c, "query_memory", topic="accessibility")
    data = base64.b64decode(first["result"]["data_base64"])
    data += base64.b64decode(rest["result"]["data_base64"])
    assert data == STATEMENT and first["result"]["more"] and not rest["result"]["more"]
    assert (stolen["verdict"], stolen["reason_code"]) == ("ERROR", "UNAUTHORIZED")
    assert guessed["reason_code"] == "UNAUTHORIZED"
    refused = [
        e.payload
        for e in await kernel.journal.read(types=["InputRefused"])
        if isinstance(e.payload, InputRefused)
    ]
    assert [r.entry for r in refused] == ["artifact", "artifact"]
    assert still["verdict"] == "ACCEPTED"  # the kernel still runs
