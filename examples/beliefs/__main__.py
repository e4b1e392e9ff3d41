"""Run the governed-beliefs study (Stage 2) and print its table and the pass rule.

    python -m examples.beliefs [--seeds 5] [--per-family 3] [--out DIR] [--json]

Seeds 1..N, each a bundle of the seven stress families, through every system on
the scripted LLM port; one artifact directory per (system, seed) under ``--out``
(a fresh temporary directory by default). The pass rule (the governed system
against raw-log retrieval: >= 10% relative gain on >= 3 policy metrics, <= 3
points of task success lost) is printed as met or NOT met, with its numbers.

Then the reactivation arm (examples/beliefs/reactivation.py): 2 x ``--per-family``
pairs of tasks per seed, a second task answering from what the first one promoted,
reactivated into its context; its table counts right, misled and abstained answers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import anyio

from examples.beliefs.metrics import ALL_METRICS, LOWER_IS_BETTER, POLICY_METRICS, decimal
from examples.beliefs.reactivation import run_arm, tally
from examples.beliefs.scenarios import FAMILIES
from examples.beliefs.study import BASELINE, SYSTEMS, Study, run_study

SHORT = {
    "false_promotion": "false prom.",
    "false_rejection": "false rej.",
    "contested_precision": "contested prec.",
    "calibration": "Brier",
    "contradiction_recovery": "contra. recov.",
    "stale_handling": "stale handl.",
    "duplicate_entities": "dup. ent.",
    "false_merges": "false merge",
    "task_success": "task success",
}


def table(study: Study) -> None:
    """Print the mean of each metric over seeds, one row per system (rich)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"Stage 2, seeds {', '.join(map(str, study.seeds))}: means over seeds",
        box=box.SIMPLE_HEAD,
    )
    t.add_column("system")
    for m in ALL_METRICS:
        arrow = "v" if m in LOWER_IS_BETTER else "^"
        t.add_column(f"{SHORT[m]} {arrow}", justify="right")
    for system, means in study.means.items():
        t.add_row(system, *(decimal(means[m], 3) for m in ALL_METRICS))
    Console(width=200).print(t)


def families(study: Study) -> None:
    """Print task success per family (questions answered right, all seeds pooled)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Task success by family (all seeds)", box=box.SIMPLE_HEAD)
    t.add_column("system")
    for family in FAMILIES:
        t.add_column(family.replace("_", " "), justify="right")
    for system in study.means:
        right: dict[str, list[int]] = {f: [0, 0] for f in FAMILIES}
        for run in (r for r in study.runs if r.system == system):
            for row in run.results:
                right[row["family"]][0] += bool(row["success"])
                right[row["family"]][1] += 1
        t.add_row(system, *(f"{n}/{d}" for n, d in right.values()))
    Console(width=200).print(t)


def reactivation_table(counts: dict[str, dict[str, int]], seeds: int) -> None:
    """Print the reactivation arm's answers per reader (all seeds pooled)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Reactivation arm, {seeds} seeds: task 2's answers", box=box.SIMPLE_HEAD)
    for column in ("reader", "right ^", "misled v", "abstained"):
        t.add_column(column, justify="left" if column == "reader" else "right")
    for arm, c in counts.items():
        t.add_row(arm, str(c["right"]), str(c["misled"]), str(c["abstained"]))
    Console(width=200).print(t)


def verdicts(study: Study) -> list[str]:
    """One line per compared system: the pass rule met or NOT met, with its numbers."""
    lines = []
    for rule in study.rules:
        gains = ", ".join(f"{SHORT[m]} {rule.gains[m] or 'n/a'}" for m in POLICY_METRICS)
        lines.append(
            f"pass rule, {rule.system} vs {rule.baseline}: "
            f"{'met' if rule.met else 'NOT met'} ({len(rule.improved)} of 6 policy metrics"
            f" gain >= 10%: {', '.join(rule.improved) or 'none'}; relative gains {gains};"
            f" task success {rule.task_success_delta} points)"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m examples.beliefs", description=__doc__.split("\n")[0]
    )
    p.add_argument("--seeds", type=int, default=5, help="run seeds 1..N (default 5)")
    p.add_argument("--per-family", type=int, default=3, help="scenarios per family (default 3)")
    p.add_argument("--out", help="artifact directory (default: a fresh temporary directory)")
    p.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated systems (default all: {', '.join(SYSTEMS)})",
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary on the last line")
    args = p.parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or args.seeds < 1 or args.per_family < 1:
        print(f"error: unknown systems {unknown} or bad sizes", file=sys.stderr)
        return 2
    if BASELINE not in systems:
        systems.insert(0, BASELINE)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="dirk-beliefs-"))
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob("*_*_*_*/manifest.json")):
        print(f"error: {out} already holds runs; pick a new --out", file=sys.stderr)
        return 2
    seeds = list(range(1, args.seeds + 1))
    study = anyio.run(run_study, seeds, args.per_family, out, systems)
    table(study)
    families(study)
    for line in verdicts(study):
        print(line)
    rows = anyio.run(run_arm, seeds, 2 * args.per_family, out / "reactivation")
    counts = tally(rows)
    lines = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
    (out / "reactivation" / "reactivation_results.jsonl").write_text(lines, encoding="utf-8")
    reactivation_table(counts, len(seeds))
    print(f"artifacts: {out}")
    if args.json:
        summary = {
            "out": str(out),
            "seeds": seeds,
            "means": {s: {m: decimal(v) for m, v in ms.items()} for s, ms in study.means.items()},
            "rules": [
                {
                    "system": r.system,
                    "met": r.met,
                    "improved": r.improved,
                    "gains": r.gains,
                    "task_success_delta": r.task_success_delta,
                }
                for r in study.rules
            ],
            "runs": [r.directory for r in study.runs],
            "reactivation": counts,
        }
        print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
