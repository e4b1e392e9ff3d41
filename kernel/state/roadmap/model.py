"""The roadmap's data: boundary contracts, tasks, runs and issues, as plain msgspec structs.

Everything here is folded from the journal (kernel.state.roadmap.domain) and saved in
snapshots as it is, so it is plain data: frozen records inside one mutable
:class:`RoadmapState`, replaced (never edited) when a task moves on.

The vocabulary follows the ESAA paper (docs/coding-agents.md maps it): an agent's
*contract* names the kinds it may propose, the paths it may write and the tasks it
may work; a *task* has a kind (``spec``, ``impl``, ``qa``; ``hotfix`` for the ones an
issue report opens), a phase, dependencies, the files it may touch and its acceptance
checks; its state goes ``todo`` -> ``in_progress`` -> ``done`` and never back.
"""

from __future__ import annotations

from typing import Final

import msgspec

# --- the policy kinds the roadmap judges and folds (policies/esaa declares them) --------

OPEN: Final = "esaa.open"
"""Open the roadmap: the contract and the task list, as the repository holds them at a commit."""
CLAIM: Final = "esaa.claim"
FILE_PATCH: Final = "esaa.file_patch"
RUN_CHECK: Final = "esaa.run_check"
COMPLETE: Final = "esaa.complete"
REPORT: Final = "esaa.report"
TASK_KINDS: Final = frozenset({CLAIM, FILE_PATCH, RUN_CHECK, COMPLETE, REPORT})
"""The kinds that act on one task (``params["task"]``); a contract grants only these."""
KINDS: Final = TASK_KINDS | {OPEN}

ROADMAP_ADAPTER: Final = "roadmap"
"""The built-in executor of claims, completions and reports: its effect is the record."""
GIT_ADAPTER: Final = "git"
"""The adapter of the repository under work (opening, patches, checks): yours to give."""

TODO: Final = "todo"
IN_PROGRESS: Final = "in_progress"
DONE: Final = "done"

TASK_TYPES: Final = ("spec", "impl", "qa")
"""The kinds of task a task list may declare."""
HOTFIX: Final = "hotfix"
"""The kind of the tasks an issue report on a done task opens."""
SEVERITIES: Final = ("low", "medium", "high", "critical")

CONTRACT_FILE: Final = ".roadmap/contract.toml"
TASKS_FILE: Final = ".roadmap/tasks.toml"
"""Where the repository under work keeps its contract and its task list (no agent writes there)."""


class Check(msgspec.Struct, frozen=True, gc=False, kw_only=True, forbid_unknown_fields=True):
    """A verification command of the contract: what runs, and for how long at most."""

    argv: list[str]
    timeout_s: int = 300


class AgentContract(
    msgspec.Struct, frozen=True, gc=False, kw_only=True, forbid_unknown_fields=True
):
    """One agent's boundary: the kinds it may propose, the paths it may write, its tasks.

    ``paths`` and ``tasks`` are glob patterns (``*`` within a path segment, ``**``
    across segments, ``?`` one character; see kernel.state.roadmap.plan).
    """

    kinds: list[str]
    paths: list[str] = []
    tasks: list[str] = []


class Contract(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """The repository's contract file, as validated: the project, its checks, its agents."""

    project: str = ""
    checks: dict[str, Check] = {}
    agents: dict[str, AgentContract] = {}


class TaskSpec(msgspec.Struct, frozen=True, gc=False, kw_only=True, forbid_unknown_fields=True):
    """One task of the task list, as its author wrote it."""

    id: str
    title: str
    kind: str = "impl"
    phase: str = ""
    depends_on: list[str] = []
    files: list[str] = []
    """Patterns of the files its patches may touch (none: the agent's paths alone decide)."""
    acceptance: list[str] = []
    """The checks that must pass (after its last patch) before it may be completed."""


class RunRecord(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """The recorded result of one check run on a task (its ExecutionSucceeded)."""

    check: str
    passed: bool
    exit_code: int | None = None
    timed_out: bool = False
    commit: str = ""
    seq: int
    agent: str = ""


class Issue(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """An issue reported on a task; ``hotfix`` names the task it opened (a done task's)."""

    seq: int
    agent: str
    title: str
    severity: str = "medium"
    details: str = ""
    hotfix: str = ""


class Task(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A task of the roadmap as folded so far."""

    spec: TaskSpec
    state: str = TODO
    claimed_by: str = ""
    claimed_seq: int = 0
    commits: list[str] = []
    touched: list[str] = []
    """The files its committed patches changed (sorted): what conflicts with other open tasks."""
    last_patch_seq: int = 0
    runs: dict[str, RunRecord] = {}
    """The latest run of each check on it."""
    done_seq: int = 0
    summary: str = ""
    acceptance_results: dict[str, bool] = {}
    """Each acceptance check's result when it was completed (ESAA's ``acceptance_results``)."""
    issues: list[Issue] = []
    hotfix_of: str = ""


class RoadmapState(msgspec.Struct, kw_only=True):
    """The roadmap projection: plain data, so a snapshot stores and restores it as is.

    Empty (``opened_seq == 0``) until an ``esaa.open`` is carried out; the digest leaves
    it out while it is empty, so journals without a roadmap hash as before.
    """

    opened_seq: int = 0
    opened_by: str = ""
    base: str = ""
    """The commit the roadmap was opened at."""
    head: str = ""
    """The last commit a patch of the roadmap made (the base until then)."""
    contract: Contract = msgspec.field(default_factory=Contract)
    tasks: dict[str, Task] = {}
    """The tasks by id, in the order they were opened (the task list's, then hotfixes)."""
    blobs: dict[str, str] = {}
    """The version (git blob id, "" once deleted) of each file the opening named or a
    recorded patch changed. The DIM refuses a patch made against another version of such
    a file; of any other file, git is the judge, at execution."""
    phases: dict[str, int] = {}
    """Each phase, and the seq of the completion that finished its last task (0: open).
    A finished phase stays finished: a hotfix opened later is a new path, not a reopening."""

    def copy(self) -> RoadmapState:
        """Return a copy later folds leave alone (tasks are frozen; the maps are copied)."""
        return RoadmapState(
            opened_seq=self.opened_seq,
            opened_by=self.opened_by,
            base=self.base,
            head=self.head,
            contract=self.contract,
            tasks=dict(self.tasks),
            blobs=dict(self.blobs),
            phases=dict(self.phases),
        )

    @property
    def open(self) -> bool:
        """Whether a roadmap was opened."""
        return self.opened_seq > 0

    def is_done(self, task_id: str) -> bool:
        """Whether task ``task_id`` exists and is done."""
        task = self.tasks.get(task_id)
        return task is not None and task.state == DONE


# --- what the adapters' receipts say (ExecutionSucceeded.detail), read by the fold ------


class OpenReceipt(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """An opening carried out: the commit whose contract and task list are in force."""

    commit: str


class PatchReceipt(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A patch committed: the commit, and each changed file's blob id after it ("": deleted)."""

    commit: str
    files: dict[str, str] = {}


class RunReceipt(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A check run: whether it passed (exit 0 within its time), on which commit."""

    passed: bool
    exit_code: int | None = None
    timed_out: bool = False
    commit: str = ""
