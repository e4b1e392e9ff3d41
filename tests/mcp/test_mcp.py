"""The MCP server in process: every write a proposal, verdicts as structured content.

Each test runs with the SDK's in-process client in its modern mode (no
handshake) and its legacy mode (the 2025 initialize handshake over memory
streams, which mcp 1.x hosts speak).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.mcp_kernel import memory_kernel, require_mcp

require_mcp()

from mcp import Client  # noqa: E402

from kernel import MEMORY_PACK, Kernel, open_kernel  # noqa: E402
from kernel.config import KernelConfig, Ports  # noqa: E402
from kernel.core.events import AgentStatusChanged, payloads  # noqa: E402
from kernel.mcp import Embedded, Follower, Identity, Principal, build_server  # noqa: E402
from kernel.testing import ManualClock, SeededIds  # noqa: E402
from tests.support.principals import LOCAL  # noqa: E402

AGENT = Principal(role="agent", name="ide")
OPERATOR = Principal(role="operator", name="rui")


@pytest.fixture(params=["auto", "legacy"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def kernel(tmp_path: Path) -> AsyncIterator[Kernel]:
    async with memory_kernel(tmp_path / "j.db") as opened:
        yield opened


def client(kernel: Kernel, mode: str, who: Principal = AGENT) -> Client:
    return Client(build_server(Embedded(kernel), Identity(who)), mode=mode)


async def call(c: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await c.call_tool(tool, args)
    assert result.structured_content is not None, result
    assert result.is_error == (result.structured_content["verdict"] == "ERROR")
    return dict(result.structured_content)


async def test_every_write_is_a_proposal_judged_by_the_dim(kernel: Kernel, mode: str) -> None:
    async with client(kernel, mode) as c:
        fact = await call(c, "add_fact", name="room 12", value="no step-free access")
        assert fact["verdict"] == "ACCEPTED" and fact["status"] == "CLOSED"
        rule = await call(c, "add_constraint", text="never use eval()", priority="required")
        assert rule["verdict"] == "ACCEPTED"
        refused = await call(c, "record_decision", text="parse it with eval() for speed")
        assert refused["verdict"] == "REJECTED"
        assert refused["reason_code"] == "CONSTRAINT_VIOLATION"
        assert "never use eval()" in refused["detail"]
        revised = await call(c, "record_decision", text="parse it with ast.literal_eval")
        assert revised["verdict"] == "ACCEPTED"
    # On record: each tool call is a flow of the MCP agent with its proposal and verdict.
    kinds = [f.proposal.kind for f in kernel.flows() if f.proposal is not None]
    assert kinds == [
        "memory.add_fact",
        "memory.add_constraint",
        "memory.record_decision",
        "memory.record_decision",
    ]
    assert {f.agent_id for f in kernel.flows()} == {"ide"}
    assert kernel.projections.memory.facts["room 12"].agent_id == "ide"


async def test_a_query_is_recorded_and_answers_what_memory_holds(kernel: Kernel, mode: str) -> None:
    async with client(kernel, mode) as c:
        await call(c, "add_fact", name="miramar.access", value="steps at the entrance")
        await call(c, "add_constraint", text="verify access before booking")
        blocked = await call(c, "record_decision", text="booking the Miramar")
        assert blocked["reason_code"] == "VERIFICATION_REQUIRED"
        answer = await call(c, "query_memory", topic="access")
        assert answer["verdict"] == "ACCEPTED"
        assert answer["result"]["facts"] == {"miramar.access": "steps at the entrance"}
        assert (await call(c, "record_decision", text="booking the Miramar"))["verdict"] == (
            "ACCEPTED"
        )
    assert kernel.projections.memory.queried["ide"].keys() == {"access"}


async def test_reads_show_context_provenance_and_the_past(kernel: Kernel, mode: str) -> None:
    async with client(kernel, mode) as c:
        first = await call(c, "add_fact", name="ceo", value="ana")
        ana = (await call(c, "trace_provenance", fact="ceo"))["result"]["seq"]
        await call(c, "add_fact", name="ceo", value="bo")
        context = await call(c, "get_memory_context")
        assert context["result"]["facts"] == {"ceo": "bo"}
        trace = await call(c, "trace_provenance", fact="ceo")
        assert trace["result"]["type"] == "FactAdded" and trace["result"]["agent_id"] == "ide"
        assert trace["result"]["proposal"]["params"]["value"] == "bo"
        assert first["dfid"] != trace["dfid"]
        assert (await call(c, "time_travel", at=ana - 1))["result"]["facts"] == {}
        then = await call(c, "time_travel", at=trace["result"]["seq"] - 1)
        assert then["result"]["facts"] == {"ceo": "ana"}
        replay = await call(c, "simulate_timeline", constraint="avoid ana", at=1)
        [change] = replay["result"]["changes"]
        assert change["dfid"] == first["dfid"]
        assert change["reason_code"] == "CONSTRAINT_VIOLATION"


async def test_propose_carries_every_kinds_json_schema(kernel: Kernel, mode: str) -> None:
    async with client(kernel, mode) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        schema = tools["propose"].input_schema
        refs = {o["$ref"].rsplit("/", 1)[-1] for o in schema["properties"]["policy"]["anyOf"]}
        assert {"AddFact", "AddConstraint", "Query"} <= refs
        assert schema["$defs"]["AddFact"]["properties"]["kind"] == {"enum": ["memory.add_fact"]}
        assert tools["add_fact"].output_schema is not None
        ok = await call(c, "propose", policy={"kind": "memory.add_fact", "name": "a", "value": "b"})
        assert ok["verdict"] == "ACCEPTED"
        unknown = await call(c, "propose", policy={"kind": "memory.nope"})
        assert unknown["verdict"] == "REJECTED"
        assert unknown["reason_code"] in ("SCHEMA_INVALID", "UNAUTHORIZED")


async def test_operator_tools_refuse_agents_and_agent_tools_refuse_operators(
    kernel: Kernel, mode: str
) -> None:
    async with client(kernel, mode) as agent:
        for tool in ("list_escalations", "review", "decide", "agent_status"):
            answer = await call(
                agent, tool, dfid="x", decision="approve", reason="r", agent_id="ide"
            )
            assert answer["verdict"] == "ERROR" and answer["reason_code"] == "UNAUTHORIZED"
    async with client(kernel, mode, OPERATOR) as operator:
        answer = await call(operator, "add_fact", name="a", value="b")
        assert answer["reason_code"] == "UNAUTHORIZED"
    assert kernel.flows() == []


async def test_bad_input_is_a_structured_error_recorded_where_a_proposal_was_involved(
    kernel: Kernel, mode: str
) -> None:
    async with client(kernel, mode) as c:
        wrong = await call(c, "add_fact", name=3, value="b")
        assert wrong["verdict"] == "REJECTED" and wrong["reason_code"] == "SCHEMA_INVALID"
        assert wrong["field"] == "params.name"
        huge = await call(c, "add_fact", name="a", value="x" * 200_000)
        assert huge["reason_code"] == "SCHEMA_INVALID"
        not_policy = await call(c, "propose", policy=[1, 2])
        assert not_policy["verdict"] == "ERROR" and not_policy["field"] == "policy"
        unknown_rule = await call(c, "get_rule", item_id="nope")
        assert unknown_rule["reason_code"] == "UNKNOWN_RULE"
        past_end = await call(c, "time_travel", at=10**9)
        assert past_end["reason_code"] == "UNKNOWN_SEQ"
        assert (await call(c, "time_travel", at="three"))["reason_code"] == "SCHEMA_INVALID"
    # The two refused proposals are on record, each in its own flow.
    refused = [f for f in kernel.flows() if f.proposal is not None]
    assert len(refused) == 2
    assert all(f.reason_code is not None for f in refused)


async def test_an_escalated_proposal_is_decided_by_an_operator(tmp_path: Path, mode: str) -> None:
    from examples.booking import RATES
    from kernel.testing import Faults, SimulatedSystem
    from policies.booking import BOOKING

    hotel = SimulatedSystem(tmp_path / "hotel.db", seed=1, faults=Faults())
    try:
        async with memory_kernel(
            tmp_path / "j.db", BOOKING, allow=("travel-agent",), adapters={"hotel": hotel}
        ) as kernel:
            suite = {
                "kind": "booking.reserve_room",
                "traveller": "cy",
                "hotel": "Grand Palace",
                "room_type": "suite",
                "nights": 4,
                "nightly_rate_cents": RATES["suite"],
            }
            agent = Principal(role="agent", name="travel-agent")
            async with client(kernel, mode, agent) as c:
                escalated = await call(c, "propose", policy=suite, explain="board offsite")
            assert escalated["verdict"] == "ESCALATED", escalated
            dfid = escalated["dfid"]
            async with client(kernel, mode, OPERATOR) as c:
                [waiting] = (await call(c, "list_escalations"))["result"]["escalations"]
                assert waiting["dfid"] == dfid and waiting["impact"] == "HIGH_IMPACT"
                full = (await call(c, "review", dfid=dfid))["result"]["action_hash"]
                bare = await call(c, "decide", dfid=dfid, decision="approve", reason="budgeted")
                assert bare["verdict"] == "REFUSED" and bare["reason_code"] == "SCHEMA_INVALID"
                approved = await call(
                    c,
                    "decide",
                    dfid=dfid,
                    decision="approve",
                    reason="board offsite, budgeted",
                    action_hash=full[:12],
                )
                assert approved["verdict"] == "ACCEPTED"
                flow = await kernel.wait_flow(dfid)
                assert str(flow.status) == "CLOSED"
                status = await call(c, "agent_status", agent_id="travel-agent")
                assert status["status"] == "ACTIVE"
    finally:
        hotel.close()


async def test_a_follower_reads_the_journal_and_queues_operator_acts(
    tmp_path: Path, mode: str
) -> None:
    db = tmp_path / "j.db"
    async with memory_kernel(db) as kernel, client(kernel, mode) as c:
        await call(c, "add_fact", name="a", value="b")
    # No kernel runs: an operator's act waits in the inbox (its answer, not at all), QUEUED.
    follower = build_server(Follower(str(db), answer_s=0), Identity(OPERATOR))
    async with Client(follower, mode=mode) as c:
        assert (await call(c, "get_memory_context"))["result"]["facts"] == {"a": "b"}
        queued = await call(
            c, "agent_status", agent_id="ide", status="SUSPENDED", reason="off for the night"
        )
        assert queued["verdict"] == "QUEUED"
        unknown = await call(c, "agent_status", agent_id="nobody", status="ACTIVE", reason="r")
        assert unknown["reason_code"] == "UNKNOWN_AGENT"  # refused here, never queued
    # No kernel runs: an agent's write waits in the inbox (here, not at all), QUEUED.
    waiting = Follower(str(db), wait_s=0)
    async with Client(build_server(waiting, Identity(AGENT)), mode=mode) as c:
        queued = await call(c, "add_fact", name="a", value="c")
        assert queued["verdict"] == "QUEUED" and queued["result"]["inbox_id"] >= 1
    # The queued row is applied by the kernel when it next runs, with who and why.
    async with open_kernel(
        db,
        packs=[MEMORY_PACK],
        adapters={},
        allow=["ide"],
        config=KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(), ids=SeededIds(6))),
    ) as kernel:
        async with kernel.journal.subscribe(1) as batches:
            changed = None
            async for batch in batches:
                changed = next(iter(payloads(batch, AgentStatusChanged)), None)
                if changed is not None:
                    break
        assert changed is not None and changed.operator == "rui"
        assert str(kernel.projections.agents["ide"].status) == "SUSPENDED"


async def test_a_suspended_agent_gets_no_flow(kernel: Kernel, mode: str) -> None:
    async with client(kernel, mode) as agent:
        assert (await call(agent, "add_fact", name="a", value="b"))["verdict"] == "ACCEPTED"
    async with client(kernel, mode, OPERATOR) as operator:
        changed = await call(
            operator, "agent_status", agent_id="ide", status="SUSPENDED", reason="review"
        )
        assert changed["verdict"] == "APPLIED"
        unknown = await call(
            operator, "agent_status", agent_id="nobody", status="ACTIVE", reason="r"
        )
        assert unknown["reason_code"] == "UNKNOWN_AGENT"
    async with client(kernel, mode) as agent:
        refused = await call(agent, "add_fact", name="a", value="c")
        assert refused["verdict"] == "ERROR" and refused["reason_code"] == "AGENT_SUSPENDED"
    assert kernel.projections.memory.facts["a"].value == "b"


def test_import_kernel_never_imports_the_sdk() -> None:
    code = "import sys, kernel, kernel.cli; assert 'mcp' not in sys.modules, 'mcp imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_two_servers_beside_one_kernel_share_the_agents_bridge(
    kernel: Kernel, mode: str
) -> None:
    async with client(kernel, mode) as first, client(kernel, mode) as second:
        assert (await call(first, "add_fact", name="a", value="1"))["verdict"] == "ACCEPTED"
        assert (await call(second, "add_fact", name="b", value="2"))["verdict"] == "ACCEPTED"
        assert (await call(first, "add_fact", name="c", value="3"))["verdict"] == "ACCEPTED"
    assert sorted(kernel.projections.memory.facts) == ["a", "b", "c"]


async def test_an_agent_the_kernel_does_not_allow_is_refused(kernel: Kernel, mode: str) -> None:
    stranger = Principal(role="agent", name="stranger")
    async with client(kernel, mode, stranger) as c:
        refused = await call(c, "add_fact", name="a", value="b")
    assert refused["verdict"] == "ERROR" and refused["reason_code"] == "UNKNOWN_AGENT"
    assert kernel.projections.memory.facts == {}


async def test_an_agent_the_embedding_code_hosts_is_refused_not_displaced(
    kernel: Kernel, mode: str
) -> None:
    from kernel.testing import ScriptedAgent

    def declines(ctx: Any) -> None:
        return None

    hosted = ScriptedAgent(
        "ide", [declines], capabilities=["memory.add_fact"], subscriptions=["notes"]
    )
    await kernel.register(hosted)
    async with client(kernel, mode) as agent:
        refused = await call(agent, "add_fact", name="a", value="b")
    # Before, the server registered a bridge under the same id and displaced the crew.
    assert refused["verdict"] == "ERROR" and refused["reason_code"] == "AGENT_IN_SESSION"
    assert kernel.actors.agents.hosting("ide")
    assert not kernel.flows()
