"""The governing MCP gateway against real upstream MCP servers, over stdio and over HTTP.

Each test starts the upstream as a process (tests/support/gateway_upstream.py) and
counts, from the upstream's own log, what it really carried out.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from kernel import FlowStatus
from kernel.adapters import AdapterError, ExecutionIntent
from kernel.core.events import ExecutionRetried, FlowCreated, HumanDecided
from kernel.gateway import (
    Gateway,
    GatewayConfig,
    GatewayServer,
    Route,
    UpstreamDown,
    UpstreamExecutor,
)
from kernel.gateway import Upstream as GatewayUpstream
from kernel.inbox import DecideRequest
from kernel.mcp import Identity, Principal
from kernel.runtime.messages import Decision
from kernel.testing import action_of
from tests.gateway.support import (
    AGENT,
    Client,
    Upstream,
    body,
    gateway,
    http_config,
    http_upstream,
    meta,
    stdio_config,
    upstream_in,
)
from tests.support.operators import post, suite_keys


@pytest.fixture(params=["stdio", "http"])
def over(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[GatewayConfig, Upstream]]:
    """The gateway's configuration over one upstream process, by stdio or by HTTP."""
    up = upstream_in(tmp_path)
    if request.param == "stdio":
        yield stdio_config(up), up
        return
    with http_upstream(up) as (url, _):
        yield http_config(url), up


@asynccontextmanager
async def client_of(gw: Gateway) -> AsyncIterator[Client]:
    async with Client(gw.server) as c:
        yield c


async def test_lists_the_tools_the_pack_names_with_their_upstream_schemas(
    over: tuple[GatewayConfig, Upstream], tmp_path: Path
) -> None:
    config, _ = over
    async with gateway(config, tmp_path / "j.db") as gw, client_of(gw) as c:
        listed = {tool.name: tool for tool in (await c.list_tools()).tools}
    assert set(listed) == {
        "notes_add_note",
        "notes_transfer",
        "notes_fail",
        "notes_garbage",
        "notes_die",
        "wait_flow",
    }
    transfer = listed["notes_transfer"].input_schema
    # The upstream's schema, but the idempotency key is the kernel's to give.
    assert set(transfer["properties"]) == {"amount_cents", "to"}
    assert transfer["required"] == ["amount_cents", "to"]
    assert listed["notes_add_note"].description == "Add a note with a tag."


async def test_an_allowed_call_is_executed_once_and_answered_with_the_upstreams_result(
    over: tuple[GatewayConfig, Upstream], tmp_path: Path
) -> None:
    config, up = over
    async with gateway(config, tmp_path / "j.db") as gw, client_of(gw) as c:
        result = await c.call_tool("notes_add_note", {"text": "buy milk"})
        assert not result.is_error
        assert result.content[0].text == "note 1: buy milk"  # type: ignore[union-attr]
        assert result.meta is not None and result.meta["dirk/verdict"] == "EXECUTED"
        dfid = result.meta["dirk/dfid"]
        types = [e.type for e in await gw.kernel.journal.flow_events(dfid)]
        assert gw.kernel.stopped is None
    assert up.calls() == [{"tool": "add_note", "args": {"text": "buy milk", "tag": "misc"}}]
    assert types.count("ExecutionStarted") == 1 and types[-1] == "FlowClosed"


async def test_a_tool_the_pack_does_not_name_is_refused_on_record_and_never_called(
    tmp_path: Path,
) -> None:
    up = upstream_in(tmp_path)
    async with gateway(stdio_config(up), tmp_path / "j.db") as gw, client_of(gw) as c:
        result = await c.call_tool("notes_delete_all", {})
        answer = body(result)
        assert result.is_error
        assert answer["verdict"] == "REFUSED" and answer["reason_code"] == "SCHEMA_INVALID"
        assert "notes.delete_all" in answer["detail"]
        [rejected] = await gw.kernel.journal.read(dfid=answer["dfid"], types=["ProposalRejected"])
        assert rejected.agent_id == AGENT
    assert up.calls() == []


async def test_a_call_over_the_agents_limit_is_refused_with_the_limit(tmp_path: Path) -> None:
    up = upstream_in(tmp_path)
    async with gateway(stdio_config(up), tmp_path / "j.db") as gw, client_of(gw) as c:
        result = await c.call_tool("notes_transfer", {"amount_cents": 250_000, "to": "bo"})
        outside = await c.call_tool("notes_add_note", {"text": "x", "tag": "secret"})
    answer = body(result)
    assert result.is_error and answer["reason_code"] == "RISK_LIMIT_EXCEEDED"
    assert answer["limit"] == "100000" and answer["field"] == "params.amount_cents"
    assert body(outside)["reason_code"] == "CONSTRAINT_VIOLATION"
    assert up.calls() == []


