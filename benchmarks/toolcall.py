"""P16: the latency one governed tool call adds to the bare tool call, in process on SQLite.

What a framework adapter does per call (``kernel.frameworks.Gate.call``, the same
path for the Agents SDK, PydanticAI and LangGraph): ``Kernel.propose`` keyed by a
tool-call id, judged, executed by the adapter, answered EXECUTED. The bare call is
the adapter's ``execute`` alone. Calls go one at a time (a model waits for each
tool's answer), on a journal with ``synchronous=FULL``, telemetry off; the first
calls warm up and are not counted. Goal: at most P3's p50 + 0.2 ms, in the same run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.flows import PACK, BenchmarkFailed, NoopAdapter
from benchmarks.report import Figure
from kernel import DecisionVerdict, Manifest, Principal, open_kernel
from kernel.adapters import ExecutionIntent
from kernel.config import KernelConfig, Ports, Storage
from kernel.frameworks import Gate
from kernel.telemetry import Telemetry
from kernel.testing import SeededIds

# The benchmark's host vouches for one local user, as a single-user host would.
HOST_PRINCIPAL = Principal(tenant="bench", user="bench")

WARMUP = 20
ADDED_OVER_P3_US = 200.0
"""The goal: a governed call adds at most P3's p50 plus this much."""


@dataclass(frozen=True)
class ToolCallRun:
    """Per call (ns): the governed call and the bare one."""

    governed_ns: list[int]
    bare_ns: list[int]

    def added_us(self, q: float) -> float:
        """The ``q`` quantile of the governed calls minus the bare call's median, in us."""
        ordered = sorted(self.governed_ns)
        bare = sorted(self.bare_ns)[len(self.bare_ns) // 2]
        return (ordered[min(len(ordered) - 1, int(q * len(ordered)))] - bare) / 1000


async def run_tool_calls(path: Path, calls: int) -> ToolCallRun:
    """Make ``calls`` governed tool calls one at a time, and as many bare ones.

    Raises:
        BenchmarkFailed: when a governed call was not executed.
    """
    adapter = NoopAdapter()
    intent = ExecutionIntent(key="bare", kind="bench.order", adapter="noop", params={"quantity": 1})
    bare: list[int] = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        await adapter.execute(intent)
        bare.append(time.perf_counter_ns() - start)
    governed: list[int] = []
    async with open_kernel(
        path,
        packs=[PACK],
        adapters={"noop": adapter},
        allow=["tools"],
        config=KernelConfig(
            principal=HOST_PRINCIPAL,
            ports=Ports(ids=SeededIds(15)),
            storage=Storage(synchronous="FULL"),
            telemetry=Telemetry(None),
        ),
    ) as kernel:
        await kernel.handshake(
            Manifest(agent_id="tools", version="1.0.0", capabilities=["bench.order"])
        )
        gate = Gate(kernel, "tools", PACK)
        for n in range(WARMUP + calls):
            start = time.perf_counter_ns()
            decision = await gate.call(
                "bench_order", {"quantity": 1}, conversation=None, tool_call_id=f"call-{n}"
            )
            took = time.perf_counter_ns() - start
            if decision.verdict is not DecisionVerdict.EXECUTED:
                raise BenchmarkFailed(f"P16: call {n} was {decision.message()}")
            if n >= WARMUP:
                governed.append(took)
    return ToolCallRun(governed_ns=governed, bare_ns=bare)


def toolcall_figures(runs: list[ToolCallRun], p3_p50_us: list[float]) -> list[Figure]:
    """P16: added latency per governed tool call, p50 and p99; the goal is P3's p50 + 0.2 ms."""
    goal = statistics.median(p3_p50_us) + ADDED_OVER_P3_US if p3_p50_us else None
    shape = {
        "calls_per_run": len(runs[0].governed_ns),
        "bare_call_ns": statistics.median(sorted(r.bare_ns)[len(r.bare_ns) // 2] for r in runs),
        "goal": "P3 p50 + 200 us, same run" if goal is not None else "P3 not measured",
    }
    return [
        Figure(
            "P16",
            "added latency of one governed tool call (Gate.call) over the bare call, p50",
            "us",
            [r.added_us(0.5) for r in runs],
            goal=goal,
            lower_is_better=True,
            extra=shape,
        ),
        Figure(
            "P16.99",
            "  same, p99",
            "us",
            [r.added_us(0.99) for r in runs],
            lower_is_better=True,
        ),
    ]
