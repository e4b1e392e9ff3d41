"""``python -m benchmarks.postgres [--quick] [--json PATH]``: the journal on PostgreSQL (P10).

Starts a throwaway server (as the tests do: initdb and pg_ctl in a temporary
directory on a free 127.0.0.1 port; as the ``postgres`` user when run as root)
and measures in the same run (``python -m benchmarks`` includes these figures):

- P10: P1 (durable flows/s through the real kernel) on PostgreSQL; P10r: its
  ratio to P1 on SQLite in the same round (goal >= 0.7); P10b: a baseline, raw
  group-committed COPY of the same rows in transactions of the same size on
  the same server, as flows/s.
- P11: failover: SIGKILL of a writing kernel until a waiting standby has
  committed its first event (ms). Goal: under 1 s on loopback.
- P12: follower lag: from an append's return to a follower in another
  connection (follow_journal, LISTEN/NOTIFY) having read it, p50 and p99 (ms).
  Goal: p99 under 50 ms.

Goals are reported, never asserted. Needs the ``dir-kernel[postgres]`` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
P1_RATIO_GOAL = 0.7
P10_GOAL = 8_000.0
"""Issue 35: durable flows/s with the journal on PostgreSQL (5,867 in the last full run)."""
FAILOVER_GOAL_MS = 1000.0
LAG_P99_GOAL_MS = 50.0


def copy_baseline(url: str, per_transaction: int) -> tuple[int, float]:
    """COPY the events of the journal at ``url`` into a fresh table, ``per_transaction`` rows
    per transaction (each moving a head row, as the kernel's do); return rows and seconds."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT seq, type, dfid, body, hash FROM events ORDER BY seq"
        ).fetchall()
        conn.execute("CREATE TABLE baseline (LIKE events INCLUDING ALL)")
        conn.execute("CREATE TABLE baseline_head (id INT PRIMARY KEY, seq BIGINT)")
        conn.execute("INSERT INTO baseline_head VALUES (1, 0)")
        start = time.perf_counter()
        for at in range(0, len(rows), per_transaction):
            chunk = rows[at : at + per_transaction]
            with conn.transaction(), conn.cursor() as cur:
                cur.execute("UPDATE baseline_head SET seq = %s WHERE id = 1", (chunk[-1][0],))
                sql = "COPY baseline (seq, type, dfid, body, hash) FROM STDIN (FORMAT BINARY)"
                with cur.copy(sql) as copy:
                    copy.set_types(["int8", "text", "text", "bytea", "bytea"])
                    for row in chunk:
                        copy.write_row(row)
        return len(rows), time.perf_counter() - start


def p1(where: str | Path, flows: int) -> dict[str, float]:
    from benchmarks.flows import run_flows

    run = anyio.run(run_flows, where, flows)
    return {
        "flows_per_s": run.flows_per_s,
        "events": run.events,
        "transactions": run.transactions,
        "events_per_flow": run.events / run.flows,
    }


