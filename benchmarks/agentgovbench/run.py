"""Run AgentGovBench against dirk: the snapshot's own CLI with ``--runner dirk_runner``.

    python benchmarks/agentgovbench/run.py [--snapshot DIR] [--json FILE] [--category C]

The snapshot (``../shared/agentgovbench`` by default, or ``$AGENTGOVBENCH``) is read-only:
it is copied to a temporary directory, ``dirk_runner.py`` is placed in the copy's
``runners/`` package, and the copy's CLI runs every scenario with it (``python -m
benchmark.cli run``), in this interpreter, where ``kernel`` is installed. Scenarios that
stop the journal's store run on a throwaway PostgreSQL server this script starts
(tests/support/postgres.py), one fresh database each; without a server they fail.

The harness drops a scenario whose runner raised and shrinks its total
(benchmark/cli.py:102-104); here such a scenario counts as failed, so the score is
always out of every scenario loaded. The score is printed per category and in total
(``dirk AgentGovBench: N/48``); ``--json`` writes it, with each scenario's result.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def _snapshot() -> Path:
    """``$AGENTGOVBENCH``, else ``../shared/agentgovbench`` beside the repository."""
    named = os.environ.get("AGENTGOVBENCH")
    if named:
        return Path(named)
    near = [up / "shared" / "agentgovbench" for up in (ROOT.parent, ROOT.parent.parent)]
    return next((p for p in near if p.is_dir()), near[0])


_ERROR = re.compile(r"^\[\d+/\d+\] (?P<id>\S+): RUNNER ERROR (?P<why>.*)$")


def _scenarios(copy: Path, category: str | None) -> list[tuple[str, str, bool]]:
    """Every scenario the harness will load: (id, category, whether it stops the store)."""
    sys.path.insert(0, str(copy))
    try:
        from benchmark.loader import load_all
        from benchmark.types import GatewayFailure
    finally:
        sys.path.remove(str(copy))
    found = load_all(copy / "scenarios", category=category)
    return [
        (s.id, s.category, any(isinstance(a, GatewayFailure) for a in s.actions)) for s in found
    ]


@contextlib.contextmanager
def _store(databases: int) -> Iterator[dict[str, str]]:
    """A throwaway PostgreSQL server with ``databases`` fresh databases, as the runner's env."""
    if not databases:
        yield {}
        return
    sys.path.insert(0, str(ROOT))
    from tests.support.postgres import Unavailable, _as_postgres, throwaway_server

    try:
        with throwaway_server() as server:
            for n in range(1, databases + 1):
                server.admin(f"CREATE DATABASE agb_{n}")
            pg_ctl = [*_as_postgres(), str(server.bindir / "pg_ctl"), "-D", str(server.data)]
            options = (
                f"-c listen_addresses=127.0.0.1 -p {server.port}"
                f" -c unix_socket_directories={server.root}"
            )
            start = [*pg_ctl, "-l", str(server.root / "log"), "-w", "-o", options, "start"]
            try:
                yield {
                    "DIRK_AGB_POSTGRES": server.url("agb_{n}"),
                    "DIRK_AGB_STORE_STOP": shlex.join([*pg_ctl, "-m", "immediate", "-w", "stop"]),
                    "DIRK_AGB_STORE_START": shlex.join(start),
                }
            finally:
                # The runner may have left it stopped: the server's own exit stops it again.
                subprocess.run(start, capture_output=True, check=False, timeout=120)
    except Unavailable as exc:
        print(f"no PostgreSQL server ({exc}): scenarios that stop the store will fail")
        yield {}


def _harness(copy: Path, env: dict[str, str], category: str | None) -> tuple[dict[str, Any], str]:
    out = copy / "results.json"
    args = [sys.executable, "-m", "benchmark.cli", "run", "--runner", "dirk_runner"]
    args += ["--out", str(out), "--verbose"] + (["--category", category] if category else [])
    done = subprocess.run(
        args, cwd=copy, env={**os.environ, **env}, capture_output=True, text=True, check=False
    )
    print(done.stdout, end="")
    if not out.exists():
        sys.stderr.write(done.stderr)
        raise SystemExit(f"the harness wrote no results (exit {done.returncode})")
    return json.loads(out.read_text(encoding="utf-8")), done.stderr


def score(
    scenarios: list[tuple[str, str, bool]], results: dict[str, Any], stderr: str
) -> dict[str, Any]:
    """The score over every scenario loaded: one whose runner raised counts as failed."""
    passed = {r["scenario_id"]: bool(r["passed"]) for r in results["results"]}
    checks = {r["scenario_id"]: r.get("assertions", []) for r in results["results"]}
    raised = {}
    for line in stderr.splitlines():
        found = _ERROR.match(line)
        if found:
            raised[found["id"]] = found["why"]
    categories: dict[str, dict[str, int]] = {}
    rows = []
    for sid, category, _ in scenarios:
        ok = passed.get(sid, False)
        counts = categories.setdefault(category, {"passed": 0, "total": 0})
        counts["total"] += 1
        counts["passed"] += ok
        rows.append(
            {
                "id": sid,
                "category": category,
                "passed": ok,
                "raised": raised.get(sid),
                "assertions": checks.get(sid, []),
            }
        )
    return {
        "passed": sum(c["passed"] for c in categories.values()),
        "total": len(scenarios),
        "by_category": dict(sorted(categories.items())),
        "scenarios": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshot", type=Path, default=_snapshot(), help="the benchmark snapshot")
    parser.add_argument("--category", help="only this category")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the score as JSON here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dirk-agentgovbench-") as folder:
        copy = Path(folder) / "agentgovbench"
        shutil.copytree(args.snapshot, copy, ignore=shutil.ignore_patterns(".git", "results"))
        for tree in copy.rglob("*"):
            tree.chmod(tree.stat().st_mode | 0o200)
        shutil.copy(HERE / "dirk_runner.py", copy / "runners" / "dirk_runner.py")
        scenarios = _scenarios(copy, args.category)
        with _store(sum(stops for _, _, stops in scenarios)) as env:
            results, stderr = _harness(copy, env, args.category)
    summary = score(scenarios, results, stderr)
    print()
    for category, counts in summary["by_category"].items():
        print(f"dirk {category:<34} {counts['passed']:>3}/{counts['total']}")
    for row in summary["scenarios"]:
        if row["raised"]:
            print(f"dirk raised (counted failed): {row['id']}: {row['raised']}")
    print(f"dirk AgentGovBench: {summary['passed']}/{summary['total']}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
