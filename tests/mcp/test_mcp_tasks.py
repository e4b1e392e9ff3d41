"""Approvals as MCP tasks (2026-07-28, the tasks extension), with real processes.

An escalated call made by a client that declares the extension comes back as a task
whose id is the flow's DFID. Another process polls it (working), ``dirk decide`` (a
third process, signed with the operator's key) approves it through the inbox, the kernel
executes it once, and the polling process gets the tool's answer. A client that does not
declare the extension, or speaks an older revision, gets ESCALATED as before.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.mcp_kernel import require_mcp

require_mcp()

from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

from kernel import FlowStatus, Kernel, SystemClock  # noqa: E402
from kernel.core.events import FlowAborted  # noqa: E402
from kernel.mcp import (  # noqa: E402
    TASKS,
    Embedded,
    Identity,
    Principal,
    TaskClient,
    build_server,
    cancel_task,
    get_task,
)
from kernel.mcp._http import bound, serve_http  # noqa: E402
from kernel.testing import action_of  # noqa: E402
from tests.support.browser import ROOT  # noqa: E402
from tests.support.helpers import Bank, kernel_for  # noqa: E402

POLLER = Path(__file__).parents[1] / "support" / "mcp_task_poller.py"
AGENT = Principal(role="agent", name="clerk")
LOW_CONFIDENCE = {
    "policy": {"kind": "test.transfer", "account": "acc-1", "amount_cents": 5_000},
    "explain": "pay the invoice",
    "confidence": 0.2,
}
"""A transfer the test pack sends to a human (its confidence is below 0.5)."""


@asynccontextmanager
async def served(kernel: Kernel, who: Principal = AGENT) -> AsyncIterator[str]:
    """The MCP server beside ``kernel`` on streamable HTTP (loopback, one agent)."""
    sock = bound("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    server = build_server(Embedded(kernel), Identity(who))
    app = server.streamable_http_app(stateless_http=True, host="127.0.0.1")
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_http, app, sock)
        yield url
        tg.cancel_scope.cancel()


class Lines:
    """The lines a process writes on its stdout, one at a time."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.held = b""

    async def next(self) -> str:
        while b"\n" not in self.held:
            self.held += await self.stream.receive()
        line, _, self.held = self.held.partition(b"\n")
        return line.decode()


async def decide(db: Path, dfid: str, confirm: str) -> subprocess.CompletedProcess[str]:
    """``dirk decide DFID --approve`` in its own process, signed with ana's key."""
    command = [sys.executable, "-m", "kernel", "decide", dfid, "--approve", "--confirm", confirm]
    command += ["--operator", "ana", "--reason", "the invoice is real", "--db", str(db)]
    done = await anyio.run_process(command, check=False, cwd=ROOT)
    return subprocess.CompletedProcess(done.args, done.returncode, "", done.stderr.decode())


