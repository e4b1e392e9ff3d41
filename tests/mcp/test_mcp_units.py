"""Units a person reads in MCP answers: money in major units with its currency, durations spoken.

A pack quotes minor units in its reasons (``amount 2992640 is above 2500000``) and the
journal keeps them so. The MCP answer keeps them too, in ``detail``, beside the reason
code: an agent revises against the units it proposed in. Its ``summary`` (the result's
first text, what a host shows and its model reads) says the same in the currency the
server is told, ``$29,926.40 is above $25,000.00``; ``--currency none`` leaves it as
recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import anyio

from tests.support.mcp_kernel import memory_kernel, require_mcp

require_mcp()

from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp_types import CallToolResult, TextContent  # noqa: E402

from kernel import Kernel  # noqa: E402
from kernel.audit import open_journal  # noqa: E402
from kernel.core.events import FlowEscalated, ProposalRejected  # noqa: E402
from kernel.mcp import Embedded, Identity, Principal, TaskClient, build_server, get_task  # noqa: E402
from kernel.mcp._http import bound, serve_http  # noqa: E402
from kernel.policy import PolicyKind, PolicyPack, Threshold  # noqa: E402
from kernel.policy.rules import Range  # noqa: E402
from tests.support.helpers import Bank  # noqa: E402

AGENT = Principal(role="agent", name="ide")
OPERATOR = Principal(role="operator", name="rui")


class Send(PolicyKind, tag="pay.send"):
    """Send money from the desk's account: ``amount`` in cents."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "bank"

    account: str
    amount: int


PAY = PolicyPack(
    name="pay",
    version="1.0.0",
    kinds=(Send,),
    invariants=(Range(Send, "amount", max=2_500_000),),
    thresholds=(Threshold(Send, amount="amount", above=1_000_000),),
)


def texts(result: CallToolResult) -> list[str]:
    return [block.text for block in result.content if isinstance(block, TextContent)]


async def send(c: Client, amount: int) -> CallToolResult:
    policy = {"kind": "pay.send", "account": "acc-1", "amount": amount}
    return await c.call_tool("propose", {"policy": policy, "explain": "pay the supplier"})


async def test_a_refusal_reads_in_dollars_and_keeps_its_code_and_recorded_detail(
    tmp_path: Path,
) -> None:
    async with memory_kernel(tmp_path / "j.db", PAY, adapters={"bank": Bank()}) as kernel:
        server = build_server(Embedded(kernel), Identity(AGENT))
        async with Client(server) as c:
            result = await send(c, 2_992_640)
        [rejected] = await kernel.journal.read(types=["ProposalRejected"])
    body = result.structured_content
    assert body is not None
    # The machine fields, as recorded: the code, the field, the minor units proposed in.
    assert (body["verdict"], body["reason_code"], body["field"]) == (
        "REJECTED",
        "RISK_LIMIT_EXCEEDED",
        "params.amount",
    )
    assert body["detail"] == "amount 2992640 is above 2500000"
    assert isinstance(rejected.payload, ProposalRejected)
    assert rejected.payload.feedback.detail == body["detail"]  # the journal is not reworded
    # The words a person reads: major units with the currency, first of the texts.
    summary, copy = texts(result)
    assert "amount $29,926.40 is above $25,000.00" in summary
    assert "2992640" not in summary and summary.startswith("REJECTED RISK_LIMIT_EXCEEDED")
    assert summary == body["summary"]
    assert json.loads(copy) == body  # the structured content, for hosts that read only text


async def escalate(kernel: Kernel) -> str:
    """An agent's send over the threshold, escalated to a human; its DFID."""
    async with Client(build_server(Embedded(kernel), Identity(AGENT))) as c:
        result = await send(c, 1_500_000)
    assert result.structured_content is not None
    assert result.structured_content["verdict"] == "ESCALATED"
    dfid = str(result.structured_content["dfid"])
    # The proposer reads it in dollars too (the server's default), and how to follow it.
    summary = texts(result)[0]
    assert "amount $15,000.00 is above $10,000.00" in summary
    assert f"wait_flow(dfid={dfid!r})" in summary
    return dfid


