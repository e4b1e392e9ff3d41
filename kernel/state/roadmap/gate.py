"""The roadmap's layer of the DIM: what a contract, the task graph and the files allow.

:func:`check` is a pure function of the roadmap as committed and the proposal, so
``dirk verify --verdicts`` judges again exactly as the DIM did. Its refusals, in the
order they are checked (the first decides):

- **No roadmap, no contract** (UNAUTHORIZED): before an ``esaa.open`` is carried
  out, every other ``esaa.*`` proposal is refused; so is an agent the contract does
  not name, a kind its contract does not grant, a task its patterns do not cover,
  and a path outside its patterns or outside the task's files (or under ``.git`` or
  ``.roadmap``).
- **The task graph** (CONSTRAINT_VIOLATION): an unknown task; a claim before every
  dependency is done; work on a task nobody claimed, or that another agent claimed;
  anything on a done task but an issue report (a done task is immutable: the report
  opens a hotfix task).
- **Claims and files** (RESOURCE_CONTENTION): a task already claimed; a file another
  open task changed (a conflict: it stays that task's until it is done).
- **Patches that do not apply** (SCHEMA_INVALID, STALE_CONTEXT): a diff that is not
  one plain git diff of its path; a diff made against another version of the file
  than the roadmap recorded (its ``index`` line names that version).
- **Acceptance** (VERIFICATION_REQUIRED): a completion before each of the task's
  acceptance checks passed, in a run recorded after its last patch.

Two agents racing for one task within one batch of the DIM are kept apart by the
pack's resources (``esaa.task:<id>``, capacity 1), which the DIM counts as it
stages; the roadmap itself only changes when an effect is recorded.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from kernel.core.events import Applied, Feedback
from kernel.core.reasons import ReasonCode
from kernel.state.roadmap.diffs import DiffInvalid, FileDiff, parse_diff
from kernel.state.roadmap.model import (
    CLAIM,
    COMPLETE,
    DONE,
    FILE_PATCH,
    IN_PROGRESS,
    KINDS,
    OPEN,
    REPORT,
    RUN_CHECK,
    RoadmapState,
    Task,
)
from kernel.state.roadmap.plan import PlanInvalid, matches, path_problem, read_plan, task_matches

LAYER = "roadmap"
MAX_FILES = 64
"""The most files one patch may change."""
MAX_BASELINE = 2000
"""The most files an opening may name with their versions."""
_BLOB = re.compile(r"[0-9a-f]{40}\Z")

Params = Mapping[str, Any]


def refuse(code: ReasonCode, detail: str, field: str = "") -> Feedback:
    """Return the roadmap layer's refusal."""
    return Feedback(reason_code=code, detail=detail[:1000], layer=LAYER, field=field)


def check(state: RoadmapState, kind: str, params: Params, agent: str) -> Feedback | None:
    """Return the roadmap's refusal of a proposal of ``kind`` by ``agent``, or None."""
    if kind not in KINDS:
        return None
    if kind == OPEN:
        return _open(state, params)
    if not state.open:
        return refuse(
            ReasonCode.UNAUTHORIZED, "no roadmap is open: no contract grants anything yet", "kind"
        )
    task_id = _text(params, "task")
    refused = _contract(state, agent, kind, task_id)
    if refused is not None:
        return refused
    task = state.tasks.get(task_id)
    if task is None:
        return refuse(
            ReasonCode.CONSTRAINT_VIOLATION, f"no task {task_id!r} in the roadmap", "task"
        )
    if task.state == DONE and kind != REPORT:
        return refuse(
            ReasonCode.CONSTRAINT_VIOLATION,
            f"task {task_id} is done (#{task.done_seq}) and immutable: report an issue on it"
            " to open a hotfix task",
            "task",
        )
    return _BY_KIND[kind](state, task, params, agent)


def transform(state: RoadmapState, kind: str, params: Params) -> Applied | None:
    """Return the form an accepted check run is applied in: with the contract's command.

    The agent names a check; what runs is the contract's ``argv`` and time limit, so the
    intent (and the journal) holds exactly the command the adapter runs, and no agent
    ever chooses one.
    """
    if kind != RUN_CHECK:
        return None
    check_ = state.contract.checks.get(_text(params, "check"))
    if check_ is None:
        return None  # refused by check(): never reached for an accepted proposal
    applied = {**params, "argv": list(check_.argv), "timeout_s": check_.timeout_s}
    return Applied(
        kind=RUN_CHECK,
        params=applied,
        reason=f"the contract's command for check {params.get('check')!r} (opened at {state.base})",
    )


