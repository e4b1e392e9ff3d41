"""``python -m benchmarks.pair LEVER``: a lever's paired A/B, in whole processes taken in turn.

On a shared machine the absolute figures move with the load; a lever is judged by the ratio
B/A within each pair of runs made in the same minutes (A B, A B, ...: one warm-up pair
dropped), the median of the pairs, and the spread of the pairs beside it. Each run is a fresh
process, so neither side inherits the other's heap, page cache warmth aside.

Levers (A is before, B after):

- ``ids``: random UUIDv4 DFIDs (A) against time-ordered UUIDv7 ones (B).
- ``codec``: bodies deflated with dictionary 1 (A, kernels 0.2.0 and before) against zstd
  with the trained dictionary 2 (B, the current codec); time-ordered ids on both sides.
- ``both``: random ids and dictionary 1 (A, main before this round) against time-ordered
  ids and zstd (B).
- ``helper``: replay and verify in one process (A, ``DIRK_HELPER=off``) against a helper
  process reading and checking the rows while this one folds (B, ``DIRK_HELPER=on``,
  whatever the load: kernel.journal._helper); with ``--p5``, the only figures it moves.
- ``tree``: the kernel at git revision ``--a`` (A) against the working tree (B), for levers
  that change the runtime itself (issue 35's second half): side A runs this harness with
  ``kernel``, ``agents_sdk``, ``policies`` and ``examples`` taken from ``git archive`` of
  that revision. ``--p3 N`` adds P3 (N flows at 500/s) to each run; ``--p2`` adds P2 (P1's
  flows with spans over OTLP/HTTP to a receiver process of the run's own) and S2; ``--p5``
  adds P5 (replay and verify of the run's own P1 journal, events folded per second and
  rows per second, as the runner does);
  ``--p16 N`` adds P16 and P16.r (N governed tool calls one at a time, of an ordinary and of
  a read-only kind).
- ``own``: the whole tree at ``--a`` (A: ``git archive`` of that revision, its kernel and
  its benchmarks) against the working tree (B), each side running P1 (and P5 with
  ``--p5``) with its own harness (benchmarks/own_side.py calls the side's ``run_flows``
  and ``run_replay``), for a revision the working tree's harness cannot drive (issue 45:
  d746a28). The figures are per flow, and per event as read (each side's journal scanned,
  derived events counted), so sides that store a different number of rows per flow compare
  for the same work.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

import anyio

from benchmarks.flows import SPANS_PER_FLOW, FlowRun, open_receiver, run_flows
from benchmarks.latency import LatencyRun, run_latency
from benchmarks.replay import run_replay
from benchmarks.toolcall import ToolCallRun, run_tool_calls
from kernel.journal import codec

LEVERS = {
    "ids": ("random v4 DFIDs", "time-ordered v7 DFIDs"),
    "codec": ("zlib, dictionary 1", "zstd, dictionary 2"),
    "both": ("v4 ids, zlib dictionary 1", "v7 ids, zstd dictionary 2"),
    "helper": ("one process (DIRK_HELPER=off)", "a helper reads and checks (=on)"),
    "tree": ("the kernel at --a", "the working tree"),
    "own": ("the tree at --a, its own harness", "the working tree, its own harness"),
}
ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kernel", "agents_sdk", "policies", "examples")


def checkout(rev: str, into: Path) -> Path:
    """Unpack the kernel's packages at ``rev`` into ``into``, beside this harness; return it.

    Only the measured code comes from ``rev``: the harness (this package) is the working
    tree's, linked in, so both sides run the same workload and figures.
    """
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, *PACKAGES],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    (into / "benchmarks").symlink_to(ROOT / "benchmarks", target_is_directory=True)
    return into


def whole(rev: str, into: Path) -> Path:
    """Unpack the whole tree at ``rev`` (its kernel and its benchmarks) into ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def _own(where: Path, flows: int, p5: bool) -> dict[str, float]:
    """Run one side of ``own``: the tree at ``where`` with its own harness; its figures."""
    out = subprocess.run(
        [sys.executable, "-P", str(ROOT / "benchmarks" / "own_side.py"), str(flows)]
        + (["--p5"] if p5 else []),
        check=True,
        capture_output=True,
        text=True,
        cwd=where,
        env={**os.environ, "PYTHONPATH": str(where)},
    ).stdout
    figures: dict[str, float] = json.loads(out.splitlines()[-1])
    return figures


def _p2(flows: int) -> dict[str, float]:
    """Run P2 once: P1's flows with spans to a receiver process; its figures."""
    with tempfile.TemporaryDirectory(prefix="dir-pair-") as tmp, open_receiver() as receiver:
        path = Path(tmp) / "p2.db"

        async def run() -> tuple[FlowRun, int]:
            r = await run_flows(path, flows, telemetry=receiver.telemetry())
            return r, await receiver.wait_settled(0, flows * SPANS_PER_FLOW)

        r, received = anyio.run(run, backend="asyncio")
    return {
        "P2": r.flows_per_s,
        "P2 with close": r.flows / (r.seconds + r.close_seconds),
        "P2 close s": r.close_seconds,
        "P2 C1": r.cpu_seconds / r.flows * 1e6,
        "S2": received / (flows * SPANS_PER_FLOW),
    }


