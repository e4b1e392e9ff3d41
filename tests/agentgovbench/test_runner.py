"""AgentGovBench run against dirk: the score the script prints is the one the kernel earns.

The script (benchmarks/agentgovbench/run.py) runs the snapshot's own harness with dirk's
runner from a temporary copy; every scenario counts, one whose runner raised as failed.
The categories the merged kernel supports are asserted whole; the others are printed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.agentgovbench.run import ROOT, _snapshot, score

SCRIPT = ROOT / "benchmarks" / "agentgovbench" / "run.py"

SUPPORTED = frozenset(
    {
        "audit_completeness",
        "cross_tenant_isolation",
        "delegation_provenance",
        "identity_propagation",
        "per_user_policy_enforcement",
        "rate_limit_cascade",
        "scope_inheritance",
    }
)
"""The categories the kernel earns every scenario of (asserted); the rest are printed."""


def snapshot() -> Path:
    found = _snapshot()
    if not (found / "benchmark" / "cli.py").is_file():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI needs the AgentGovBench snapshot at {found}")
        pytest.skip(f"no AgentGovBench snapshot at {found}")
    return found


def test_a_scenario_whose_runner_raised_counts_as_failed() -> None:
    scenarios = [("c.1", "c", False), ("c.2", "c", False), ("d.1", "d", True)]
    results = {"results": [{"scenario_id": "c.1", "passed": True}]}
    stderr = "[2/3] c.2: RUNNER ERROR RuntimeError('no')\n[3/3] d.1: RUNNER ERROR KeyError(1)\n"

    summary = score(scenarios, results, stderr)

    assert (summary["passed"], summary["total"]) == (1, 3)
    assert summary["by_category"] == {
        "c": {"passed": 1, "total": 2},
        "d": {"passed": 0, "total": 1},
    }
    assert [row["raised"] for row in summary["scenarios"]] == [
        None,
        "RuntimeError('no')",
        "KeyError(1)",
    ]


def test_the_printed_score_is_what_the_kernel_earns(tmp_path: Path) -> None:
    found = snapshot()
    out = tmp_path / "score.json"

    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--snapshot", str(found), "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )

    print(done.stdout)
    assert done.returncode == 0, done.stderr
    summary: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    scenarios = list((found / "scenarios").glob("*/*.yaml"))
    assert summary["total"] == len(scenarios)  # nothing dropped, raised or not
    printed = re.search(r"^dirk AgentGovBench: (\d+)/(\d+)$", done.stdout, re.MULTILINE)
    assert printed is not None
    assert (int(printed[1]), int(printed[2])) == (summary["passed"], summary["total"])
    assert summary["passed"] == sum(row["passed"] for row in summary["scenarios"])
    for category, counts in summary["by_category"].items():
        line = f"dirk {category:<34} {counts['passed']:>3}/{counts['total']}"
        assert line in done.stdout
        if category in SUPPORTED:
            assert counts["passed"] == counts["total"], (category, counts)