def _python(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.postgres", *args],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def failover(server: Any) -> float:
    """SIGKILL a writer appending in a loop; return ms until the standby's first commit."""
    url = server.new_url()
    writer = _python("_writer", url)
    standby: subprocess.Popen[str] | None = None
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == "ready\n"
        standby = _python("_standby", url)
        database = url.rsplit("/", 1)[1]
        waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        while server.admin(waiting, database)[0][0] < 1:
            time.sleep(0.005)
        killed = time.time()
        os.kill(writer.pid, signal.SIGKILL)
        assert standby.stdout is not None
        committed = float(standby.stdout.readline())
        return (committed - killed) * 1000
    finally:
        for proc in (writer, standby):
            if proc is not None:
                proc.kill()
                proc.wait()


async def _writer(url: str) -> None:
    from kernel.core.events import Draft, TriggerFired
    from kernel.journal.opening import open_journal

    async with open_journal(url) as journal:
        n = 0
        while True:
            await journal.append([Draft(payload=TriggerFired(topic="w", facts={"n": n}))] * 10)
            if n == 0:
                print("ready", flush=True)
            n += 1


async def _standby(url: str) -> None:
    from kernel.core.events import Draft, TriggerFired
    from kernel.journal.opening import open_journal

    async with open_journal(url) as journal:
        await journal.append([Draft(payload=TriggerFired(topic="standby", facts={}))])
        print(repr(time.time()), flush=True)


async def follower_lag(url: str, batches: int) -> list[float]:
    """Append ``batches`` batches; return ms from each append's return to a follower's read."""
    from kernel.core.events import Draft, TriggerFired
    from kernel.journal.follow import follow_journal
    from kernel.journal.opening import open_journal

    returned: dict[int, float] = {}
    read: dict[int, float] = {}
    async with open_journal(url) as journal:
        await journal.append([Draft(payload=TriggerFired(topic="lag", facts={}))])

        async def follow() -> None:
            async with contextlib.aclosing(follow_journal(url, 2)) as stream:
                async for batch in stream:
                    now = time.perf_counter()
                    for event in batch:
                        read[event.seq] = now
                    if len(read) == batches:
                        return

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            for _ in range(batches):
                [event] = await journal.append([Draft(payload=TriggerFired(topic="l", facts={}))])
                returned[event.seq] = time.perf_counter()
                await anyio.sleep(0.002)  # an offered load, not a wait for something
    return [max(0.0, read[seq] - returned[seq]) * 1000 for seq in returned]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(quick: bool) -> dict[str, Any]:
    """Measure P10-P12 on a throwaway server; return the samples.

    Raises:
        Unavailable: no server can be started here (the reason in its message).
    """
    sys.path.insert(0, str(ROOT))
    from tests.support.postgres import throwaway_server

    repeats, flows, failovers, lags = (2, 400, 3, 200) if quick else (5, 4000, 10, 1000)
    sqlite, pg, copy, ratios = [], [], [], []
    with throwaway_server() as server, tempfile.TemporaryDirectory() as tmp:
        for n in range(repeats):
            sqlite.append(p1(Path(tmp) / f"p1-{n}.db", flows)["flows_per_s"])
            url = server.new_url()
            run = p1(url, flows)
            pg.append(run["flows_per_s"])
            ratios.append(pg[-1] / sqlite[-1])
            rows, seconds = copy_baseline(url, max(1, round(run["events"] / run["transactions"])))
            copy.append(rows / seconds / run["events_per_flow"])
        times = [failover(server) for _ in range(failovers)]
        lag = anyio.run(follower_lag, server.new_url(), lags)
    return {
        "flows": flows,
        "p1_postgres": pg,
        "p1_sqlite": sqlite,
        "ratio": ratios,
        "copy_baseline": copy,
        "failover_ms": times,
        "lag_ms": lag,
    }


def figures(quick: bool) -> list[Any]:
    """Return P10-P12 as figures of ``python -m benchmarks`` (skipped, saying why, if no server)."""
    from benchmarks.report import Figure
    from tests.support.postgres import Unavailable

    try:
        got = measure(quick)
    except Unavailable as exc:
        return [Figure("P10", f"journal on PostgreSQL: skipped: {exc}", "", skipped=True)]
    lag = got["lag_ms"]
    return [
        Figure(
            "P10",
            "P1 on PostgreSQL (durable flows/s)",
            "flows/s",
            got["p1_postgres"],
            goal=P10_GOAL,
            extra={"p1_sqlite_same_run": got["p1_sqlite"]},
        ),
        Figure("P10r", "P10 / P1 on SQLite, same round", "ratio", got["ratio"], goal=P1_RATIO_GOAL),
        Figure("P10b", "raw group-committed COPY of P10's rows", "flows/s", got["copy_baseline"]),
        Figure(
            "P11",
            "failover: writer SIGKILLed -> standby's first commit",
            "ms",
            got["failover_ms"],
            goal=FAILOVER_GOAL_MS,
            lower_is_better=True,
        ),
        Figure(
            "P12",
            "follower lag p99 (append returned -> LISTENing follower read it)",
            "ms",
            [percentile(lag, 0.99)],
            goal=LAG_P99_GOAL_MS,
            lower_is_better=True,
            extra={"p50_ms": percentile(lag, 0.5), "samples": len(lag)},
        ),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Measure P10-P12 alone and print them (``python -m benchmarks`` includes them too)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.postgres")
    parser.add_argument("--quick", action="store_true", help="small runs, few repeats")
    parser.add_argument("--json", metavar="PATH", help="also write the samples here")
    args = parser.parse_args(argv)
    from benchmarks.report import table

    found = figures(args.quick)
    print(table(found))
    if args.json:
        record = {f.id: f.to_json() for f in found}
        Path(args.json).write_text(json.dumps(record, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("_writer", "_standby"):
        anyio.run({"_writer": _writer, "_standby": _standby}[sys.argv[1]], sys.argv[2])
    else:
        sys.exit(main())
