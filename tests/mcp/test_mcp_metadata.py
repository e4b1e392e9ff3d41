"""MCP by the book: titles, annotations and described parameters; prompts, confidences, waits.

Hosts decide from a tool's annotations whether to ask the user first (a read needs
no confirmation, a destructive act does), and a model fills arguments from their
descriptions. A prompt that does not exist is a JSON-RPC error with the spec's code,
not code 0 and a traceback in the log; a confidence is a decimal from 0 to 1, never
``"NaN"``; and a write following a journal whose kernel stopped answers at once, saying why.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.hostile import hostile_text
from tests.support.mcp_kernel import memory_kernel, require_mcp

require_mcp()

from mcp import Client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402
from mcp_types import INVALID_PARAMS, TextContent, Tool  # noqa: E402

from kernel import Kernel  # noqa: E402
from kernel.mcp import Embedded, Follower, Identity, Principal, build_server  # noqa: E402
from kernel.mcp._tools import READ, described  # noqa: E402

AGENT = Principal(role="agent", name="ide")
OPERATOR = Principal(role="operator", name="rui")
HINTS = ("read_only_hint", "destructive_hint", "idempotent_hint", "open_world_hint")


@pytest.fixture
async def kernel(tmp_path: Path) -> AsyncIterator[Kernel]:
    async with memory_kernel(tmp_path / "j.db") as opened:
        yield opened


async def call(c: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await c.call_tool(tool, args)
    assert result.structured_content is not None, result
    return dict(result.structured_content)


async def test_every_tool_has_a_title_annotations_and_described_parameters(
    kernel: Kernel,
) -> None:
    # Each principal lists only its tools (docs/mcp.md): an agent's and an operator's
    # listings together are every tool, the reads in both.
    listed: dict[str, Tool] = {}
    for who, count in ((AGENT, 15), (OPERATOR, 19)):
        async with Client(build_server(Embedded(kernel), Identity(who))) as c:
            mine = (await c.list_tools()).tools
        assert len(mine) == count, who
        listed.update((t.name, t) for t in mine)
    tools = list(listed.values())
    assert len(tools) == 25
    for tool in tools:
        assert tool.title, tool.name
        assert tool.annotations is not None, tool.name
        for hint in HINTS:
            assert isinstance(getattr(tool.annotations, hint), bool), (tool.name, hint)
        assert tool.description and "Args:" not in tool.description, tool.name
        properties = tool.input_schema.get("properties", {})
        for name, schema in properties.items():
            assert schema.get("description"), (tool.name, name)
            # One type per property: portable to hosts that map schemas onto one-type dialects.
            assert isinstance(schema.get("type", "object"), str), (tool.name, name)
    by_name = {t.name: t.annotations for t in tools}
    reads = [n for n, a in by_name.items() if a is not None and a.read_only_hint]
    assert set(reads) == {
        "get_memory_context",
        "fetch_artifact",
        "wait_flow",
        "trace_provenance",
        "time_travel",
        "simulate_timeline",
        "search_rules",
        "compile_memory",
        "get_rule",
        "why",
        "list_escalations",
        "review",
        "admin_list_proposals",
    }
    for name in ("decide", "admin_delete_rule", "admin_update_rule", "agent_status"):
        hints = by_name[name]
        assert hints is not None and hints.destructive_hint and not hints.read_only_hint, name
    # What an accepted proposal or an approval does, an executor does in the world.
    for name in ("propose", "decide"):
        hints = by_name[name]
        assert hints is not None and hints.open_world_hint, name
    assert READ.idempotent_hint and not READ.destructive_hint


def test_a_tool_with_an_undescribed_argument_is_refused_when_the_server_is_built() -> None:
    async def tool(who: Principal, item_id: str, reason: str) -> None:
        """Do something.

        Args:
            item_id: the rule's id.
        """

    with pytest.raises(ValueError, match="reason"):
        described(tool)


async def test_an_unknown_prompt_is_invalid_params_and_logs_no_traceback(
    kernel: Kernel, caplog: pytest.LogCaptureFixture
) -> None:
    async with Client(build_server(Embedded(kernel), Identity(AGENT))) as c:
        prompts = (await c.list_prompts()).prompts
        assert [p.name for p in prompts] == ["apply_rulebook_prompt"]
        assert prompts[0].title
        with caplog.at_level(logging.INFO):
            with pytest.raises(MCPError) as unknown:
                await c.get_prompt("no_such_prompt", {"task": "x"})
            assert unknown.value.code == INVALID_PARAMS
            assert unknown.value.data == {"reason_code": "SCHEMA_INVALID", "field": "name"}
            with pytest.raises(MCPError) as extra:
                await c.get_prompt("apply_rulebook_prompt", {"task": "x", "colour": "red"})
            assert extra.value.code == INVALID_PARAMS
            with pytest.raises(MCPError) as missing:
                await c.get_prompt("apply_rulebook_prompt", {})
            assert missing.value.code == INVALID_PARAMS and "task" in str(missing.value)
            rendered = await c.get_prompt("apply_rulebook_prompt", {"task": "book a room"})
            content = rendered.messages[0].content
            assert isinstance(content, TextContent) and "book a room" in content.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(task=hostile_text())
async def test_a_prompt_argument_is_checked_as_free_text(kernel: Kernel, task: str) -> None:
    async with Client(build_server(Embedded(kernel), Identity(AGENT))) as c:
        try:
            rendered = await c.get_prompt("apply_rulebook_prompt", {"task": task})
        except MCPError as exc:
            # Refused, with the spec's code and the kernel's reason code.
            assert exc.code == INVALID_PARAMS
            assert exc.data["reason_code"] == "SCHEMA_INVALID"
        else:
            content = rendered.messages[0].content
            assert isinstance(content, TextContent) and task in content.text


@pytest.mark.parametrize(
    "confidence", ["NaN", "nan", "Infinity", "1e-3", "1.5", "-0.1", " 0.5", "0x1", 2, -1, True]
)
async def test_a_confidence_that_is_no_decimal_from_0_to_1_is_refused(
    kernel: Kernel, confidence: Any
) -> None:
    async with Client(build_server(Embedded(kernel), Identity(AGENT))) as c:
        answer = await call(c, "add_fact", name="n", value="v", confidence=confidence)
    assert answer["verdict"] == "ERROR"
    assert answer["reason_code"] == "SCHEMA_INVALID" and answer["field"] == "confidence"
    assert "n" not in kernel.projections.memory.facts
    assert not [f for f in kernel.flows() if f.proposal is not None]


@given(value=st.floats(min_value=0, max_value=1) | st.sampled_from(["0", "0.25", "1", "1.000"]))
@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
async def test_a_confidence_as_a_number_or_a_decimal_string_is_recorded_as_a_decimal(
    kernel: Kernel, value: float | str
) -> None:
    async with Client(build_server(Embedded(kernel), Identity(AGENT))) as c:
        answer = await call(c, "add_fact", name="n", value="v", confidence=value)
    assert answer["verdict"] == "ACCEPTED", answer
    proposals = [f.proposal for f in kernel.flows() if f.proposal is not None]
    recorded = proposals[-1].params["confidence"]
    assert isinstance(recorded, str) and 0 <= float(recorded) <= 1
    if isinstance(value, str):
        assert recorded == value  # the scale is the caller's, recorded as written


async def test_a_write_following_a_stopped_kernel_answers_at_once_and_says_why(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with memory_kernel(db) as kernel:
        async with Client(build_server(Embedded(kernel), Identity(AGENT))) as c:
            await call(c, "add_fact", name="a", value="b")
    # The journal ends with KernelStopped: no kernel will take the row, so no wait at all
    # (an hour's wait_s would hold the test for an hour if it waited).
    follower = Follower(str(db), wait_s=3600, answer_s=3600)
    async with Client(build_server(follower, Identity(AGENT))) as c:
        queued = await call(c, "add_fact", name="a", value="c")
    assert queued["verdict"] == "QUEUED" and queued["result"]["inbox_id"] >= 1
    assert "kernel stopped" in queued["detail"] and "dirk serve" in queued["detail"]
    async with Client(build_server(follower, Identity(OPERATOR))) as c:
        act = await call(c, "agent_status", agent_id="ide", status="PASSIVE", reason="night")
    assert act["verdict"] == "QUEUED" and "kernel stopped" in act["detail"]
