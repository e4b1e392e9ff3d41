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
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import anyio

from benchmarks.flows import FlowRun, run_flows
from kernel.journal import codec

LEVERS = {
    "ids": ("random v4 DFIDs", "time-ordered v7 DFIDs"),
    "codec": ("zlib, dictionary 1", "zstd, dictionary 2"),
    "both": ("v4 ids, zlib dictionary 1", "v7 ids, zstd dictionary 2"),
}


def _one(lever: str, side: str, flows: int) -> dict[str, float]:
    """Run P1 once with ``side`` (``A`` or ``B``) of ``lever``; return its figures per flow."""
    ordered = not (lever in ("ids", "both") and side == "A")
    if lever in ("codec", "both") and side == "A":
        # The store's writer makes its packer with the default number: make that dictionary 1.
        codec.BodyPacker.__init__.__defaults__ = (codec.ZLIB,)
    with tempfile.TemporaryDirectory(prefix="dir-pair-") as tmp:
        path = Path(tmp) / "p1.db"

        async def run() -> FlowRun:
            return await run_flows(path, flows, ordered_ids=ordered)

        r = anyio.run(run, backend="asyncio")
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
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    """Run the pairs and print each figure's A, B and B/A (median of the pairs, min-max)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pair", description=__doc__)
    parser.add_argument("lever", choices=sorted(LEVERS))
    parser.add_argument("--flows", type=int, default=8_000)
    parser.add_argument("--pairs", type=int, default=3, help="pairs kept (one more is run first)")
    parser.add_argument("--side", choices=("A", "B"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        print(json.dumps(_one(args.lever, args.side, args.flows)))
        return 0
    runs: list[dict[str, dict[str, float]]] = []
    for n in range(args.pairs + 1):
        pair = {}
        for side in ("A", "B") if n % 2 == 0 else ("B", "A"):
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
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            pair[side] = json.loads(out.splitlines()[-1])
        label = "warm-up" if n == 0 else f"pair {n}"
        print(
            f"{label}: A P1 {pair['A']['P1']:,.0f} C1 {pair['A']['C1']:.0f};"
            f" B P1 {pair['B']['P1']:,.0f} C1 {pair['B']['C1']:.0f}; load {os.getloadavg()[0]:.1f}",
            file=sys.stderr,
            flush=True,
        )
        if n:
            runs.append(pair)
    a_name, b_name = LEVERS[args.lever]
    print(f"{args.lever}: A = {a_name}, B = {b_name}; {args.pairs} pairs of {args.flows:,} flows")
    print(f"{'figure':<36}{'A':>10}{'B':>10}{'B/A':>8}  min-max")
    for key in runs[0]["A"]:
        a = [r["A"].get(key, 0.0) for r in runs]
        b = [r["B"].get(key, 0.0) for r in runs]
        ratios = [y / x for x, y in zip(a, b, strict=True) if x]
        if not ratios:
            continue
        print(
            f"{key:<36}{statistics.median(a):>10,.1f}{statistics.median(b):>10,.1f}"
            f"{statistics.median(ratios):>8.3f}  {min(ratios):.3f}-{max(ratios):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