async def test_an_escalated_call_is_a_task_another_process_completes(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    bank = Bank()
    async with (
        kernel_for(db, bank=bank, clock=SystemClock(), inbox_poll_s=0.05) as kernel,
        served(kernel) as url,
    ):
        async with Client(streamable_http_client(url), extensions=[TaskClient()]) as c:
            assert c.protocol_version == "2026-07-28"
            handle = await c.session.call_tool("propose", LOW_CONFIDENCE, allow_claimed=True)
        assert handle.result_type == "task", handle  # type: ignore[union-attr]
        task_id: str = handle.task_id  # type: ignore[union-attr]
        flow = kernel.flow(task_id)
        assert flow is not None and flow.status is FlowStatus.ESCALATED
        async with await anyio.open_process([sys.executable, str(POLLER), url, task_id]) as poller:
            assert poller.stdout is not None
            lines = Lines(poller.stdout)
            assert await lines.next() == "working"
            confirm = action_of(kernel, task_id)
            assert confirm is not None
            decided = await decide(db, task_id, confirm[:12])
            assert decided.returncode == 0, decided.stderr
            line = await lines.next()
            await poller.wait()
        assert poller.returncode == 0
        result: dict[str, Any] = json.loads(line)
        assert result["structuredContent"]["verdict"] == "ACCEPTED"
        assert result["structuredContent"]["dfid"] == task_id
        assert (await kernel.wait_flow(task_id)).status is FlowStatus.CLOSED
    assert len(bank.calls) == 1  # executed once


async def test_a_cancelled_task_is_withdrawn_and_a_later_approval_executes_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    bank = Bank()
    async with (
        kernel_for(db, bank=bank, clock=SystemClock(), inbox_poll_s=0.05) as kernel,
        served(kernel) as url,
    ):
        async with Client(streamable_http_client(url), extensions=[TaskClient()]) as c:
            handle = await c.session.call_tool("propose", LOW_CONFIDENCE, allow_claimed=True)
            task_id: str = handle.task_id  # type: ignore[union-attr]
            confirm = action_of(kernel, task_id)
            assert confirm is not None
            cancelled = await cancel_task(c.session, task_id)
            assert cancelled.status == "cancelled", cancelled
            assert (await get_task(c.session, task_id)).status == "cancelled"
            # Withdrawn once: a second cancel finds nothing waiting, and says so.
            with pytest.raises(MCPError) as again:
                await cancel_task(c.session, task_id)
            assert again.value.error.data["reason_code"] == "FLOW_NOT_ACTIVE"
        flow = await kernel.wait_flow(task_id)
        assert (flow.status, flow.reason_code) == (FlowStatus.ABORTED, "AGENT_DECLINED")
        # The operator approves afterwards, signed through the inbox: refused, nothing runs.
        decided = await decide(db, task_id, confirm[:12])
        assert decided.returncode != 0 and "FLOW_NOT_ACTIVE" in decided.stderr, decided.stderr
        [aborted] = await kernel.journal.read(dfid=task_id, types=["FlowAborted"])
        assert isinstance(aborted.payload, FlowAborted)
        assert aborted.payload.detail.startswith("withdrawn by clerk")
        assert not await kernel.journal.read(dfid=task_id, types=["ExecutionStarted"])
    assert bank.calls == []


async def test_another_agent_cannot_cancel_a_task_and_the_approval_still_executes(
    tmp_path: Path,
) -> None:
    """As the attacker: mallory's own session names clerk's task to withdraw it; answered
    as an unknown task, the flow still waits, and the human's approval executes it once."""
    bank = Bank()
    mallory = Principal(role="agent", name="mallory")
    async with (
        kernel_for(tmp_path / "j.db", bank=bank, clock=SystemClock()) as kernel,
        served(kernel) as url,
        served(kernel, mallory) as theirs,
    ):
        async with Client(streamable_http_client(url), extensions=[TaskClient()]) as c:
            handle = await c.session.call_tool("propose", LOW_CONFIDENCE, allow_claimed=True)
            task_id: str = handle.task_id  # type: ignore[union-attr]
        async with Client(streamable_http_client(theirs), extensions=[TaskClient()]) as m:
            with pytest.raises(MCPError) as refused:
                await cancel_task(m.session, task_id)
        assert refused.value.error.code == -32602
        assert refused.value.error.data["reason_code"] == "UNKNOWN_FLOW"
        flow = kernel.flow(task_id)
        assert flow is not None and flow.status is FlowStatus.ESCALATED
        await kernel.decide(
            task_id, "approve", operator="ana", reason="real",
            action_hash=action_of(kernel, task_id),
        )  # fmt: skip
        assert (await kernel.wait_flow(task_id)).status is FlowStatus.CLOSED
    assert len(bank.calls) == 1


async def test_a_task_a_human_decided_is_not_cancelled(tmp_path: Path) -> None:
    bank = Bank()
    async with (
        kernel_for(tmp_path / "j.db", bank=bank, clock=SystemClock()) as kernel,
        served(kernel) as url,
    ):
        async with Client(streamable_http_client(url), extensions=[TaskClient()]) as c:
            handle = await c.session.call_tool("propose", LOW_CONFIDENCE, allow_claimed=True)
            task_id: str = handle.task_id  # type: ignore[union-attr]
            await kernel.decide(
                task_id, "approve", operator="ana", reason="real",
                action_hash=action_of(kernel, task_id),
            )  # fmt: skip
            await kernel.wait_flow(task_id)
            with pytest.raises(MCPError) as refused:
                await cancel_task(c.session, task_id)
            assert refused.value.error.data["reason_code"] == "FLOW_NOT_ACTIVE"
            assert (await get_task(c.session, task_id)).status == "completed"
    assert len(bank.calls) == 1


async def test_without_the_extension_an_escalated_call_is_escalated(tmp_path: Path) -> None:
    async with (
        kernel_for(tmp_path / "j.db", clock=SystemClock()) as kernel,
        served(kernel) as url,
    ):
        for mode in ("auto", "legacy"):
            async with Client(streamable_http_client(url), mode=mode) as c:
                answer = await c.call_tool("propose", LOW_CONFIDENCE)
            assert answer.structured_content is not None
            assert answer.structured_content["verdict"] == "ESCALATED", mode
        async with Client(streamable_http_client(url), mode="legacy") as c:
            assert c.protocol_version != "2026-07-28"


ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}},
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
}
"""What a 2026-07-28 request carries in ``_meta``: its revision and its capabilities."""


async def raw(url: str, method: str, params: dict[str, Any], **headers: str) -> Any:
    """One stateless 2026-07-28 request, as a client in another language writes it."""
    sent = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28"}
    sent["mcp-method"] = method
    sent.update({k.replace("_", "-"): v for k, v in headers.items()})
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": ENVELOPE}}
    async with create_mcp_http_client() as http:
        return (await http.post(url, json=body, headers=sent)).json()


async def test_server_discover_and_tasks_get_over_stateless_http(tmp_path: Path) -> None:
    async with (
        kernel_for(tmp_path / "j.db", clock=SystemClock()) as kernel,
        served(kernel) as url,
    ):
        found = await raw(url, "server/discover", {})
        assert "2026-07-28" in found["result"]["supportedVersions"]
        assert TASKS in found["result"]["capabilities"]["extensions"]
        made = await raw(url, "tools/call", {"name": "propose", "arguments": LOW_CONFIDENCE},
                         mcp_name="propose")  # fmt: skip
        task = made["result"]
        assert (task["resultType"], task["status"]) == ("task", "working"), made
        polled = await raw(url, "tasks/get", {"taskId": task["taskId"]}, mcp_name=task["taskId"])
        assert polled["result"]["status"] == "working"
        # The routing header names the task the body names, or the request is refused.
        unrouted = await raw(url, "tasks/get", {"taskId": task["taskId"]})
        assert unrouted["error"]["code"] == -32020
        unknown = await raw(url, "tasks/get", {"taskId": "no-such"}, mcp_name="no-such")
        assert unknown["error"]["code"] == -32602
        assert unknown["error"]["data"]["reason_code"] == "UNKNOWN_FLOW"
        # tasks/result is the 2025 experiment's: not a method of the extension.
        legacy = await raw(url, "tasks/result", {"taskId": task["taskId"]}, mcp_name=task["taskId"])
        assert legacy["error"]["code"] == -32601