def _text(params: Params, name: str) -> str:
    """A text parameter ("" when it is not text: the schema layer refuses that before)."""
    value = params.get(name, "")
    return value if isinstance(value, str) else ""


def _open(state: RoadmapState, params: Params) -> Feedback | None:
    if state.open:
        return refuse(
            ReasonCode.CONSTRAINT_VIOLATION,
            f"a roadmap is open since #{state.opened_seq}: its contract stays in force",
        )
    try:
        read_plan(params.get("contract"), params.get("tasks"))
    except PlanInvalid as exc:
        field = "contract" if exc.where.startswith(".roadmap/contract") else "tasks"
        return refuse(ReasonCode.SCHEMA_INVALID, str(exc), field)
    return _baseline(params.get("files", {}))


def _baseline(files: object) -> Feedback | None:
    """Refuse a list of the tree's files (path -> blob id) that is not one."""
    if not isinstance(files, Mapping) or len(files) > MAX_BASELINE:
        return refuse(
            ReasonCode.SCHEMA_INVALID, f"files: up to {MAX_BASELINE} paths and blob ids", "files"
        )
    for path, blob in files.items():
        problem = path_problem(path)
        if problem is not None:
            return refuse(
                ReasonCode.SCHEMA_INVALID, f"files: {str(path)[:64]!r}: {problem}", "files"
            )
        if not isinstance(blob, str) or not _BLOB.match(blob):
            return refuse(ReasonCode.SCHEMA_INVALID, f"files: {path}: not a blob id", "files")
    return None


def _contract(state: RoadmapState, agent: str, kind: str, task_id: str) -> Feedback | None:
    """Refuse what ``agent``'s contract does not grant: the kind, the task."""
    contract = state.contract.agents.get(agent)
    if contract is None:
        return refuse(ReasonCode.UNAUTHORIZED, f"the contract names no agent {agent!r}")
    if kind not in contract.kinds:
        return refuse(ReasonCode.UNAUTHORIZED, f"{agent}'s contract does not grant {kind}", "kind")
    if not task_matches(task_id, contract.tasks):
        return refuse(
            ReasonCode.UNAUTHORIZED,
            f"task {task_id} is outside {agent}'s tasks ({', '.join(contract.tasks) or 'none'})",
            "task",
        )
    return None


def _mine(task: Task, agent: str) -> Feedback | None:
    """Refuse work on a task ``agent`` has not claimed."""
    if task.state != IN_PROGRESS:
        return refuse(
            ReasonCode.CONSTRAINT_VIOLATION,
            f"task {task.spec.id} is not claimed: claim it first",
            "task",
        )
    if task.claimed_by != agent:
        return refuse(
            ReasonCode.CONSTRAINT_VIOLATION,
            f"task {task.spec.id} is claimed by {task.claimed_by}, not {agent}",
            "task",
        )
    return None


def _claim(state: RoadmapState, task: Task, params: Params, agent: str) -> Feedback | None:
    if task.state == IN_PROGRESS:
        whose = "you" if task.claimed_by == agent else task.claimed_by
        return refuse(
            ReasonCode.RESOURCE_CONTENTION,
            f"task {task.spec.id} is claimed by {whose} (#{task.claimed_seq})",
            "task",
        )
    waiting = [
        f"{dep} ({state.tasks[dep].state})"
        for dep in task.spec.depends_on
        if not state.is_done(dep)
    ]
    if waiting:
        return refuse(
            ReasonCode.CONSTRAINT_VIOLATION,
            f"task {task.spec.id} depends on {', '.join(waiting)}: not done",
            "task",
        )
    return None


def _patch(state: RoadmapState, task: Task, params: Params, agent: str) -> Feedback | None:
    """Judge a patch: every path within the boundaries first, then whose task, then each diff."""
    patches = params.get("patches")
    if not isinstance(patches, Mapping) or not patches:
        return refuse(ReasonCode.SCHEMA_INVALID, "a patch changes at least one file", "patches")
    if not all(isinstance(path, str) for path in patches):
        return refuse(ReasonCode.SCHEMA_INVALID, "a patch's paths are text", "patches")
    if len(patches) > MAX_FILES:
        return refuse(
            ReasonCode.SCHEMA_INVALID, f"{len(patches)} files, over {MAX_FILES}", "patches"
        )
    paths = sorted(patches)
    for path in paths:
        refused = _boundary(state, task, agent, path)
        if refused is not None:
            return refused
    refused = _mine(task, agent)
    for path in paths:
        if refused is not None:
            return refused
        refused = _diff(state, task, path, patches[path])
    return refused


