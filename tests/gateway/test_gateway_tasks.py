"""The gateway answers an escalated upstream call as an MCP task (2026-07-28, tasks extension).

The task completes with what the upstream answered once a human approved and the kernel
carried the call out: once, however often the task is read.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError

from kernel import FlowStatus
from kernel.mcp import TaskClient, await_task, cancel_task, get_task
from kernel.testing import action_of
from tests.gateway.support import Client, gateway, stdio_config, upstream_in

CALL = {"amount_cents": 60_000, "to": "bo"}
"""A transfer above the configuration's approval threshold (50,000)."""


async def test_an_escalated_upstream_call_is_a_task_that_completes_once(tmp_path: Path) -> None:
    up = upstream_in(tmp_path)
    async with gateway(stdio_config(up), tmp_path / "j.db") as gw:
        async with Client(gw.server, extensions=[TaskClient()]) as c:
            assert c.protocol_version == "2026-07-28"
            handle = await c.session.call_tool("notes_transfer", CALL, allow_claimed=True)
            assert handle.result_type == "task", handle  # type: ignore[union-attr]
            task_id: str = handle.task_id  # type: ignore[union-attr]
            assert (await get_task(c.session, task_id)).status == "working"
            assert up.calls() == []
            confirm = action_of(gw.kernel, task_id)
            await gw.kernel.decide(
                task_id,
                "approve",
                operator="ana",
                reason="the invoice is real",
                action_hash=confirm,
            )
            done = await await_task(c.session, task_id, poll_s=0.05)
            again = await get_task(c.session, task_id)
        async with Client(gw.server) as plain:
            # Without the extension: ESCALATED, followed with wait_flow as before.
            other = await plain.call_tool("notes_transfer", {**CALL, "to": "cy"})
    assert done.meta is not None and done.meta["dirk/verdict"] == "EXECUTED"
    assert done.structured_content is not None and done.structured_content["tx"] == "tx-1"
    assert again.status == "completed" and again.result is not None
    assert other.structured_content is not None
    assert other.structured_content["verdict"] == "ESCALATED"
    assert len(up.calls("transfer")) == 1


async def test_a_cancelled_upstream_task_never_reaches_the_upstream(tmp_path: Path) -> None:
    up = upstream_in(tmp_path)
    async with gateway(stdio_config(up), tmp_path / "j.db") as gw:
        async with Client(gw.server, extensions=[TaskClient()]) as c:
            handle = await c.session.call_tool("notes_transfer", CALL, allow_claimed=True)
            task_id: str = handle.task_id  # type: ignore[union-attr]
            confirm = action_of(gw.kernel, task_id)
            assert (await cancel_task(c.session, task_id)).status == "cancelled"
            assert (await get_task(c.session, task_id)).status == "cancelled"
            late = await gw.kernel.decide(
                task_id, "approve", operator="ana", reason="late", action_hash=confirm
            )
            with pytest.raises(MCPError) as again:
                await cancel_task(c.session, task_id)
        assert late.feedback is not None and late.feedback.reason_code == "FLOW_NOT_ACTIVE"
        assert again.value.error.data["reason_code"] == "FLOW_NOT_ACTIVE"
        assert (await gw.kernel.wait_flow(task_id)).status is FlowStatus.ABORTED
    assert up.calls("transfer") == []
