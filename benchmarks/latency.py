"""P3: the latency the kernel adds to one DecisionFlow, trigger to CLOSED, under a steady load.

Triggers are offered open-loop at a fixed rate (a trigger is fired on schedule
whether or not the earlier ones finished, as a market feed would), one agent
per trigger, so the offered load is ``rate`` flows per second. For each flow
the clock runs from the call to ``kernel.trigger`` until a journal listener
sees its FlowClosed committed; the time the agent spent in ``decide`` (its
think time, not the kernel's) is measured around the call and subtracted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from agents_sdk import Proposal, WorkingContext
from benchmarks.flows import PACK, STATE, TOPIC, BenchmarkFailed, InstantAgent, NoopAdapter
from kernel import FlowStatus, Principal, open_kernel
from kernel.audit import Event
from kernel.config import KernelConfig, Ports, Storage
from kernel.telemetry import Telemetry
from kernel.testing import SeededIds

# The benchmark's host vouches for one local user, as a single-user host would.
HOST_PRINCIPAL = Principal(tenant="bench", user="bench")


class TimedAgent(InstantAgent):
    """The instant agent, timing its own ``decide`` so its think time can be excluded."""

    def __init__(self, agent_id: str) -> None:
        super().__init__(agent_id)
        self.think_ns: dict[str, int] = {}

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        start = time.perf_counter_ns()
        proposal = await super().decide(ctx)
        self.think_ns[ctx.dfid] = self.think_ns.get(ctx.dfid, 0) + time.perf_counter_ns() - start
        return proposal


@dataclass(frozen=True)
class LatencyRun:
    """Added latency per flow (ns), one sample per flow, at ``rate`` flows/s offered."""

    rate: float
    added_ns: list[int]
    achieved_rate: float
    transactions: int = 0
    """Journal commits while the flows ran (one per flow and stage it waited on)."""

    def percentile_us(self, q: float) -> float:
        ordered = sorted(self.added_ns)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000


async def run_latency(path: Path, flows: int, rate: float = 500.0) -> LatencyRun:
    """Offer ``flows`` flows at ``rate`` per second to a kernel on a fresh journal at ``path``.

    Raises:
        BenchmarkFailed: when a flow did not close.
    """
    agent = TimedAgent("agent-0")
    fired: dict[str, int] = {}
    closed: dict[str, int] = {}

    def on_commit(events: Sequence[Event]) -> None:
        now = time.perf_counter_ns()
        for event in events:
            if event.type == "FlowClosed" and event.dfid is not None:
                closed[event.dfid] = now

    async with open_kernel(
        path,
        packs=[PACK],
        adapters={"noop": NoopAdapter()},
        allow=[agent.manifest.agent_id],
        config=KernelConfig(
            principal=HOST_PRINCIPAL,
            ports=Ports(ids=SeededIds(11)),
            storage=Storage(synchronous="FULL"),
            telemetry=Telemetry(None),
        ),
    ) as kernel:
        await kernel.trigger("bench.setup", STATE, source="benchmark")
        await kernel.register(agent)
        kernel.journal.add_listener(on_commit)
        first_tx = kernel.journal.statistics().transactions

        async def fire() -> None:
            start = time.perf_counter_ns()
            [dfid] = await kernel.trigger(TOPIC, source="benchmark")
            fired[dfid] = start

        began = anyio.current_time()
        async with anyio.create_task_group() as tg:
            for n in range(flows):
                # Open loop: the schedule never waits for earlier flows.
                await anyio.sleep_until(began + n / rate)
                tg.start_soon(fire)
        await kernel.wait_quiet()
        achieved = flows / (anyio.current_time() - began)
        transactions = kernel.journal.statistics().transactions - first_tx
        statuses = {str(f.status) for f in kernel.flows() if f.topic == TOPIC}
    if statuses != {str(FlowStatus.CLOSED)} or len(closed) != flows or len(fired) != flows:
        raise BenchmarkFailed(f"P3: expected {flows} CLOSED flows, got statuses {statuses}")
    added = [closed[d] - fired[d] - agent.think_ns.get(d, 0) for d in fired]
    return LatencyRun(rate=rate, added_ns=added, achieved_rate=achieved, transactions=transactions)
