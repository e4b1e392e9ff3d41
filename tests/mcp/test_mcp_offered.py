"""Tools per principal: an agent lists the kinds its manifest and its user's scopes allow.

Two agents beside one kernel list different tools; a kind an agent is not offered is
refused before any flow opens, and the refusal is in the journal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.mcp_kernel import memory_kernel, require_mcp

require_mcp()

from mcp import Client  # noqa: E402

from kernel import Kernel  # noqa: E402
from kernel.core.events import InputRefused  # noqa: E402
from kernel.core.events import Principal as User  # noqa: E402
from kernel.mcp import Embedded, Identity, Principal, build_server  # noqa: E402
from tests.principals.kit import ACME, PEOPLE  # noqa: E402
from tests.support.helpers import Bank  # noqa: E402

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
CAPABILITIES = {"ide": ["memory.add_fact", "memory.query"], "bot": ["people.look", "people.pay"]}


def agent(name: str, user: str | None = None) -> Principal:
    behalf = None if user is None else User(tenant="acme", user=user, vouched_by="mcp:test")
    return Principal(role="agent", name=name, on_behalf=behalf)


async def listing(backend: Embedded, who: Principal) -> dict[str, Any]:
    async with Client(build_server(backend, Identity(who))) as c:
        return {t.name: t for t in (await c.list_tools()).tools}


def policy_kinds(tool: Any) -> set[str]:
    """The kinds ``propose``'s schema offers, by the ``kind`` each option names."""
    options = tool.input_schema["properties"]["policy"]["anyOf"]
    defs = tool.input_schema["$defs"]
    names = set()
    for option in options:
        schema = defs[option["$ref"].rsplit("/", 1)[1]] if "$ref" in option else option
        names.update(schema["properties"]["kind"]["enum"])
    return names


async def refusals(kernel: Kernel) -> list[InputRefused]:
    events = await kernel.journal.read(types=["InputRefused"])
    return [e.payload for e in events if isinstance(e.payload, InputRefused)]


async def test_two_agents_list_the_tools_of_their_own_kinds(tmp_path: Path) -> None:
    async with memory_kernel(
        tmp_path / "j.db", PEOPLE, allow=("ide", "bot"), adapters={"bank": Bank()}
    ) as kernel:
        backend = Embedded(kernel, CAPABILITIES)
        ide = await listing(backend, agent("ide"))
        bot = await listing(backend, agent("bot"))
    assert set(ide) == {"add_fact", "query_memory", "propose", "fetch_artifact"} | READS
    assert policy_kinds(ide["propose"]) == {"memory.add_fact", "memory.query"}
    assert set(bot) == {"propose", "fetch_artifact"} | READS
    assert policy_kinds(bot["propose"]) == {"people.look", "people.pay"}


async def test_a_users_scopes_narrow_what_its_agent_is_offered(tmp_path: Path) -> None:
    async with memory_kernel(
        tmp_path / "j.db", PEOPLE, allow=("bot",), adapters={"bank": Bank()}
    ) as kernel:
        await kernel.declare_tenant(ACME)
        backend = Embedded(kernel, CAPABILITIES)
        ann = await listing(backend, agent("bot", "ann"))  # pay and read
        bob = await listing(backend, agent("bot", "bob"))  # read only
        stranger = await listing(backend, agent("bot", "mallory"))  # not a member
    assert policy_kinds(ann["propose"]) == {"people.look", "people.pay"}
    assert policy_kinds(bob["propose"]) == {"people.look"}
    assert "propose" not in stranger


async def test_a_kind_not_offered_is_refused_on_record(tmp_path: Path) -> None:
    async with memory_kernel(
        tmp_path / "j.db", PEOPLE, allow=("ide", "bot"), adapters={"bank": Bank()}
    ) as kernel:
        await kernel.declare_tenant(ACME)
        backend = Embedded(kernel, CAPABILITIES)
        async with Client(build_server(backend, Identity(agent("ide")))) as c:
            hidden = await c.call_tool("record_decision", {"text": "book it"})
            other = await c.call_tool(
                "propose", {"policy": {"kind": "people.look", "account": "a1"}}
            )
        async with Client(build_server(backend, Identity(agent("bot", "bob")))) as c:
            unscoped = await c.call_tool(
                "propose",
                {"policy": {"kind": "people.pay", "account": "a1", "amount_cents": 5}},
            )
        flows = await kernel.journal.read(types=["FlowCreated"])
        recorded = await refusals(kernel)
    answers = [r.structured_content or {} for r in (hidden, other, unscoped)]
    assert [(a["verdict"], a["reason_code"], a["dfid"]) for a in answers] == [
        ("ERROR", "UNAUTHORIZED", ""),
        ("ERROR", "UNAUTHORIZED", ""),
        ("ERROR", "SCOPE_MISSING", ""),
    ]
    assert all(r.meta is not None and r.meta["dirk/verdict"] == "ERROR" for r in (hidden, other))
    assert flows == []
    assert [(r.entry, r.target, str(r.reason_code), r.operator) for r in recorded] == [
        ("mcp.record_decision", "memory.record_decision", "UNAUTHORIZED", "agent:ide"),
        ("mcp.propose", "people.look", "UNAUTHORIZED", "agent:ide"),
        ("mcp.propose", "people.pay", "SCOPE_MISSING", "agent:bot"),
    ]
