"""Run the Stage 2 study: every seed's bundle through every system, measured and recorded."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import msgspec

from examples.beliefs.artifacts import git_sha, write_run
from examples.beliefs.metrics import ALL_METRICS, PassRule, Ratio, mean, measure, pass_rule
from examples.beliefs.port import MODEL_ID, translate
from examples.beliefs.scenarios import FAMILIES, Scenario, bundle
from examples.beliefs.systems import KeyValue, Outcome, PolicyFold, RawLog, System

ROOT = Path(__file__).resolve().parents[2]
BASELINE = "raw_log"


def _governed(seed: int, workdir: Path) -> System:
    from examples.beliefs.governed import GovernedKernel

    return GovernedKernel(seed, workdir)


FACTORIES: dict[str, Callable[[int, Path], System]] = {
    "governed": _governed,
    "governed_fold": lambda seed, wd: PolicyFold("governed_fold"),
    "raw_log": lambda seed, wd: RawLog(),
    "key_value": lambda seed, wd: KeyValue(),
    "no_independence": lambda seed, wd: PolicyFold("no_independence", independence="per_source"),
    "direct_writes": lambda seed, wd: PolicyFold("direct_writes", direct_writes=True),
}
SYSTEMS = tuple(FACTORIES)


def config_for(system: str, per_family: int) -> dict[str, Any]:
    """The run's configuration (flat, hashed into the manifest)."""
    return {
        "system": system,
        "families": list(FAMILIES),
        "per_family": per_family,
        "model_id": MODEL_ID,
        "answer_rule": "accepted proposition, else abstain"
        if system not in ("raw_log", "key_value")
        else ("top-5 recent lines, majority" if system == "raw_log" else "last write wins"),
        "independence": "per_source" if system == "no_independence" else "groups",
        "direct_canonical_writes": system == "direct_writes",
        "raw_log_top_k": RawLog.TOP_K,
        "carry_over_cap": 20,
        "promote_freshness_micro": 350_000,
    }


class SeedRun(msgspec.Struct, kw_only=True):
    """One system on one seed: its outcomes, metrics and artifact directory."""

    system: str
    seed: int
    metrics: dict[str, Ratio]
    outcomes: list[Outcome]
    results: list[dict[str, Any]]
    """The scenario_results.jsonl rows: one per question."""
    directory: str


async def run_one(system: str, seed: int, per_family: int, out: Path, sha: str) -> SeedRun:
    """Run ``system`` over ``seed``'s bundle and write its artifacts under ``out``."""
    scenarios = bundle(seed, per_family)
    work = out / "work" / f"{system}_{seed}"
    work.mkdir(parents=True, exist_ok=True)
    sys_ = FACTORIES[system](seed, work)
    outcomes = []
    try:
        for sc in scenarios:
            calls, res = translate(sc)
            outcomes.append(await sys_.run_scenario(sc, calls, res))
    finally:
        await sys_.aclose()
    metrics = measure(scenarios, outcomes)
    results = results_of(scenarios, outcomes)
    directory = write_run(
        out,
        system=system,
        seed=seed,
        sha=sha,
        model_id=MODEL_ID,
        config=config_for(system, per_family),
        scenarios=scenarios,
        results=results,
        transitions=sys_.transitions(),
        consolidations=sys_.consolidations(),
        metrics=metrics,
    )
    return SeedRun(
        system=system,
        seed=seed,
        metrics=metrics,
        outcomes=outcomes,
        results=results,
        directory=str(directory),
    )


def results_of(scenarios: Sequence[Scenario], outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """scenario_results.jsonl: one row per question, with the beliefs behind it."""
    rows = []
    for sc, out in zip(scenarios, outcomes, strict=True):
        for q in sc.questions:
            answer = out.answers.get(q.id, "")
            rows.append(
                {
                    "scenario": sc.id,
                    "family": sc.family,
                    "question": q.id,
                    "mention": q.mention,
                    "attribute": q.attribute,
                    "expected": q.expected,
                    "answer": answer,
                    "success": answer == q.expected,
                    "beliefs": [
                        {
                            "value": t.value,
                            "label": t.label,
                            "state": b.state,
                            "confidence": b.confidence,
                        }
                        for t, b in zip(sc.truths, out.beliefs, strict=True)
                        if t.attribute == q.attribute
                    ],
                    "rejected_calls": out.rejected_calls,
                }
            )
    return rows


class Study(msgspec.Struct, kw_only=True):
    """All runs, the mean of each metric over seeds per system, and the pass rules."""

    seeds: list[int]
    runs: list[SeedRun]
    means: dict[str, dict[str, Fraction | None]]
    rules: list[PassRule]


async def run_study(
    seeds: Sequence[int], per_family: int, out: Path, systems: Sequence[str] = SYSTEMS
) -> Study:
    """Run every system on every seed; compare each non-baseline system to the raw log."""
    sha = git_sha(ROOT)
    runs = [await run_one(s, seed, per_family, out, sha) for s in systems for seed in seeds]
    means: dict[str, dict[str, Fraction | None]] = {}
    for s in systems:
        mine = [r for r in runs if r.system == s]
        means[s] = {m: mean([r.metrics[m].value() for r in mine]) for m in ALL_METRICS}
    rules = [pass_rule(s, BASELINE, means) for s in systems if s != BASELINE and BASELINE in means]
    return Study(seeds=list(seeds), runs=runs, means=means, rules=rules)