async def test_an_escalation_listed_and_reviewed_reads_in_the_servers_currency(
    tmp_path: Path,
) -> None:
    async with memory_kernel(tmp_path / "j.db", PAY, adapters={"bank": Bank()}) as kernel:
        dfid = await escalate(kernel)
        [escalated] = await kernel.journal.read(types=["FlowEscalated"])
        server = build_server(Embedded(kernel), Identity(OPERATOR), currency="EUR")
        async with Client(server) as c:
            listed = await c.call_tool("list_escalations", {})
            reviewed = await c.call_tool("review", {"dfid": dfid})
    recorded = "pay.send: amount 1500000 is above 1000000"
    assert isinstance(escalated.payload, FlowEscalated) and escalated.payload.detail == recorded
    assert listed.structured_content is not None
    [item] = listed.structured_content["result"]["escalations"]
    assert (item["dfid"], item["reason_code"], item["detail"]) == (
        dfid,
        "APPROVAL_REQUIRED",
        recorded,
    )
    readable = "pay.send: amount €15,000.00 is above €10,000.00"
    assert readable in item["summary"] and "ide proposes pay.send" in item["summary"]
    summary = texts(listed)[0]
    assert summary.startswith("1 escalation waiting:") and readable in summary
    assert reviewed.structured_content is not None
    assert reviewed.structured_content["result"]["detail"] == recorded
    assert readable in texts(reviewed)[0]


async def test_a_tasks_status_message_reads_in_the_servers_currency(tmp_path: Path) -> None:
    async with memory_kernel(tmp_path / "j.db", PAY, adapters={"bank": Bank()}) as kernel:
        sock = bound("127.0.0.1", 0)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
        server = build_server(Embedded(kernel), Identity(AGENT), currency="GBP")
        app = server.streamable_http_app(stateless_http=True, host="127.0.0.1")
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve_http, app, sock)
            async with Client(streamable_http_client(url), extensions=[TaskClient()]) as c:
                policy = {"kind": "pay.send", "account": "acc-1", "amount": 1_500_000}
                handle = await c.session.call_tool(
                    "propose", {"policy": policy, "explain": "pay"}, allow_claimed=True
                )
                assert handle.result_type == "task", handle  # type: ignore[union-attr]
                task = await get_task(c.session, handle.task_id)  # type: ignore[union-attr]
            tg.cancel_scope.cancel()
    readable = "waiting for a human decision: pay.send: amount £15,000.00 is above £10,000.00"
    assert handle.status_message == readable  # type: ignore[union-attr]
    assert (task.status, task.status_message) == ("working", readable)


def dirk_mcp(db: Path, *flags: str) -> list[str]:
    command = [sys.executable, "-m", "kernel", "mcp", "--db", str(db), "--operator", "rui"]
    return [*command, *flags]


async def listed_over_stdio(db: Path, *flags: str) -> tuple[str, str]:
    """``dirk mcp`` as a host launches it, following the journal: list_escalations' first
    text and its escalation's recorded detail."""
    command = dirk_mcp(db, *flags)
    async with Client(StdioServerParameters(command=command[0], args=command[1:])) as c:
        listed = await c.call_tool("list_escalations", {})
    assert listed.structured_content is not None
    [item] = listed.structured_content["result"]["escalations"]
    return texts(listed)[0], str(item["detail"])


async def test_dirk_mcp_takes_the_currency_and_none_leaves_the_units_as_recorded(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with memory_kernel(db, PAY, adapters={"bank": Bank()}) as kernel:
        await escalate(kernel)
    recorded = "pay.send: amount 1500000 is above 1000000"
    shown, detail = await listed_over_stdio(db)
    assert "amount $15,000.00 is above $10,000.00" in shown and detail == recorded
    shown, detail = await listed_over_stdio(db, "--currency", "gbp")
    assert "amount £15,000.00 is above £10,000.00" in shown and detail == recorded
    shown, detail = await listed_over_stdio(db, "--currency", "none")
    assert recorded in shown and "$" not in shown and detail == recorded


async def test_dirk_mcp_refuses_a_currency_that_is_no_code(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "j.db"):
        pass
    done = await anyio.run_process(
        dirk_mcp(tmp_path / "j.db", "--currency", "dollars"), check=False, stdin=subprocess.DEVNULL
    )
    stderr = done.stderr.decode()
    assert done.returncode == 2, stderr
    assert "BAD_ARGUMENT" in stderr and "--currency" in stderr and "Traceback" not in stderr