async def test_an_escalated_call_waits_for_a_signed_operator_then_runs_once(
    over: tuple[GatewayConfig, Upstream], tmp_path: Path
) -> None:
    config, up = over
    db = tmp_path / "j.db"
    call = {"amount_cents": 60_000, "to": "bo"}
    async with gateway(config, db) as gw, client_of(gw) as c:
        first = await c.call_tool("notes_transfer", call, meta=meta("trip-1", "call-1"))
        pending = body(first)
        assert not first.is_error
        assert pending["verdict"] == "ESCALATED" and pending["reason_code"] == "APPROVAL_REQUIRED"
        # Worded by the field it compares, not as an "amount" of anything.
        assert pending["detail"] == "notes.transfer: amount_cents 60000 is above 50000"
        dfid = pending["dfid"]
        unknown = await c.call_tool("wait_flow", {"dfid": "no-such-flow"})
        assert unknown.is_error and unknown.meta is not None
        assert unknown.meta["dirk/verdict"] == "REFUSED"
        still = await c.call_tool("wait_flow", {"dfid": dfid, "timeout_s": 0})
        assert body(still)["verdict"] == "ESCALATED"
        assert up.calls() == []
        # The operator decides through the inbox, with a request signed by her own key.
        decision = DecideRequest(
            dfid=dfid,
            decision=Decision.APPROVE,
            operator="ana",
            reason="the invoice is real",
            action_hash=action_of(gw.kernel, dfid),
        )
        await anyio.to_thread.run_sync(post, suite_keys(), db, decision, "ana")
        done = await c.call_tool("wait_flow", {"dfid": dfid, "timeout_s": 30})
        assert not done.is_error, done
        assert done.meta is not None and done.meta["dirk/verdict"] == "EXECUTED"
        assert body(done)["tx"] == "tx-1"
        # The client asks again for the same call: the record answers, the upstream is not called.
        again = await c.call_tool("notes_transfer", call, meta=meta("trip-1", "call-1"))
        assert again.meta is not None and again.meta["dirk/replayed"] is True
        assert body(again) == body(done)
        [approved] = await gw.kernel.journal.read(dfid=dfid, types=["HumanDecided"])
    [transfer] = up.calls("transfer")
    # The kernel's idempotency key reached the upstream, which honours it.
    assert len(transfer["args"]["key"]) == 32
    assert isinstance(approved.payload, HumanDecided) and approved.payload.operator == "ana"


async def test_a_repeated_call_gets_the_recorded_result_even_after_a_restart(
    tmp_path: Path,
) -> None:
    up = upstream_in(tmp_path)
    db = tmp_path / "j.db"
    async with gateway(stdio_config(up), db) as gw, client_of(gw) as c:
        first = await c.call_tool("notes_add_note", {"text": "once"}, meta=meta("c-7", "t-1"))
        # Another connection resuming the same conversation's call.
        async with client_of(gw) as other:
            second = await other.call_tool(
                "notes_add_note", {"text": "once"}, meta=meta("c-7", "t-1")
            )
    async with gateway(stdio_config(up), db) as gw, client_of(gw) as c:
        third = await c.call_tool("notes_add_note", {"text": "once"}, meta=meta("c-7", "t-1"))
        suppressed = await gw.kernel.journal.read(types=["DuplicateSuppressed"])
    assert [r.content[0].text for r in (first, second, third)] == ["note 1: once"] * 3  # type: ignore[union-attr]
    assert [r.meta["dirk/replayed"] for r in (first, second, third) if r.meta] == [
        False,
        True,
        True,
    ]
    assert len(up.calls("add_note")) == 1 and len(suppressed) == 2


async def test_a_connection_is_a_conversation_and_its_request_ids_key_the_calls(
    tmp_path: Path,
) -> None:
    up = upstream_in(tmp_path)
    async with gateway(stdio_config(up), tmp_path / "j.db") as gw:
        async with client_of(gw) as c:
            await c.call_tool("notes_add_note", {"text": "a"})
            await c.call_tool("notes_add_note", {"text": "a2"})
        async with client_of(gw) as c:
            # The same request id on another connection is another call.
            await c.call_tool("notes_add_note", {"text": "b"})
        created = await gw.kernel.journal.read(types=["FlowCreated"])
    assert [c["args"]["text"] for c in up.calls()] == ["a", "a2", "b"]
    flows = [(e.dfid, e.parent_dfid, e.payload) for e in created]
    conversations = [p.conversation_id for _, _, p in flows if isinstance(p, FlowCreated)]
    # Each request the SDK hands over has a session of its own: the connection is one
    # conversation all the same, its later calls children of its first call's flow.
    assert conversations[0] == conversations[1] != conversations[2] and all(conversations)
    assert flows[1][1] == flows[0][0] and flows[2][1] is None