def _p5(path: Path) -> dict[str, float]:
    """Replay and verify the P1 journal at ``path`` (P5); its figures in events folded per
    second (derived events included: what a reader sees), and in rows per second."""
    run = anyio.run(run_replay, path, backend="asyncio")
    return {
        "P5": run.replay_per_s,
        "P5.v": run.verify_per_s,
        "P5.rows": run.rows_per_s,
        "P5.v.rows": run.verify_rows_per_s,
        "P5 chain": run.events / run.chain_s,
        "P5 projections": run.events / run.projections_s,
        "P5 cpu us/event": run.replay_cpu_s / run.events * 1e6,
        "P5.v cpu us/event": run.verify_cpu_s / run.events * 1e6,
        "P5 helper cpu us/event": run.helper_cpu_s / run.events * 1e6,
    }


def _one(
    lever: str,
    side: str,
    flows: int,
    p3: int = 0,
    p2: bool = False,
    p5: bool = False,
    p16: int = 0,
) -> dict[str, float]:
    """Run P1 (and P3 if ``p3``, P2 if ``p2``, P5 if ``p5``, P16 if ``p16``) once with ``side``
    of ``lever``; return its figures per flow."""
    ordered = not (lever in ("ids", "both") and side == "A")
    if lever in ("codec", "both") and side == "A":
        # The store's writer makes its packer with the default number: make that dictionary 1.
        codec.BodyPacker.__init__.__defaults__ = (codec.ZLIB,)
    with tempfile.TemporaryDirectory(prefix="dir-pair-") as tmp:
        path = Path(tmp) / "p1.db"

        async def run() -> FlowRun:
            return await run_flows(path, flows, ordered_ids=ordered)

        r = anyio.run(run, backend="asyncio")
        replayed = _p5(path) if p5 else {}
    figures = {
        "P1": r.flows_per_s,
        "C1": r.cpu_seconds / r.flows * 1e6,
        "J1": r.journal_bytes / r.journal_events,
        "body": r.body_bytes / r.journal_events,
    }
    for group, seconds in (r.threads or {}).items():
        figures[f"cpu {group}"] = seconds / r.flows * 1e6
    for key in ("rchar", "wchar"):
        if r.io and key in r.io:
            figures[f"{key} per flow"] = r.io[key] / r.flows
    figures["commits per flow"] = r.transactions / r.flows
    figures["events per flow"] = r.events / r.flows
    figures |= replayed
    if p3:
        with tempfile.TemporaryDirectory(prefix="dir-pair-") as tmp:
            path = Path(tmp) / "p3.db"

            async def latency() -> LatencyRun:
                return await run_latency(path, p3)

            lat = anyio.run(latency, backend="asyncio")
        figures["P3 p50 us"] = lat.percentile_us(0.5)
        figures["P3 p99 us"] = lat.percentile_us(0.99)
        figures["P3 commits per flow"] = lat.transactions / p3
    if p2:
        figures |= _p2(flows)
    if p16:
        figures |= _p16(p16)
    return figures


