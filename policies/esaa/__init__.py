"""The coding-agents pack, the ESAA way: agents propose, the roadmap and its contract decide.

After the ESAA paper (event sourcing for software-engineering agents; docs/coding-agents.md
maps each of its ideas to what the kernel does). Agents never write to the repository:
they propose, and the kernel's roadmap layer (``kernel.state.roadmap``) judges each
proposal against the contract and the task list the repository itself holds
(``.roadmap/contract.toml``, ``.roadmap/tasks.toml``), then an adapter carries it out
exactly once and the journal records it.

The kinds:

- ``esaa.open``: put the repository's contract and task list in force, as they are at a
  commit (the branch's head). Granted by an agent's manifest alone (an orchestrator);
  once per journal.
- ``esaa.claim``: take a task whose dependencies are done; nobody else may then work it.
- ``esaa.file_patch``: change files, each by a git diff (``file_diff`` makes one), within
  the agent's paths and the task's files, against the version the roadmap knows, on files
  no other open task changed. Committed by the git adapter, one commit per patch.
- ``esaa.run_check``: run one of the contract's checks (tests, a linter) on the working
  tree; the command is the contract's, never the agent's, and its result is recorded.
- ``esaa.complete``: finish a claimed task whose acceptance checks passed after its last
  patch. A done task is immutable.
- ``esaa.report``: report an issue on a task; on a done task it opens a hotfix task.

Claims, completions and reports are carried out by the kernel's ``roadmap`` executor
(their record is their effect); openings, patches and check runs by the ``git`` adapter,
:class:`~policies.esaa.git.GitWorkTree`, which you give the kernel::

    async with open_kernel("work.db", packs=[ESAA], adapters={"git": GitWorkTree(repo)},
                           allow=[...]) as kernel:
        ...

Resources keep proposals racing within one batch of the DIM apart: one open flow per
task (``esaa.task:<id>``), one patch being applied at a time (``esaa.worktree``), one
opening (``esaa.roadmap``). A proposal that finds its pool held is refused with
RESOURCE_CONTENTION and may try again once the other flow has ended.
"""

from __future__ import annotations

import difflib
import hashlib
from typing import Annotated, ClassVar, Literal

import msgspec

from kernel.policy import Consume, Impact, PolicyKind, PolicyPack
from policies.esaa.git import CONTRACT_FILE, TASKS_FILE, GitWorkTree, init_repository, tree_files

_END = "$(?!\\n)"  # Python's "$" also matches before a final line feed
TaskId = Annotated[
    str,
    msgspec.Meta(
        pattern="^[A-Za-z0-9][A-Za-z0-9._-]{0,79}" + _END,
        description="a task of the roadmap, e.g. 'T-12' or 'T-12.fix1'",
    ),
]
CheckName = Annotated[
    str,
    msgspec.Meta(
        pattern="^[A-Za-z0-9][A-Za-z0-9._-]{0,63}" + _END,
        description="a check of the contract, e.g. 'tests'",
    ),
]
Commit = Annotated[
    str, msgspec.Meta(pattern="^[0-9a-f]{40}" + _END, description="a full git commit id")
]
Blob = Annotated[
    str, msgspec.Meta(pattern="^[0-9a-f]{40}" + _END, description="a full git blob id")
]
FileText = Annotated[str, msgspec.Meta(max_length=32 * 1024)]
Diff = Annotated[
    str,
    msgspec.Meta(
        max_length=48 * 1024,
        description="the file's diff as `git diff --full-index` writes it (see file_diff)",
    ),
]
Line = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Text = Annotated[str, msgspec.Meta(max_length=4000)]


class OpenRoadmap(PolicyKind, tag="esaa.open"):
    """Put the contract and the task list in force, as the repository holds them at ``commit``.

    ``files`` names files of the tree with their blob ids at ``commit`` (``tree_files``
    lists them): from then on the DIM refuses a patch of one of them made against another
    version. The adapter checks each against the commit.
    """

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "git"
    impact: ClassVar[Impact] = Impact.HIGH_IMPACT

    commit: Commit
    contract: FileText
    tasks: FileText
    files: dict[str, Blob] = {}


class ClaimTask(PolicyKind, tag="esaa.claim"):
    """Claim ``task``: its dependencies are done, and nobody else has it."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "roadmap"
    impact: ClassVar[Impact] = Impact.LOW_IMPACT

    task: TaskId


class FilePatch(PolicyKind, tag="esaa.file_patch"):
    """Change files for ``task``: ``patches`` maps each path to its git diff."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "git"
    impact: ClassVar[Impact] = Impact.LOW_IMPACT

    task: TaskId
    patches: dict[str, Diff]
    message: Text = ""


