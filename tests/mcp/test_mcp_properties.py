"""Whatever arguments a host sends, every tool answers a structured verdict; the kernel runs on."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.mcp_kernel import memory_kernel, require_mcp

require_mcp()

from mcp import Client  # noqa: E402

from kernel.core.reasons import CliError, ReasonCode  # noqa: E402
from kernel.mcp import Embedded, Identity, Principal, build_server  # noqa: E402

CODES = {str(c) for c in ReasonCode} | {str(c) for c in CliError}
VERDICTS = {"ACCEPTED", "REJECTED", "ESCALATED", "APPLIED", "QUEUED", "REFUSED", "OK", "ERROR"}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=30)
    | st.sampled_from(["memory.add_fact", "never use eval()", "x" * 70_000, "approve", "1"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["kind", "name", "value", "text", "x"]), inner, max_size=3
        )
    ),
    max_leaves=8,
)

# Each tool with its required arguments (always sent, with any value) and optional ones.
TOOLS: dict[str, tuple[list[str], list[str]]] = {
    "add_fact": (["name", "value"], ["confidence", "explain"]),
    "add_constraint": (["text"], ["priority", "triggered_by", "explain"]),
    "record_decision": (["text"], ["rationale", "refs", "explain"]),
    "query_memory": (["topic"], ["explain"]),
    "propose": (["policy"], ["explain", "confidence"]),
    "get_memory_context": ([], ["max_facts"]),
    "trace_provenance": ([], ["fact", "seq"]),
    "time_travel": (["at"], []),
    "simulate_timeline": ([], ["constraint", "at", "priority", "exclude"]),
    "search_rules": (["q"], ["k"]),
    "compile_memory": (["prompt"], ["k"]),
    "get_rule": (["item_id"], []),
    "why": (["item_id"], []),
    "list_escalations": ([], []),
    "review": (["dfid"], []),
    "decide": (["dfid", "decision", "reason"], ["params", "action_hash"]),
    "agent_status": (["agent_id"], ["status", "reason"]),
}


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    tool = draw(st.sampled_from(sorted(TOOLS)))
    required, optional = TOOLS[tool]
    args = {name: draw(json_values) for name in required}
    for name in draw(st.lists(st.sampled_from(optional), unique=True)) if optional else []:
        args[name] = draw(json_values)
    role = draw(st.sampled_from(["agent", "operator"]))
    return role, tool, args


@settings(max_examples=40, derandomize=True, deadline=None)
@given(st.lists(calls(), min_size=1, max_size=4))
def test_any_arguments_get_a_structured_answer(
    sequence: list[tuple[str, str, dict[str, Any]]],
) -> None:
    async def scenario(path: Path) -> None:
        async with memory_kernel(path) as kernel:
            backend = Embedded(kernel)
            for role, tool, args in sequence:
                who = Principal(role=role, name="ide" if role == "agent" else "rui")  # type: ignore[arg-type]
                async with Client(build_server(backend, Identity(who))) as c:
                    result = await c.call_tool(tool, args)
                body = result.structured_content
                assert body is not None, (tool, args, result)
                assert body["verdict"] in VERDICTS
                if body["verdict"] in ("ERROR", "REJECTED", "REFUSED"):
                    assert body["reason_code"] in CODES
                assert body["reason_code"] != "KERNEL_FAULT", body
                assert result.is_error == (body["verdict"] == "ERROR")
            assert kernel.stopped is None

    with tempfile.TemporaryDirectory() as tmp:
        anyio.run(scenario, Path(tmp) / "j.db")
