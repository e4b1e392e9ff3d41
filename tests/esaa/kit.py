"""What the roadmap's tests share: a repository under work, scripted coders, one act at a time.

A test builds a real git repository (``repository``) holding a contract and a task
list, opens a kernel with the ``esaa`` pack and the real git adapter (``desk``), and
lets each agent take one step per flow (:meth:`Desk.act`), which answers what the
kernel recorded: the flow's status, and the refusal's reason code and detail.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel import FlowStatus, Kernel, KernelConfig, Manifest, Ports, Proposal, open_kernel
from kernel import WorkingContext as Context
from kernel.core import events as ev
from kernel.testing import ManualClock, SeededIds
from policies.esaa import ESAA, GitWorkTree, file_diff, init_repository, tree_files
from tests.support.principals import LOCAL

PY = sys.executable
WORK = ["esaa.claim", "esaa.file_patch", "esaa.run_check", "esaa.complete", "esaa.report"]

CONTRACT = f"""\
[project]
name = "kit"

[checks.tests]
argv = [{PY!r}, "-B", "-m", "unittest", "discover", "-s", "tests", "-t", "."]
timeout_s = 60

[checks.ok]
argv = [{PY!r}, "-c", "pass"]
timeout_s = 30

[agents.ada]
kinds = {WORK!r}
paths = ["pkg/**"]
tasks = ["T-1*", "T-3*"]

[agents.bo]
kinds = {WORK!r}
paths = ["pkg/**", "tests/**"]
tasks = ["T-1*", "T-2*", "T-3*"]

[agents.eve]
kinds = ["esaa.claim", "esaa.file_patch"]
paths = ["docs/**"]
tasks = ["T-4"]

[agents.quinn]
kinds = ["esaa.report"]
tasks = ["*"]
"""

TASKS = """\
[[tasks]]
id = "T-1"
title = "the first function"
phase = "PH-1"
files = ["pkg/one.py", "pkg/__init__.py"]
acceptance = ["ok"]

[[tasks]]
id = "T-2"
title = "its tests"
kind = "qa"
phase = "PH-1"
depends_on = ["T-1"]
acceptance = ["tests"]

[[tasks]]
id = "T-3"
title = "the second function"
phase = "PH-1"
files = ["pkg/three.py", "pkg/__init__.py"]
acceptance = ["ok"]

[[tasks]]
id = "T-4"
title = "the docs"
kind = "spec"
phase = "PH-2"
depends_on = ["T-1", "T-2", "T-3"]
acceptance = ["ok"]
"""

FILES = {
    ".roadmap/contract.toml": CONTRACT,
    ".roadmap/tasks.toml": TASKS,
    "pkg/__init__.py": '"""pkg."""\n',
    "tests/__init__.py": "",
}
AGENTS = {
    "lead": ["esaa.open"],
    "ada": WORK,
    "bo": WORK,
    # Her manifest claims more than the repository's contract grants her.
    "eve": ["esaa.claim", "esaa.file_patch", "esaa.run_check"],
    "quinn": ["esaa.report"],
    # Allowed by the kernel, unknown to the contract.
    "mallory": WORK,
}

Step = Callable[[Context], Mapping[str, Any]]


def repository(path: Path, files: Mapping[str, str] | None = None) -> str:
    """Create the repository under work at ``path``; return its head commit."""
    return init_repository(path, FILES if files is None else files)


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo``; return its output."""
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout


def commits_with(repo: Path, key: str) -> list[str]:
    """The commits of the branch whose message carries ``Dirk-Key: key``."""
    return git(repo, "log", "--format=%H", "-F", f"--grep=Dirk-Key: {key}").split()


class Coder:
    """An agent that plays the step the test hands it, once per flow (``max_attempts=1``)."""

    def __init__(self, agent_id: str, kinds: list[str]) -> None:
        self.manifest = Manifest(
            agent_id=agent_id,
            version="1.0.0",
            capabilities=kinds,
            subscriptions=[f"work.{agent_id}"],
            max_attempts=1,
        )
        self.steps: list[Step] = []

    async def decide(self, ctx: Context) -> Proposal | None:
        """Propose this flow's step."""
        return ctx.propose(dict(self.steps.pop(0)(ctx)), valid_for_s=3600)