async def test_repeated_refusals_in_one_conversation_stop_it(tmp_path: Path) -> None:
    up = upstream_in(tmp_path)
    async with gateway(stdio_config(up), tmp_path / "j.db") as gw, client_of(gw) as c:
        codes = []
        for i in range(5):
            result = await c.call_tool(
                "notes_transfer", {"amount_cents": 900_000, "to": "bo"}, meta=meta("loop", f"{i}")
            )
            codes.append(body(result)["reason_code"])
        fresh = await c.call_tool("notes_add_note", {"text": "new"}, meta=meta("next", "1"))
    # max_attempts 3: two refusals, the third stops the conversation, later calls are refused.
    assert codes == ["RISK_LIMIT_EXCEEDED"] * 2 + ["REASONING_EXHAUSTION"] * 3
    assert not fresh.is_error and up.calls("transfer") == []


async def test_an_upstream_sigkilled_mid_call_is_an_unknown_outcome_for_a_human(
    tmp_path: Path,
) -> None:
    up = upstream_in(tmp_path)
    async with gateway(stdio_config(up), tmp_path / "j.db") as gw, client_of(gw) as c:
        died = await c.call_tool("notes_die", {})
        answer = body(died)
        # It may have happened: not retried, not called a failure; a human reconciles.
        assert answer["verdict"] == "ESCALATED" and answer["reason_code"] == "OUTCOME_UNKNOWN"
        flow = gw.kernel.flow(answer["dfid"])
        assert flow is not None and flow.status is FlowStatus.ESCALATED
        # The next call starts the upstream again; the kernel never stopped.
        after = await c.call_tool("notes_add_note", {"text": "still here"})
        assert not after.is_error, after
        assert gw.kernel.stopped is None
    assert [c["tool"] for c in up.calls()] == ["die", "add_note"]


async def test_an_http_upstream_killed_between_calls_fails_the_call_on_record(
    tmp_path: Path,
) -> None:
    up = upstream_in(tmp_path)
    with http_upstream(up) as (url, proc):
        config = http_config(url, attempts=2, connect_s=5)
        async with gateway(config, tmp_path / "j.db") as gw, client_of(gw) as c:
            ok = await c.call_tool("notes_add_note", {"text": "before"})
            assert not ok.is_error
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            failed = await c.call_tool("notes_add_note", {"text": "after"})
            answer = body(failed)
            assert failed.is_error
            assert answer["verdict"] == "FAILED" and answer["reason_code"] == "EXECUTION_FAILED"
            assert "cannot be reached" in answer["detail"]
            events = await gw.kernel.journal.read(
                dfid=answer["dfid"], types=["ExecutionRetried", "ExecutionFailed"]
            )
            # Both attempts recorded, the first retried (nothing reached the upstream).
            assert [e.type for e in events] == ["ExecutionRetried", "ExecutionFailed"]
            retried = events[0].payload
            assert isinstance(retried, ExecutionRetried) and not retried.unknown
            assert gw.kernel.stopped is None
    assert [c["args"]["text"] for c in up.calls()] == ["before"]


async def test_an_upstream_that_refuses_or_answers_garbage_gives_a_recorded_outcome(
    tmp_path: Path,
) -> None:
    up = upstream_in(tmp_path)
    config = stdio_config(up, timeout_s=3)
    async with gateway(config, tmp_path / "j.db") as gw, client_of(gw) as c:
        refused = await c.call_tool("notes_fail", {"why": "no funds"})
        garbage = await c.call_tool("notes_garbage", {})
        after = await c.call_tool("notes_add_note", {"text": "fine"})
        assert gw.kernel.stopped is None
    answer = body(refused)
    assert refused.is_error and answer["verdict"] == "FAILED"
    assert answer["reason_code"] == "EXECUTION_FAILED" and "no funds" in answer["detail"]
    # No usable answer within timeout_s: the effect may have happened.
    assert body(garbage)["reason_code"] == "OUTCOME_UNKNOWN"
    assert not after.is_error


async def test_an_upstream_down_at_start_is_a_clear_error(tmp_path: Path) -> None:
    config = http_config("http://127.0.0.1:9/mcp", connect_s=5)
    with pytest.raises(UpstreamDown, match="upstream notes cannot be reached"):
        async with gateway(config, tmp_path / "j.db"):
            pass