def _p16(calls: int) -> dict[str, float]:
    """Run P16 once: ``calls`` governed tool calls one at a time; the added p50 and p99."""
    with tempfile.TemporaryDirectory(prefix="dir-pair-") as tmp:
        path = Path(tmp) / "p16.db"

        async def run() -> ToolCallRun:
            return await run_tool_calls(path, calls)

        async def reads() -> ToolCallRun:
            return await run_tool_calls(Path(tmp) / "p16r.db", calls, True)

        r = anyio.run(run, backend="asyncio")
        ro = anyio.run(reads, backend="asyncio")
    return {
        "P16 p50 us": r.added_us(0.5),
        "P16 p99 us": r.added_us(0.99),
        "P16.r p50 us": ro.added_us(0.5),
        "P16.r p99 us": ro.added_us(0.99),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the pairs and print each figure's A, B and B/A (median of the pairs, min-max)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pair", description=__doc__)
    parser.add_argument("lever", choices=sorted(LEVERS))
    parser.add_argument("--flows", type=int, default=8_000)
    parser.add_argument("--pairs", type=int, default=3, help="pairs kept (one more is run first)")
    parser.add_argument("--a", metavar="REV", help="tree: the git revision of side A")
    parser.add_argument("--p3", type=int, default=0, metavar="N", help="also P3, N flows")
    parser.add_argument("--p2", action="store_true", help="also P2 and S2 (spans exported)")
    parser.add_argument("--p5", action="store_true", help="also P5 (replay and verify)")
    parser.add_argument("--p16", type=int, default=0, metavar="N", help="also P16, N calls")
    parser.add_argument("--side", choices=("A", "B"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        figures = _one(args.lever, args.side, args.flows, args.p3, args.p2, args.p5, args.p16)
        print(json.dumps(figures))
        return 0
    if args.lever in ("tree", "own") and not args.a:
        parser.error(f"{args.lever} needs --a REV (the revision before the lever)")
    with tempfile.TemporaryDirectory(prefix="dir-pair-tree-") as tmp:
        if args.lever == "own":
            runs = _own_pairs(args, whole(args.a, Path(tmp)))
        else:
            where = {"A": checkout(args.a, Path(tmp)), "B": ROOT} if args.a else {}
            runs = _pairs(args, where)
    _print(args, runs)
    return 0


def _pairs(args: argparse.Namespace, where: dict[str, Path]) -> list[dict[str, dict[str, float]]]:
    """Run the pairs (one warm-up first), alternating which side goes first."""
    runs: list[dict[str, dict[str, float]]] = []
    for n in range(args.pairs + 1):
        pair = {}
        for side in ("A", "B") if n % 2 == 0 else ("B", "A"):
            env = dict(os.environ)
            if args.lever == "helper":
                env["DIRK_HELPER"] = "off" if side == "A" else "on"
            if side in where:
                env["PYTHONPATH"] = str(where[side])
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.pair",
                    args.lever,
                    "--side",
                    side,
                    "--flows",
                    str(args.flows),
                    "--p3",
                    str(args.p3),
                    *(["--p2"] if args.p2 else []),
                    *(["--p5"] if args.p5 else []),
                    "--p16",
                    str(args.p16),
                ],
                check=True,
                capture_output=True,
                text=True,
                cwd=where.get(side),
                env=env,
            ).stdout
            pair[side] = json.loads(out.splitlines()[-1])
        label = "warm-up" if n == 0 else f"pair {n}"
        p2 = {s: _extra(args, pair[s]) for s in "AB"}
        print(
            f"{label}: A P1 {pair['A']['P1']:,.0f} C1 {pair['A']['C1']:.0f}{p2['A']};"
            f" B P1 {pair['B']['P1']:,.0f} C1 {pair['B']['C1']:.0f}{p2['B']};"
            f" load {os.getloadavg()[0]:.1f}",
            file=sys.stderr,
            flush=True,
        )
        if n:
            runs.append(pair)
    return runs


def _own_pairs(args: argparse.Namespace, old: Path) -> list[dict[str, dict[str, float]]]:
    """Run the pairs of ``own`` (one warm-up first), alternating which side goes first."""
    runs: list[dict[str, dict[str, float]]] = []
    for n in range(args.pairs + 1):
        pair = {}
        for side in ("A", "B") if n % 2 == 0 else ("B", "A"):
            pair[side] = _own(old if side == "A" else ROOT, args.flows, args.p5)
        said = {
            s: f" P5 {pair[s]['P5 flows/s']:,.0f} P5.v {pair[s]['P5.v flows/s']:,.0f} flows/s"
            if args.p5
            else ""
            for s in "AB"
        }
        print(
            f"{'warm-up' if n == 0 else f'pair {n}'}: A P1 {pair['A']['P1']:,.0f}{said['A']};"
            f" B P1 {pair['B']['P1']:,.0f}{said['B']}; load {os.getloadavg()[0]:.1f}",
            file=sys.stderr,
            flush=True,
        )
        if n:
            runs.append(pair)
    return runs


def _extra(args: argparse.Namespace, figures: dict[str, float]) -> str:
    """What a pair's progress line says of P2 and P5, when they run."""
    said = f" P2 {figures['P2']:,.0f} S2 {figures['S2']:.3f}" if args.p2 else ""
    if args.p5:
        said += f" P5 {figures['P5']:,.0f} P5.v {figures['P5.v']:,.0f}"
    return said


def _print(args: argparse.Namespace, runs: list[dict[str, dict[str, float]]]) -> None:
    """Print each figure's A, B and B/A: the median of the pairs, and their min-max."""
    a_name, b_name = LEVERS[args.lever]
    if args.a:
        a_name = f"{a_name} ({args.a})"
    print(f"{args.lever}: A = {a_name}, B = {b_name}; {args.pairs} pairs of {args.flows:,} flows")
    print(f"{'figure':<36}{'A':>10}{'B':>10}{'B/A':>8}  min-max")
    for key in runs[0]["A"]:
        a = [r["A"].get(key, 0.0) for r in runs]
        b = [r["B"].get(key, 0.0) for r in runs]
        ratios = [y / x for x, y in zip(a, b, strict=True) if x]
        if not ratios:
            continue
        print(
            f"{key:<36}{statistics.median(a):>10,.2f}{statistics.median(b):>10,.2f}"
            f"{statistics.median(ratios):>8.3f}  {min(ratios):.3f}-{max(ratios):.3f}"
        )


if __name__ == "__main__":
    sys.exit(main())