@dataclass(frozen=True)
class Outcome:
    """How the kernel answered one step: the flow's end, and the refusal if any."""

    dfid: str
    status: FlowStatus
    code: str = ""
    detail: str = ""
    receipt: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """Whether the step was carried out (its flow closed)."""
        return self.status is FlowStatus.CLOSED


@dataclass
class Desk:
    """A kernel with the esaa pack over one repository, and its coders."""

    kernel: Kernel
    repo: Path
    head: str
    coders: dict[str, Coder]

    def read(self, path: str) -> str | None:
        """What the working tree holds at ``path`` (None: no file)."""
        target = self.repo / path
        return target.read_text() if target.exists() else None

    def diff(self, path: str, after: str | None) -> str:
        """The diff from what the tree holds at ``path`` now to ``after``."""
        return file_diff(path, self.read(path), after)

    async def act(self, agent: str, step: Mapping[str, Any] | Step) -> Outcome:
        """Let ``agent`` take one step; return what the kernel recorded of it."""
        self.coders[agent].steps.append(step if callable(step) else (lambda _: step))
        [dfid] = await self.kernel.trigger(f"work.{agent}")
        flow = await self.kernel.wait_flow(dfid)
        code = detail = ""
        receipt: dict[str, Any] = {}
        for event in await self.kernel.journal.flow_events(dfid):
            match event.payload:
                case ev.ProposalRejected(feedback=feedback):
                    code, detail = str(feedback.reason_code), feedback.detail
                case ev.FlowAborted(reason_code=reason, detail=why) if not code:
                    code, detail = str(reason), why
                case ev.ExecutionSucceeded(detail=found):
                    receipt = dict(found)
        return Outcome(dfid, flow.status, code, detail, receipt)

    async def open(self) -> Outcome:
        """The lead opens the roadmap at the head, naming the versions of the tree's files."""
        files = tree_files(self.repo, self.head)
        return await self.act(
            "lead",
            {
                "kind": "esaa.open",
                "commit": self.head,
                "contract": CONTRACT,
                "tasks": TASKS,
                "files": files,
            },
        )

    async def patch(self, agent: str, task: str, files: Mapping[str, str | None]) -> Outcome:
        """``agent`` patches ``files`` (path -> new text, None: delete) for ``task``."""
        return await self.act(
            agent,
            lambda _: {
                "kind": "esaa.file_patch",
                "task": task,
                "patches": {path: self.diff(path, text) for path, text in files.items()},
            },
        )


def claim(task: str) -> dict[str, Any]:
    return {"kind": "esaa.claim", "task": task}


def run(task: str, check: str) -> dict[str, Any]:
    return {"kind": "esaa.run_check", "task": task, "check": check}


def complete(task: str) -> dict[str, Any]:
    return {"kind": "esaa.complete", "task": task, "summary": "done"}


@asynccontextmanager
async def desk(
    tmp_path: Path,
    files: Mapping[str, str] | None = None,
    adapter: GitWorkTree | None = None,
    db: Path | None = None,
) -> AsyncIterator[Desk]:
    """A kernel on ``tmp_path / "j.db"`` with the esaa pack over a fresh repository."""
    repo = tmp_path / "repo"
    head = repository(repo, files) if not repo.exists() else git(repo, "rev-parse", "HEAD").strip()
    coders = {name: Coder(name, kinds) for name, kinds in AGENTS.items()}
    async with open_kernel(
        db or tmp_path / "j.db",
        packs=[ESAA],
        adapters={"git": adapter or GitWorkTree(repo)},
        allow=list(coders),
        config=KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(), ids=SeededIds(7))),
    ) as kernel:
        for coder in coders.values():
            await kernel.register(coder)
        yield Desk(kernel, repo, head, coders)
