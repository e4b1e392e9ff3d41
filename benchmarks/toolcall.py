"""P16: the latency one governed tool call adds to the bare tool call, in process on SQLite.

What a framework adapter does per call (``kernel.frameworks.Gate.call``, the same
path for the Agents SDK, PydanticAI and LangGraph): ``Kernel.propose`` keyed by a
tool-call id, judged, executed by the adapter, answered EXECUTED. The bare call is
the adapter's ``execute`` alone. Calls go one at a time (a model waits for each
tool's answer), on a journal with ``synchronous=FULL``, telemetry off; the first
calls warm up and are not counted. Goal: at most P3's p50 + 0.2 ms, in the same run.

P16.r: the same for a kind marked read-only (``bench.lookup``): judged and recorded as
any other, its commits without a sync of their own (``Storage.group_reads``). Goal: its
p99 at most 0.5 ms.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from benchmarks.flows import PACK, BenchmarkFailed, NoopAdapter
from benchmarks.report import Figure
from kernel import DecisionVerdict, Manifest, open_kernel
from kernel.adapters import ExecutionIntent
from kernel.config import KernelConfig, Ports, Storage
from kernel.core.events import Principal
from kernel.frameworks import Gate
from kernel.policy import PolicyKind, PolicyPack
from kernel.telemetry import Telemetry
from kernel.testing import SeededIds

WARMUP = 20
ADDED_OVER_P3_US = 200.0
"""The goal: a governed call adds at most P3's p50 plus this much."""
READ_ONLY_P99_US = 500.0
"""The goal: a read-only kind's call adds at most this much at p99."""


class Lookup(PolicyKind, tag="bench.lookup"):
    """A read: changes nothing in the world."""

    adapter: ClassVar[str] = "noop"
    read_only: ClassVar[bool] = True

    quantity: int


LOOKUP = PolicyPack(name="bench-lookup", version="1.0.0", kinds=(Lookup,))


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


async def run_tool_calls(path: Path, calls: int, read_only: bool = False) -> ToolCallRun:
    """Make ``calls`` governed tool calls one at a time, and as many bare ones.

    ``read_only``: of the read-only kind ``bench.lookup`` (P16.r), else ``bench.order``.

    Raises:
        BenchmarkFailed: when a governed call was not executed.
    """
    adapter = NoopAdapter()
    pack, tool = (LOOKUP, "bench_lookup") if read_only else (PACK, "bench_order")
    intent = ExecutionIntent(key="bare", kind="bench.order", adapter="noop", params={"quantity": 1})
    bare: list[int] = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        await adapter.execute(intent)
        bare.append(time.perf_counter_ns() - start)
    governed: list[int] = []
    async with open_kernel(
        path,
        packs=[pack],
        adapters={"noop": adapter},
        allow=["tools"],
        config=KernelConfig(
            # The benchmark's host vouches for one local user (docs/identity.md).
            principal=Principal(tenant="local", user="bench"),
            ports=Ports(ids=SeededIds(15)),
            storage=Storage(synchronous="FULL"),
            telemetry=Telemetry(None),
        ),
    ) as kernel:
        await kernel.handshake(
            Manifest(agent_id="tools", version="1.0.0", capabilities=[tool.replace("_", ".")])
        )
        gate = Gate(kernel, "tools", pack)
        for n in range(WARMUP + calls):
            start = time.perf_counter_ns()
            decision = await gate.call(
                tool, {"quantity": 1}, conversation=None, tool_call_id=f"call-{n}"
            )
            took = time.perf_counter_ns() - start
            if decision.verdict is not DecisionVerdict.EXECUTED:
                raise BenchmarkFailed(f"P16: call {n} was {decision.message()}")
            if n >= WARMUP:
                governed.append(took)
    return ToolCallRun(governed_ns=governed, bare_ns=bare)


def toolcall_figures(
    runs: list[ToolCallRun], p3_p50_us: list[float], reads: list[ToolCallRun] | None = None
) -> list[Figure]:
    """P16: added latency per governed tool call, p50 and p99; the goal is P3's p50 + 0.2 ms.

    P16.r, P16.r99: the same for the read-only kind (``reads``), goal p99 <= 0.5 ms.
    """
    goal = statistics.median(p3_p50_us) + ADDED_OVER_P3_US if p3_p50_us else None
    said = "P3 p50 + 200 us, same run" if goal is not None else "P3 not measured"
    name = "added latency of one governed tool call (Gate.call) over the bare call"
    figures = added_figures("P16", name, runs, goal, said)
    if reads:
        name = "  same, a read-only kind's call (commits without a sync of their own)"
        figures += added_figures("P16.r", name, reads, None, "", p99_goal=READ_ONLY_P99_US)
    return figures


class Added(Protocol):
    """A run of calls, governed and bare (ns each), with the added latency at a quantile."""

    @property
    def governed_ns(self) -> list[int]: ...

    @property
    def bare_ns(self) -> list[int]: ...

    def added_us(self, q: float) -> float: ...


def added_figures(
    figure_id: str,
    name: str,
    runs: Sequence[Added],
    goal: float | None,
    said: str,
    *,
    p99_goal: float | None = None,
) -> list[Figure]:
    """The added p50 (``goal`` on it, ``said`` how it was set) and p99 of ``runs``."""
    shape: dict[str, Any] = {
        "calls_per_run": len(runs[0].governed_ns),
        "bare_call_ns": statistics.median(sorted(r.bare_ns)[len(r.bare_ns) // 2] for r in runs),
    }
    if said:
        shape["goal"] = said
    return [
        Figure(
            figure_id,
            f"{name}, p50",
            "us",
            [r.added_us(0.5) for r in runs],
            goal=goal,
            lower_is_better=True,
            extra=shape,
        ),
        Figure(
            f"{figure_id}99" if "." in figure_id else f"{figure_id}.99",
            "  same, p99",
            "us",
            [r.added_us(0.99) for r in runs],
            goal=p99_goal,
            lower_is_better=True,
        ),
    ]
