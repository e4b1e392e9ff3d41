"""P8: resident memory growth of a kernel between two counts of completed flows.

``python -m benchmarks.memory --first N --second M [--dir DIR]`` runs in a
process of its own (so nothing the other figures allocated is counted): it
drives the benchmark's happy-path flows through one kernel, and when N and
then M flows have closed it collects garbage and reads the resident set size
(``/proc/self/statm``). It prints one JSON object. Growth is
``(rss(M) - rss(N)) / rss(N)``: a kernel that keeps nothing per finished
flow grows by its caches' warm-up only. The kernel keeps the last
``keep_finished`` finished flows in memory (10,000 by default): below that
count the growth is the cache filling, so ``--keep-finished`` lowers it for
small counts (the quick run).

``--workload memory`` (P8.m) makes every flow a governed memory write: agents
alternate ``memory.add_fact`` and ``memory.query`` over 64 names and topics, so
the memory itself stays the same size and any growth is what the kernel keeps
per intent or per flow tree (idempotency records, queries by tree).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio

from agents_sdk import Manifest, Proposal, WorkingContext
from benchmarks.flows import PACK, STATE, TOPIC, BenchmarkFailed, InstantAgent, NoopAdapter
from kernel import FlowStatus, Principal, open_kernel
from kernel.config import KEEP_FINISHED, KernelConfig, Limits, Ports, Storage
from kernel.memory import MEMORY_PACK
from kernel.telemetry import Telemetry
from kernel.testing import SeededIds

# The benchmark's host vouches for one local user, as a single-user host would.
HOST_PRINCIPAL = Principal(tenant="bench", user="bench")

WORKLOADS = ("orders", "memory")
NAMES = 64
"""Fact names and query topics the memory workload cycles through."""


class MemoryAgent(InstantAgent):
    """Writes a fact on one flow, queries memory on the next, over a fixed set of names."""

    def __init__(self, agent_id: str) -> None:
        self.manifest = Manifest(
            agent_id=agent_id,
            version="1.0.0",
            capabilities=["memory.add_fact", "memory.query"],
            subscriptions=["bench"],
        )
        self._flows = 0

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        self._flows += 1
        n = self._flows % NAMES
        if self._flows % 2:
            policy = {"kind": "memory.add_fact", "name": f"bench.note.{n}", "value": str(n)}
        else:
            policy = {"kind": "memory.query", "topic": f"note {n}"}
        return ctx.propose(policy, explain="benchmark", confidence=0.9)


PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    """Return this process's resident set size in bytes (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


async def grow(
    path: Path,
    marks: list[int],
    agents: int = 4,
    outstanding: int = 256,
    keep_finished: int = KEEP_FINISHED,
    workload: str = "orders",
) -> list[int]:
    """Close flows until each count in ``marks`` is reached; return the RSS at each mark."""
    names = [f"agent-{i}" for i in range(agents)]
    adapter = NoopAdapter()
    memory = workload == "memory"
    sizes: list[int] = []
    async with open_kernel(
        path,
        packs=[PACK, MEMORY_PACK] if memory else [PACK],
        adapters={"noop": adapter},
        allow=names,
        config=KernelConfig(
            principal=HOST_PRINCIPAL,
            ports=Ports(ids=SeededIds(5)),
            storage=Storage(synchronous="FULL"),
            limits=Limits(keep_finished=keep_finished),
            telemetry=Telemetry(None),
        ),
    ) as kernel:
        await kernel.trigger("bench.setup", STATE, source="benchmark")
        for name in names:
            await kernel.register(MemoryAgent(name) if memory else InstantAgent(name))
        done = 0
        for mark in marks:
            triggers = iter(range((mark - done) // agents))

            async def fire(triggers: Iterator[int]) -> None:
                for _ in triggers:  # shared by every firing task
                    await kernel.trigger(TOPIC, source="benchmark")

            async with anyio.create_task_group() as tg:
                for _ in range(outstanding):
                    tg.start_soon(fire, triggers)
            await kernel.wait_quiet()
            done = mark
            closed = kernel.finished().get(FlowStatus.CLOSED, 0)
            if closed != mark or adapter.calls != (0 if memory else mark):
                raise BenchmarkFailed(f"P8: {closed} flows closed of {mark}")
            gc.collect()
            sizes.append(resident_bytes())
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__)
    parser.add_argument("--first", type=int, default=100_000)
    parser.add_argument("--second", type=int, default=200_000)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--keep-finished", type=int, default=KEEP_FINISHED)
    parser.add_argument("--workload", choices=WORKLOADS, default="orders")
    parser.add_argument("--dir", help="where the journal is written (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.first % args.agents or args.second % args.agents or args.second <= args.first:
        print("error: counts must be multiples of --agents, second > first", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="dir-bench-p8-", dir=args.dir) as tmp:
        try:
            first, second = anyio.run(
                grow,
                Path(tmp) / "p8.db",
                [args.first, args.second],
                args.agents,
                256,
                args.keep_finished,
                args.workload,
            )
        except BenchmarkFailed as exc:
            print(f"error: BENCHMARK_FAILED: {exc}", file=sys.stderr)
            return 1
    print(
        json.dumps(
            {
                "first_flows": args.first,
                "second_flows": args.second,
                "rss_first": first,
                "rss_second": second,
                "growth": (second - first) / first,
                "bytes_per_flow": (second - first) / (args.second - args.first),
                "keep_finished": args.keep_finished,
                "workload": args.workload,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
