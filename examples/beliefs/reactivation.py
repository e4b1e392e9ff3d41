"""The reactivation arm: a second task that benefits from, or is misled by, the first one.

Per seed, one kernel (SQLite journal in the work directory, a manual clock, seeded
ids) with the governance pack runs ``pairs`` pairs of tasks:

- **task 1** learns where a company is headquartered from two independent sources
  (a wire and a registry), links the company as an entity, proposes the proposition
  (``<name> is headquartered in <city>``), supports it, consolidates (it is promoted
  to canonical memory) and archives the episode;
- the clock moves on; then **task 2** asks "Where is <name> headquartered?" and the
  kernel compiles its agent's context: the knowledge layer reactivates what task 1
  promoted (kernel.state.beliefs.recall), with its freshness at task 2's time.

Half the pairs are *stable*: a low-volatility claim, task 2 a day later, the world
unchanged: the reactivated belief is right. The other half *moved*: a high-volatility
claim (an office that moves), task 2 three days later, and the company has moved
since: the reactivated belief is wrong. Three readers answer from the same context:

- ``cold``: no reactivation (what dirk did before): it abstains, right or wrong;
- ``reactivated``: trusts any reactivated accepted proposition;
- ``reactivated_fresh``: trusts one only if its freshness is at least 0.35 (the
  governance document's promotion threshold), else abstains.

Each answer is right, misled (wrong) or an abstention. Offline, deterministic.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

from kernel import (
    Kernel,
    KernelConfig,
    Manifest,
    Ports,
    Principal,
    Proposal,
    Storage,
    Supervision,
    WorkingContext,
    open_kernel,
)
from kernel.beliefs import GOVERNANCE_PACK, KINDS
from kernel.testing import ManualClock, SeededIds

ARMS = ("cold", "reactivated", "reactivated_fresh")
FRESH_MICRO = 350_000
"""The freshness below which ``reactivated_fresh`` does not trust a belief (governance 13.4)."""
NAMES = (
    "Acme Corp",
    "Globex",
    "Initech",
    "Hooli",
    "Umbrella Group",
    "Stark Industries",
    "Wayne Enterprises",
    "Tyrell Systems",
    "Soylent Foods",
    "Cyberdyne",
)
CITIES = ("Lyon", "Porto", "Gdansk", "Leeds", "Turin", "Bilbao", "Aarhus", "Graz")
HOUR_S = 3600.0


class _Worker:
    """Proposes the governance call its trigger carries (task 1's tool calls), once."""

    manifest = Manifest(
        agent_id="learner",
        version="1.0.0",
        capabilities=list(KINDS),
        subscriptions=["react.call"],
        max_attempts=1,
    )

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        call = ctx.state.get("react.call")
        if not isinstance(call, dict):
            return None
        return ctx.propose(dict(call), explain="task 1")


class _Asker:
    """Task 2's agent: it keeps the context it is handed and proposes nothing."""

    manifest = Manifest(
        agent_id="asker", version="1.0.0", capabilities=[], subscriptions=["react.ask"]
    )

    def __init__(self) -> None:
        self.contexts: list[WorkingContext] = []

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        self.contexts.append(ctx)
        return None


def answer(arm: str, knowledge: dict[str, Any]) -> str:
    """What ``arm`` answers from a context's knowledge layer ("" abstains)."""
    if arm == "cold":
        return ""
    for p in knowledge.get("propositions", []):
        if p["state"] != "accepted" or " in " not in p["text"]:
            continue
        if arm == "reactivated_fresh" and p["freshness"] < FRESH_MICRO:
            continue
        return str(p["text"].rsplit(" in ", 1)[1])
    return ""


async def _task_one(kernel: Kernel, i: int, name: str, city: str, volatility: str) -> None:
    task = f"task1-{i}"
    calls: list[dict[str, Any]] = [
        {"kind": "governance.record_observation", "observation": f"w{i}", "source": "wire",
         "independence_group": "wire", "raw_payload": f"{name} is based in {city}"},
        {"kind": "governance.record_observation", "observation": f"r{i}", "source": "registry",
         "independence_group": "registry", "raw_payload": f"{name}: seat {city}"},
        {"kind": "governance.create_or_link_entity_candidate", "name": name,
         "observation": f"w{i}", "entity": f"org{i}"},
        {"kind": "governance.propose_proposition", "proposition": f"hq{i}",
         "text": f"{name} is headquartered in {city}", "derived_from": [f"w{i}"],
         "about": [f"org{i}"], "volatility": volatility},
        {"kind": "governance.attach_support", "proposition": f"hq{i}", "observation": f"r{i}"},
        {"kind": "governance.request_consolidation"},
        {"kind": "governance.archive_episode", "episode": f"ep{i}",
         "summary": f"Found where {name} is headquartered"},
    ]  # fmt: skip
    for call in calls:
        await kernel.trigger("react.call", {"react.call": {**call, "task": task}})
        await kernel.wait_quiet()


async def run_seed(seed: int, pairs: int, workdir: Path) -> list[dict[str, Any]]:
    """Run ``pairs`` pairs of tasks on ``seed``; return one row per pair and arm."""
    rng = random.Random(seed)
    names = rng.sample(NAMES, min(pairs, len(NAMES)))
    clock = ManualClock()
    asker = _Asker()
    rows: list[dict[str, Any]] = []
    config = KernelConfig(
        # This host vouches for one local user: every flow acts on its behalf
        # (KernelConfig.principal; docs/identity.md).
        principal=Principal(tenant="local", user="local"),
        ports=Ports(clock=clock, ids=SeededIds(seed), jitter_seed=seed),
        supervision=Supervision(inbox_poll_s=None),
        storage=Storage(synchronous="NORMAL"),
    )
    async with open_kernel(
        workdir / f"reactivation_{seed}.db",
        packs=[GOVERNANCE_PACK],
        adapters={},
        allow=["learner", "asker"],
        config=config,
    ) as kernel:
        await kernel.register(_Worker())
        await kernel.register(asker)
        for i, name in enumerate(names):
            moved = i % 2 == 1
            city, later = rng.sample(CITIES, 2)
            await _task_one(kernel, i, name, city, "high" if moved else "low")
            clock.advance((72 if moved else 24) * HOUR_S)
            await kernel.trigger("react.ask", {"react.ask": f"Where is {name} headquartered?"})
            await kernel.wait_quiet()
            ctx = asker.contexts[-1]
            truth = later if moved else city
            for arm in ARMS:
                given = answer(arm, ctx.knowledge)
                rows.append(
                    {
                        "seed": seed,
                        "pair": i,
                        "case": "moved" if moved else "stable",
                        "arm": arm,
                        "answer": given,
                        "truth": truth,
                        "outcome": "abstained"
                        if not given
                        else ("right" if given == truth else "misled"),
                    }
                )
    return rows


async def run_arm(seeds: list[int], pairs: int, workdir: Path) -> list[dict[str, Any]]:
    """Every seed's pairs (one kernel each)."""
    await anyio.Path(workdir).mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in seeds:
        rows += await run_seed(seed, pairs, workdir)
    return rows


def tally(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per arm: how many answers were right, misled, abstained (all seeds pooled)."""
    counts: dict[str, Counter[str]] = {arm: Counter() for arm in ARMS}
    for row in rows:
        counts[row["arm"]][row["outcome"]] += 1
    return {arm: {k: c[k] for k in ("right", "misled", "abstained")} for arm, c in counts.items()}
