"""The roadmap as people and tools read it: ESAA's ``roadmap.json``, derived, never stored.

``dirk roadmap --json`` prints :func:`roadmap_json`; ``dirk roadmap`` and the console
show the same rows. Its ``projection_hash_sha256`` is the SHA-256 of the roadmap's
canonical form, the very bytes the kernel's digest covers, so a replay of the journal
(``dirk roadmap`` folds it from the start) that prints the same hash rebuilt the same
roadmap (ESAA's ``esaa verify``).

A task's ``state`` is ``done``, ``in_progress``, ``ready`` (every dependency done:
it may be claimed) or ``blocked`` (a dependency is not done yet).
"""

from __future__ import annotations

from typing import Any

import msgspec

from kernel.core.events import digest
from kernel.state.roadmap.model import DONE, IN_PROGRESS, RoadmapState, Task

SCHEMA = "dirk.roadmap/1"
READY = "ready"
BLOCKED = "blocked"


def projection_hash(state: RoadmapState) -> str:
    """The SHA-256 of the roadmap's canonical form (what the kernel's digest covers)."""
    return digest(msgspec.to_builtins(state))


def shown_state(state: RoadmapState, task: Task) -> str:
    """A task's state as shown: done, in_progress, ready or blocked."""
    if task.state in (DONE, IN_PROGRESS):
        return task.state
    return READY if all(state.is_done(dep) for dep in task.spec.depends_on) else BLOCKED


def task_row(state: RoadmapState, task: Task) -> dict[str, Any]:
    """One task as ``roadmap.json`` lists it."""
    spec = task.spec
    return {
        "task_id": spec.id,
        "kind": spec.kind,
        "title": spec.title,
        "phase": spec.phase,
        "state": shown_state(state, task),
        "depends_on": list(spec.depends_on),
        "files": list(spec.files),
        "acceptance": list(spec.acceptance),
        "claimed_by": task.claimed_by,
        "claimed_seq": task.claimed_seq,
        "commits": list(task.commits),
        "touched": list(task.touched),
        "runs": {name: msgspec.to_builtins(run) for name, run in sorted(task.runs.items())},
        "acceptance_results": dict(task.acceptance_results),
        "done_seq": task.done_seq,
        "summary": task.summary,
        "issues": [msgspec.to_builtins(issue) for issue in task.issues],
        "hotfix_of": task.hotfix_of,
    }


def phase_rows(state: RoadmapState) -> list[dict[str, Any]]:
    """Each phase: its tasks, how many are done, and the seq that finished it (0: open)."""
    rows = []
    for phase, done_seq in state.phases.items():
        tasks = [t for t in state.tasks.values() if t.spec.phase == phase]
        rows.append(
            {
                "phase": phase,
                "tasks": len(tasks),
                "done": sum(t.state == DONE for t in tasks),
                "done_seq": done_seq,
            }
        )
    return rows


def roadmap_json(state: RoadmapState, last_seq: int) -> dict[str, Any] | None:
    """The roadmap read-model as of event ``last_seq``, or None when none was opened."""
    if not state.open:
        return None
    tasks = [task_row(state, task) for task in state.tasks.values()]
    counts: dict[str, int] = {}
    for row in tasks:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    return {
        "schema_version": SCHEMA,
        "project": state.contract.project,
        "run": {
            "opened_seq": state.opened_seq,
            "opened_by": state.opened_by,
            "base_commit": state.base,
            "head_commit": state.head,
            "last_event_seq": last_seq,
            "projection_hash_sha256": projection_hash(state),
        },
        "counts": dict(sorted(counts.items())),
        "tasks": tasks,
        "phases": phase_rows(state),
        "agents": {
            agent: msgspec.to_builtins(contract)
            for agent, contract in sorted(state.contract.agents.items())
        },
        "checks": {
            name: msgspec.to_builtins(check)
            for name, check in sorted(state.contract.checks.items())
        },
    }