async def test_only_agents_call_the_gateways_tools(tmp_path: Path) -> None:
    up = upstream_in(tmp_path)
    ops = Principal(role="operator", name="ana")
    async with gateway(stdio_config(up), tmp_path / "j.db", ops) as gw, client_of(gw) as c:
        listed = (await c.list_tools()).tools
        refused = await c.call_tool("notes_add_note", {"text": "x"})
    assert listed == []
    assert refused.is_error and body(refused)["reason_code"] == "UNAUTHORIZED"
    assert up.calls() == []


async def test_the_clients_trace_context_is_the_flows_parent_link(tmp_path: Path) -> None:
    up = upstream_in(tmp_path)
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    keys = {**meta("traced", "1"), "traceparent": parent}
    async with gateway(stdio_config(up), tmp_path / "j.db") as gw, client_of(gw) as c:
        result = await c.call_tool("notes_add_note", {"text": "traced"}, meta=keys)  # type: ignore[arg-type]
        assert result.meta is not None
        [created] = await gw.kernel.journal.read(
            dfid=result.meta["dirk/dfid"], types=["FlowCreated"]
        )
    assert isinstance(created.payload, FlowCreated)
    assert created.payload.traceparent == parent
    assert created.payload.conversation_id == "traced" and created.payload.tool_call_id == "1"


async def test_wait_flow_refuses_what_is_not_the_agents_own_flow(tmp_path: Path) -> None:
    up = upstream_in(tmp_path)
    async with gateway(stdio_config(up), tmp_path / "j.db") as gw, client_of(gw) as c:
        mine = await c.call_tool("notes_add_note", {"text": "mine"})
        assert mine.meta is not None
        dfid = mine.meta["dirk/dfid"]
        answers = [
            await c.call_tool("wait_flow", args)
            for args in (
                {"dfid": "no-such-flow"},
                {"dfid": dfid, "timeout_s": -1},
                {"dfid": dfid, "timeout_s": True},
                {"dfid": dfid, "since": 1},
                {"dfid": ""},
            )
        ]
        done = await c.call_tool("wait_flow", {"dfid": dfid})
    assert [body(a)["reason_code"] for a in answers] == [
        "UNKNOWN_FLOW",
        "SCHEMA_INVALID",
        "SCHEMA_INVALID",
        "SCHEMA_INVALID",
        "SCHEMA_INVALID",
    ]
    assert all(a.is_error for a in answers)
    assert not done.is_error and done.content[0].text == "note 1: mine"  # type: ignore[union-attr]
    assert done.meta is not None and done.meta["dirk/replayed"] is False
    assert len(up.calls()) == 1


async def test_another_agents_flow_is_unknown_to_wait_flow(tmp_path: Path) -> None:
    up = upstream_in(tmp_path)
    config = stdio_config(up)
    async with gateway(config, tmp_path / "j.db") as gw:
        async with client_of(gw) as c:
            mine = await c.call_tool("notes_add_note", {"text": "mine"})
        assert mine.meta is not None
        # The same kernel, its server seen by another agent.
        other = GatewayServer(
            gw.kernel, config, gw.routes, Identity(Principal(role="agent", name="x"))
        )
        async with Client(other) as c:
            theirs = await c.call_tool("wait_flow", {"dfid": mine.meta["dirk/dfid"]})
    assert body(theirs)["reason_code"] == "UNKNOWN_FLOW"


async def test_only_a_call_that_never_reached_the_upstream_is_called_again(
    tmp_path: Path,
) -> None:
    """The executor's lookup: what the kernel asks before a retry, and on resuming after a crash."""
    config = http_config("http://127.0.0.1:9/mcp", connect_s=5)
    intent = ExecutionIntent(key="k-1", kind="notes.add_note", adapter="mcp.notes")
    route = Route(name="notes_add_note", kind="notes.add_note", upstream="notes", tool="add_note")
    async with anyio.create_task_group() as tg:
        upstream = GatewayUpstream("notes", config.upstreams["notes"], str(tmp_path), tg)
        executor = UpstreamExecutor(upstream, {route.name: route})
        with pytest.raises(AdapterError) as refused:
            await executor.execute(intent)
        assert refused.value.transient and not refused.value.outcome_unknown
        assert await executor.lookup("k-1") is None  # nothing was sent: calling again is safe
        with pytest.raises(AdapterError) as unknown:
            await executor.lookup("k-resumed-after-a-restart")
        assert unknown.value.outcome_unknown
        tg.cancel_scope.cancel()