def _boundary(state: RoadmapState, task: Task, agent: str, path: str) -> Feedback | None:
    """Refuse a path outside the tree's writable part, the agent's paths or the task's files."""
    field = f"patches.{path[:64]}"
    problem = path_problem(path)
    if problem is not None:
        return refuse(ReasonCode.UNAUTHORIZED, f"{path[:64]!r}: {problem}", field)
    paths = state.contract.agents[agent].paths
    if not matches(path, paths):
        allowed = ", ".join(paths) or "none"
        return refuse(
            ReasonCode.UNAUTHORIZED, f"{path} is outside {agent}'s paths ({allowed})", field
        )
    if task.spec.files and not matches(path, task.spec.files):
        files = ", ".join(task.spec.files)
        return refuse(
            ReasonCode.UNAUTHORIZED,
            f"{path} is outside task {task.spec.id}'s files ({files})",
            field,
        )
    return None


def _diff(state: RoadmapState, task: Task, path: str, diff: Any) -> Feedback | None:
    """Judge one file's diff: readable, on a file no other open task holds, on its version."""
    field = f"patches.{path[:64]}"
    try:
        parsed = parse_diff(path, diff)
    except DiffInvalid as exc:
        return refuse(ReasonCode.SCHEMA_INVALID, f"{path}: {exc}", field)
    # Whose file it is comes first: a diff made again on the current version would still
    # conflict, while one that conflicts no more may only need making again.
    return _conflict(state, task, path, field) or _stale(state, parsed, field)


def _stale(state: RoadmapState, diff: FileDiff, field: str) -> Feedback | None:
    """Refuse a diff made against another version of the file than the one recorded."""
    known = state.blobs.get(diff.path)
    if known is None:
        return None  # never changed through the roadmap: git checks it against the tree
    if diff.created and known:
        detail = f"{diff.path} exists (blob {known[:12]}): a patch creating it does not apply"
    elif not diff.created and not known:
        detail = f"{diff.path} was deleted: a patch of it does not apply"
    elif not diff.created and not known.startswith(diff.old):
        detail = (
            f"{diff.path}: the patch was made against blob {diff.old[:12]}, the file is at"
            f" {known[:12]} since a later patch: make it again against the file as it is"
        )
    else:
        return None
    return refuse(ReasonCode.STALE_CONTEXT, detail, field)


def _conflict(state: RoadmapState, task: Task, path: str, field: str) -> Feedback | None:
    """Refuse a file another open task changed: it is that task's until that task is done."""
    for other in state.tasks.values():
        if other is task or other.state == DONE or path not in other.touched:
            continue
        return refuse(
            ReasonCode.RESOURCE_CONTENTION,
            f"{path} conflicts with open task {other.spec.id} ({other.claimed_by}), which"
            " changed it: wait until that task is done",
            field,
        )
    return None


def _run(state: RoadmapState, task: Task, params: Params, agent: str) -> Feedback | None:
    if task.state != IN_PROGRESS:
        return refuse(
            ReasonCode.CONSTRAINT_VIOLATION, f"task {task.spec.id} is not claimed: nothing to check"
        )
    name = _text(params, "check")
    if name not in state.contract.checks:
        known = ", ".join(sorted(state.contract.checks)) or "none"
        return refuse(
            ReasonCode.CONSTRAINT_VIOLATION, f"no check {name!r} in the contract ({known})", "check"
        )
    return None


def _complete(state: RoadmapState, task: Task, params: Params, agent: str) -> Feedback | None:
    refused = _mine(task, agent)
    if refused is not None:
        return refused
    for name in task.spec.acceptance:
        run = task.runs.get(name)
        if run is None or run.seq < task.last_patch_seq:
            since = f" since its last patch (#{task.last_patch_seq})" if run else ""
            detail = f"acceptance check {name} of task {task.spec.id} has not run{since}"
        elif not run.passed:
            detail = f"acceptance check {name} of task {task.spec.id} failed (#{run.seq})"
        else:
            continue
        return refuse(
            ReasonCode.VERIFICATION_REQUIRED, f"{detail}: nothing is done before it passes"
        )
    return None


def _report(state: RoadmapState, task: Task, params: Params, agent: str) -> Feedback | None:
    return None  # any task the contract covers, done ones above all (a hotfix follows)


_BY_KIND: dict[str, Callable[[RoadmapState, Task, Params, str], Feedback | None]] = {
    CLAIM: _claim,
    FILE_PATCH: _patch,
    RUN_CHECK: _run,
    COMPLETE: _complete,
    REPORT: _report,
}