class RunCheck(PolicyKind, tag="esaa.run_check"):
    """Run the contract's check ``check`` on the working tree, for ``task``."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "git"
    impact: ClassVar[Impact] = Impact.LOW_IMPACT

    task: TaskId
    check: CheckName


class CompleteTask(PolicyKind, tag="esaa.complete"):
    """Mark ``task`` done: its acceptance checks passed after its last patch."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "roadmap"
    impact: ClassVar[Impact] = Impact.LOW_IMPACT

    task: TaskId
    summary: Text = ""


class ReportIssue(PolicyKind, tag="esaa.report"):
    """Report an issue on ``task``; on a done task, a hotfix task opens."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "roadmap"
    impact: ClassVar[Impact] = Impact.LOW_IMPACT

    task: TaskId
    title: Line
    details: Text = ""
    severity: Literal["low", "medium", "high", "critical"] = "medium"


def _one(params: object) -> int:
    """A flow holds one unit of its pool while it is open."""
    return 1


KINDS = (OpenRoadmap, ClaimTask, FilePatch, RunCheck, CompleteTask, ReportIssue)

ESAA = PolicyPack(
    name="esaa",
    version="0.1.0",
    kinds=KINDS,
    consumes=(
        Consume(OpenRoadmap, "esaa.roadmap", _one),
        Consume(ClaimTask, "esaa.task:{task}", _one),
        Consume(FilePatch, "esaa.task:{task}", _one),
        Consume(FilePatch, "esaa.worktree", _one),
        Consume(RunCheck, "esaa.task:{task}", _one),
        Consume(CompleteTask, "esaa.task:{task}", _one),
    ),
    capacities={"esaa.roadmap": 1, "esaa.task:*": 1, "esaa.worktree": 1},
)
"""The shipped coding-agents pack."""

ZERO = "0" * 40
"""The blob id of no file (a diff's ``index`` line for a file created or deleted)."""


def blob_id(content: str | bytes) -> str:
    """Return git's blob id of ``content`` (``git hash-object``), str as UTF-8."""
    data = content.encode() if isinstance(content, str) else content
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def file_diff(path: str, before: str | None, after: str | None) -> str:
    """Return the git diff of file ``path`` from ``before`` to ``after`` (None: no file).

    The diff names both versions by blob id (``git diff --full-index``), which is how the
    kernel tells a patch made against the file as it is from one made against another
    version. Lines end at line feeds only, as git's do.

    Raises:
        ValueError: ``before`` and ``after`` are the same.
    """
    if before == after:
        raise ValueError(f"{path}: no change to make a diff of")
    old = blob_id(before) if before is not None else ZERO
    new = blob_id(after) if after is not None else ZERO
    head = [f"diff --git a/{path} b/{path}"]
    if before is None:
        head += ["new file mode 100644", f"index {old}..{new}"]
    elif after is None:
        head += ["deleted file mode 100644", f"index {old}..{new}"]
    else:
        head.append(f"index {old}..{new} 100644")
    a, b = _lines(before or ""), _lines(after or "")
    if not a and not b:
        return "\n".join(head) + "\n"  # an empty file created or deleted: no hunk
    head.append("--- /dev/null" if before is None else f"--- a/{path}")
    head.append("+++ /dev/null" if after is None else f"+++ b/{path}")
    body = []
    for line in list(difflib.unified_diff(a, b, n=3))[2:]:
        if line.startswith("@@") or line.endswith("\n"):
            body.append(line)
        else:
            body.append(line + "\n\\ No newline at end of file\n")
    return "\n".join(head) + "\n" + "".join(body)


def _lines(text: str) -> list[str]:
    """Split at line feeds only, keeping them (str.splitlines also splits at \\r, \\f...)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    return [*lines, parts[-1]] if parts[-1] else lines


__all__ = [
    "CONTRACT_FILE",
    "ESAA",
    "KINDS",
    "TASKS_FILE",
    "ZERO",
    "Blob",
    "CheckName",
    "ClaimTask",
    "CompleteTask",
    "FilePatch",
    "GitWorkTree",
    "OpenRoadmap",
    "ReportIssue",
    "RunCheck",
    "TaskId",
    "blob_id",
    "file_diff",
    "init_repository",
    "tree_files",
]
