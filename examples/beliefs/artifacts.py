"""The run artifacts, laid out as the seed document's section 17.5 says.

One directory per (system, seed): ``{date}_{git_sha}_{system}_{seed}/`` holding
``manifest.json``, ``config_snapshot.yaml``, ``transitions.jsonl``,
``consolidation_events.jsonl``, ``scenario_results.jsonl`` and
``metrics_summary.json``. The date and the manifest's timestamp are read from the
scenario clock (the bundle's last task boundary), never from the wall clock, so
two runs of one seed on one commit write byte-identical directories.

The reproducibility hash covers everything that should be the same when a run is
reproduced (model id, seed, system, config hash, bundle hash and the hash of every
other file) and not the git SHA, which the manifest records beside it: a commit
that does not change behaviour reproduces the same hash.
"""

from __future__ import annotations

import datetime
import json
import subprocess
from fractions import Fraction
from pathlib import Path
from typing import Any

from examples.beliefs.metrics import Ratio, decimal
from examples.beliefs.scenarios import EPOCH_S, Scenario, bundle_hash, canonical, sha256

FILES = (
    "config_snapshot.yaml",
    "transitions.jsonl",
    "consolidation_events.jsonl",
    "scenario_results.jsonl",
    "metrics_summary.json",
)


def git_sha(root: Path) -> str:
    """The checkout's short commit SHA, or ``nogit`` outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "nogit"
    return out.stdout.strip() or "nogit"


def scenario_time(at_s: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(EPOCH_S + at_s, tz=datetime.UTC)


def yaml_flat(config: dict[str, Any]) -> str:
    """Flat ``key: value`` YAML (scalars and lists of scalars only, JSON-quoted strings)."""
    lines = []
    for key in sorted(config):
        value = config[key]
        nested = isinstance(value, list) and any(isinstance(v, dict | list) for v in value)
        if isinstance(value, dict) or nested:
            raise ValueError(f"config {key!r} is not flat")
        lines.append(f"{key}: {json.dumps(value, sort_keys=True)}")
    return "\n".join(lines) + "\n"


def jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in rows)


def metrics_json(metrics: dict[str, Ratio]) -> dict[str, Any]:
    return {
        m: {
            "numerator": decimal(Fraction(r.num)),
            "denominator": r.den,
            "value": decimal(r.value()),
        }
        for m, r in metrics.items()
    }


def write_run(
    out: Path,
    *,
    system: str,
    seed: int,
    sha: str,
    model_id: str,
    config: dict[str, Any],
    scenarios: list[Scenario],
    results: list[dict[str, Any]],
    transitions: list[dict[str, Any]],
    consolidations: list[dict[str, Any]],
    metrics: dict[str, Ratio],
) -> Path:
    """Write one run's directory under ``out``; return it."""
    end = max(sc.end_s for sc in scenarios)
    stamp = scenario_time(end)
    run = out / f"{stamp:%Y%m%d}_{sha}_{system}_{seed}"
    run.mkdir(parents=True, exist_ok=False)
    texts = {
        "config_snapshot.yaml": yaml_flat(config),
        "transitions.jsonl": jsonl(transitions),
        "consolidation_events.jsonl": jsonl(consolidations),
        "scenario_results.jsonl": jsonl(results),
        "metrics_summary.json": json.dumps(metrics_json(metrics), indent=2, sort_keys=True) + "\n",
    }
    for name in FILES:
        (run / name).write_text(texts[name], encoding="utf-8")
    hashes = {name: sha256(texts[name].encode()) for name in FILES}
    config_hash = sha256(canonical(config))
    scenarios_hash = bundle_hash(scenarios)
    reproducible = {
        "model_id": model_id,
        "seed": seed,
        "system": system,
        "config_hash": config_hash,
        "scenario_bundle_hash": scenarios_hash,
        "files": hashes,
    }
    manifest = {
        "model_id": model_id,
        "git_sha": sha,
        "seed": seed,
        "system": system,
        "timestamp": stamp.isoformat().replace("+00:00", "Z"),
        "timestamp_source": "scenario clock (the bundle's last task boundary)",
        "config_hash": config_hash,
        "scenario_bundle_hash": scenarios_hash,
        "reproducibility_hash": sha256(canonical(reproducible)),
        "files": hashes,
    }
    (run / "manifest.json").write_text(
        json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    return run
