"""What each carried-out ``esaa.*`` intent does to the roadmap: the fold's half of the domain.

The roadmap changes only when an effect is recorded: the ExecutionSucceeded of an
accepted ``esaa.*`` proposal (its flow's proposal says which, with what parameters;
the receipt's detail says what the repository now holds). A claim, a completion or
a report is carried out by the roadmap's own executor, whose effect is this record;
an opening, a patch or a check run by the git adapter, whose receipt names the
commit and, for a patch, each file's new blob id, for a run whether it passed.

A receipt that does not read as expected (a result a human reconciled by hand, say)
fails closed: a patch's files are then no longer known to the roadmap (git checks
the next patch of them against the tree), a run counts as failed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from kernel.core.events import ExecutionSucceeded
from kernel.state.roadmap.model import (
    CLAIM,
    COMPLETE,
    DONE,
    FILE_PATCH,
    HOTFIX,
    IN_PROGRESS,
    OPEN,
    REPORT,
    RUN_CHECK,
    TODO,
    Issue,
    OpenReceipt,
    PatchReceipt,
    RoadmapState,
    RunReceipt,
    RunRecord,
    Task,
    TaskSpec,
)
from kernel.state.roadmap.plan import PlanInvalid, read_plan

Params = Mapping[str, Any]
_R = TypeVar("_R")
_replace = msgspec.structs.replace


@dataclass(frozen=True, slots=True)
class Done:
    """One recorded effect, as the fold reads it: its proposal's parameters, its receipt."""

    params: Params
    receipt: ExecutionSucceeded
    seq: int
    agent: str


def apply(state: RoadmapState, kind: str, done: Done) -> None:
    """Fold the recorded effect of an accepted ``kind`` proposal into ``state``."""
    effect = _EFFECTS.get(kind)
    if effect is not None:
        effect(state, done)


def _read(detail: Mapping[str, Any], kind: type[_R]) -> _R | None:
    try:
        return msgspec.convert(detail, type=kind)
    except msgspec.ValidationError:
        return None


def _task(state: RoadmapState, done: Done) -> Task | None:
    task_id = done.params.get("task")
    return state.tasks.get(task_id) if isinstance(task_id, str) else None


def _opened(state: RoadmapState, done: Done) -> None:
    if state.open:
        return  # one roadmap per journal (refused by the DIM; never folded twice)
    try:
        contract, specs = read_plan(done.params.get("contract"), done.params.get("tasks"))
    except PlanInvalid:
        return  # the DIM refuses such an opening: it never executes
    receipt = _read(done.receipt.detail, OpenReceipt)
    commit = receipt.commit if receipt is not None else str(done.params.get("commit", ""))
    state.opened_seq, state.opened_by = done.seq, done.agent
    state.base = state.head = commit
    state.contract = contract
    state.tasks = {spec.id: Task(spec=spec) for spec in specs}
    state.phases = {spec.phase: 0 for spec in specs if spec.phase}
    state.blobs = _baseline(done.params.get("files"))


def _baseline(files: object) -> dict[str, str]:
    """The files an opening named with their blob ids (the adapter found them at the commit)."""
    if not isinstance(files, Mapping):
        return {}
    return {p: b for p, b in files.items() if isinstance(p, str) and isinstance(b, str)}


def _claimed(state: RoadmapState, done: Done) -> None:
    task = _task(state, done)
    if task is not None and task.state == TODO:
        state.tasks[task.spec.id] = _replace(
            task, state=IN_PROGRESS, claimed_by=done.agent, claimed_seq=done.seq
        )


def _patched(state: RoadmapState, done: Done) -> None:
    receipt = _read(done.receipt.detail, PatchReceipt) or PatchReceipt(commit="")
    paths = _paths(done.params.get("patches"))
    for path in paths:
        blob = receipt.files.get(path)
        if blob is None:
            state.blobs.pop(path, None)  # what the file holds now is not known: git checks
        else:
            state.blobs[path] = blob
    commit = receipt.commit
    if commit:
        state.head = commit
    task = _task(state, done)
    if task is not None:
        state.tasks[task.spec.id] = _replace(
            task,
            commits=[*task.commits, commit] if commit else task.commits,
            touched=sorted({*task.touched, *paths}),
            last_patch_seq=done.seq,
        )


def _paths(patches: object) -> list[str]:
    """The paths a patch named, sorted."""
    if not isinstance(patches, Mapping):
        return []
    return sorted(path for path in patches if isinstance(path, str))


def _ran(state: RoadmapState, done: Done) -> None:
    task = _task(state, done)
    check = done.params.get("check")
    if task is None or not isinstance(check, str):
        return
    receipt = _read(done.receipt.detail, RunReceipt) or RunReceipt(passed=False)
    run = RunRecord(
        check=check,
        passed=receipt.passed,
        exit_code=receipt.exit_code,
        timed_out=receipt.timed_out,
        commit=receipt.commit,
        seq=done.seq,
        agent=done.agent,
    )
    state.tasks[task.spec.id] = _replace(task, runs={**task.runs, check: run})


def _completed(state: RoadmapState, done: Done) -> None:
    task = _task(state, done)
    if task is None or task.state == DONE:
        return
    results = {name: task.runs[name].passed for name in task.spec.acceptance if name in task.runs}
    summary = done.params.get("summary", "")
    state.tasks[task.spec.id] = _replace(
        task,
        state=DONE,
        done_seq=done.seq,
        summary=summary if isinstance(summary, str) else "",
        acceptance_results=results,
    )
    _finish_phase(state, task.spec.phase, done.seq)


def _finish_phase(state: RoadmapState, phase: str, seq: int) -> None:
    """Record ``phase`` finished at ``seq`` once its last task is done (it stays finished)."""
    if phase and not state.phases.get(phase):
        if all(t.state == DONE for t in state.tasks.values() if t.spec.phase == phase):
            state.phases[phase] = seq


def _reported(state: RoadmapState, done: Done) -> None:
    task = _task(state, done)
    if task is None:
        return
    title, details, severity = (
        str(done.params.get(k, "")) for k in ("title", "details", "severity")
    )
    hotfix = _hotfix(state, task, title) if task.state == DONE else ""
    issue = Issue(
        seq=done.seq,
        agent=done.agent,
        title=title,
        severity=severity or "medium",
        details=details,
        hotfix=hotfix,
    )
    state.tasks[task.spec.id] = _replace(task, issues=[*task.issues, issue])


def _hotfix(state: RoadmapState, task: Task, title: str) -> str:
    """Open the hotfix task of an issue on done ``task``; return its id.

    The done task stays as it is (immutable); the hotfix is a new task with its files
    and acceptance checks, ready at once, named ``<task>.fix<n>``.
    """
    n = 1
    while f"{task.spec.id}.fix{n}" in state.tasks:
        n += 1
    spec = task.spec
    hotfix = TaskSpec(
        id=f"{spec.id}.fix{n}",
        title=f"hotfix of {spec.id}: {title}"[:200],
        kind=HOTFIX,
        phase=spec.phase,
        files=list(spec.files),
        acceptance=list(spec.acceptance),
    )
    state.tasks[hotfix.id] = Task(spec=hotfix, hotfix_of=spec.id)
    return hotfix.id


_EFFECTS: dict[str, Callable[[RoadmapState, Done], None]] = {
    OPEN: _opened,
    CLAIM: _claimed,
    FILE_PATCH: _patched,
    RUN_CHECK: _ran,
    COMPLETE: _completed,
    REPORT: _reported,
}
