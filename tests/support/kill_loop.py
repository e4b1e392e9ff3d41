"""Run the kill test many times outside pytest and count failures per mode.

Usage: ``python -m tests.support.kill_loop --runs 1000 [--first-seed 1000] [--log FILE]``.
Each run is one (seed, mode) case of ``tests/execution/test_execution_crash.py``; the
modes alternate (dedupe, lookup), seeds count up from ``--first-seed`` (apart
from the suite's default seeds 0-5). A failing case prints its seed, mode and
the assertion, and the loop goes on; the last line is the tally. Not collected
by pytest (its name does not start with ``test_``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from collections import Counter
from pathlib import Path

import anyio

from tests.execution.test_execution_crash import kill_run

MODES = ("0", "1")
NAMES = {"0": "dedupe", "1": "lookup"}


async def main(runs: int, first_seed: int, log: Path | None) -> int:
    ran: Counter[str] = Counter()
    failed: Counter[str] = Counter()

    def say(line: str) -> None:
        print(line, flush=True)
        if log is not None:
            with log.open("a") as f:
                f.write(line + "\n")

    for n in range(runs):
        seed, lookup = first_seed + n // 2, MODES[n % 2]
        name = NAMES[lookup]
        with tempfile.TemporaryDirectory() as tmp:
            try:
                await kill_run(Path(tmp), seed, lookup)
            except Exception:
                failed[name] += 1
                say(f"FAIL seed {seed} {name}\n{traceback.format_exc()}")
        ran[name] += 1
        if (n + 1) % 10 == 0 or n + 1 == runs:
            say(
                f"runs {n + 1}: dedupe {ran['dedupe']} ({failed['dedupe']} failed),"
                f" lookup {ran['lookup']} ({failed['lookup']} failed)"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--log", type=Path)
    args = parser.parse_args()
    sys.exit(anyio.run(main, args.runs, args.first_seed, args.log))
