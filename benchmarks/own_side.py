"""One side of ``python -m benchmarks.pair own``: P1 and P5 with the harness of its tree.

Run as ``python -P path/to/own_side.py FLOWS [--p5]`` from the root of a tree (the working
tree, or a whole ``git archive`` of an older revision) with that root on ``PYTHONPATH``:
``benchmarks.flows.run_flows`` and ``benchmarks.replay.run_replay`` are that tree's own,
so a revision whose kernel the working tree's harness cannot drive is measured as it
measured itself. Only those two, and ``kernel.audit.open_journal``, are asked of it:
names every tree of this repository since P5 existed has.

What each side's harness calls an event differs (a tree that stores one row for two
events counts rows), so the events are counted here, as read: the events a read-only
scan of the journal yields, derived ones included. The figures are per flow and per event
as read, so two trees compare for the same work. One JSON line on stdout.
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

from benchmarks.flows import run_flows
from benchmarks.replay import run_replay
from kernel.audit import open_journal


async def read_counts(path: Path) -> tuple[int, int]:
    """Return the journal's rows (its head seq) and the events a scan of it yields."""
    async with open_journal(path, readonly=True) as journal:
        events = 0
        async for batch in journal.scan(hashes=False):
            events += len(batch)
        return journal.head_seq, events


def figures(flows: int, run: Any, rows: int, events: int, cpu_s: float) -> dict[str, float]:
    """The side's figures from its P1 run (``run``, a FlowRun) and its journal's counts."""
    return {
        "P1": run.flows / run.seconds,
        "C1": cpu_s / flows * 1e6,
        "rows per flow": rows / flows,
        "events per flow": events / flows,
    }


def replay_figures(flows: int, replayed: Any, rows: int, events: int) -> dict[str, float]:
    """P5 and P5.v of a side's ReplayRun, per flow and per event as read (and per row)."""
    out = {
        "P5 flows/s": flows / replayed.replay_s,
        "P5.v flows/s": flows / replayed.verify_s,
        "P5 events/s": events / replayed.replay_s,
        "P5.v events/s": events / replayed.verify_s,
        "P5 rows/s": rows / replayed.replay_s,
        "P5.v rows/s": rows / replayed.verify_s,
    }
    # A harness that times its CPU apart (not every revision's does).
    for key, name in (("replay_cpu_s", "P5"), ("verify_cpu_s", "P5.v")):
        cpu = getattr(replayed, key, 0.0)
        if cpu:
            out[f"{name} cpu us/flow"] = cpu / flows * 1e6
    return out


def main(argv: list[str]) -> int:
    """Run P1 (and P5 with ``--p5``) once on a fresh journal; print the figures as JSON."""
    flows = int(argv[0])
    with tempfile.TemporaryDirectory(prefix="dir-pair-own-") as tmp:
        path = Path(tmp) / "p1.db"
        run = anyio.run(run_flows, path, flows, backend="asyncio")
        rows, events = anyio.run(read_counts, path, backend="asyncio")
        out = figures(flows, run, rows, events, run.cpu_seconds)
        if "--p5" in argv:
            before = resource.getrusage(resource.RUSAGE_SELF)
            replayed = anyio.run(run_replay, path, backend="asyncio")
            after = resource.getrusage(resource.RUSAGE_SELF)
            out |= replay_figures(flows, replayed, rows, events)
            out["P5 all cpu us/flow"] = (
                (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / flows * 1e6
            )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
