"""P16, the governed tool call's added latency: it measures what it says (never a timing)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.report import table
from benchmarks.toolcall import ADDED_OVER_P3_US, run_tool_calls, toolcall_figures
from kernel.audit import open_journal


async def test_p16_makes_governed_calls_each_executed_once_and_on_record(tmp_path: Path) -> None:
    run = await run_tool_calls(tmp_path / "p16.db", 5)
    assert len(run.governed_ns) == 5 and len(run.bare_ns) == 5
    async with open_journal(tmp_path / "p16.db", readonly=True) as journal:
        executed = await journal.read(types=["ExecutionSucceeded"])
    assert len(executed) == 5 + 20  # the warm-up calls are made too, not counted
    [p50, p99] = toolcall_figures([run], [1_000.0])
    assert p50.goal == 1_000.0 + ADDED_OVER_P3_US and p99.id == "P16.99"
    assert "P16" in table([p50, p99])
