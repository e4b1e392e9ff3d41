"""P16.g: the latency the governing MCP gateway adds to an MCP tool call, on SQLite.

An MCP client calls the upstream's tool (``benchmarks/gateway_upstream.py``, a process
over stdio) bare, then the same tool through ``kernel.gateway`` (in process: the client
speaks MCP to the gateway's server, which proposes the call through ``Kernel.propose``,
judged, executed by calling the upstream over its own stdio session, answered). Calls go
one at a time, each with its own call id, on a journal with ``synchronous=FULL``,
telemetry off; the first calls warm up and are not counted. Goal: at most P16's p50 +
1 ms, in the same run. Needs the ``mcp`` extra; without it the figure is skipped.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.report import Figure
from benchmarks.toolcall import added_figures

WARMUP = 20
ADDED_OVER_P16_US = 1_000.0
"""The goal: the gateway adds at most P16's p50 plus this much."""


@dataclass(frozen=True)
class GatewayRun:
    """Per call (ns): through the gateway, and bare to the same upstream."""

    governed_ns: list[int]
    bare_ns: list[int]

    def added_us(self, q: float) -> float:
        """The ``q`` quantile of the governed calls minus the same quantile bare, in us."""
        return (_quantile(self.governed_ns, q) - _quantile(self.bare_ns, q)) / 1000


def _quantile(samples: list[int], q: float) -> int:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def available() -> str | None:
    """Why P16.g cannot run here (None: it can)."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        return "the mcp extra is not installed (pip install -e '.[mcp]')"
    return None


async def run_gateway_calls(path: Path, calls: int) -> GatewayRun:
    """Make ``calls`` MCP tool calls bare, then as many through the gateway, one at a time."""
    from mcp import Client, StdioServerParameters

    from kernel import KernelConfig
    from kernel.config import Storage
    from kernel.core.events import Principal
    from kernel.gateway import CALL_META, config_of, open_gateway
    from kernel.telemetry import Telemetry

    command = [sys.executable, "-m", "benchmarks.gateway_upstream"]
    params = StdioServerParameters(command=command[0], args=command[1:])
    bare: list[int] = []
    # The same client the gateway calls its upstreams with (mcp.Client over stdio).
    async with Client(params) as session:
        for n in range(WARMUP + calls):
            start = time.perf_counter_ns()
            await session.call_tool("lookup", {"quantity": 1})
            if n >= WARMUP:
                bare.append(time.perf_counter_ns() - start)
    config = config_of(
        {
            "upstreams": {"up": {"command": command}},
            "tools": {"up.lookup": {"impact": "LOW_IMPACT"}},
        }
    )
    kernel_config = KernelConfig(
        principal=Principal(tenant="local", user="bench"),
        storage=Storage(synchronous="FULL"),
        telemetry=Telemetry(None),
    )
    governed: list[int] = []
    async with open_gateway(config, path, agents=["tools"], kernel_config=kernel_config) as gw:
        async with Client(gw.server) as client:
            for n in range(WARMUP + calls):
                meta: Any = {CALL_META: f"call-{n}"}
                start = time.perf_counter_ns()
                result = await client.call_tool("up_lookup", {"quantity": 1}, meta=meta)
                took = time.perf_counter_ns() - start
                if result.is_error:
                    raise RuntimeError(f"P16.g: call {n} failed: {result.content}")
                if n >= WARMUP:
                    governed.append(took)
    return GatewayRun(governed_ns=governed, bare_ns=bare)


def gateway_figures(runs: list[GatewayRun], p16_p50_us: list[float]) -> list[Figure]:
    """P16.g: added latency per call through the gateway, p50 and p99."""
    goal = statistics.median(p16_p50_us) + ADDED_OVER_P16_US if p16_p50_us else None
    said = "P16 p50 + 1 ms, same run" if goal is not None else "P16 not measured"
    name = "added latency of an MCP tool call through the gateway over the bare call"
    return added_figures("P16.g", name, runs, goal, said)
