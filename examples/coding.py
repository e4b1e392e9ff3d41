"""Coding agents under the kernel, the ESAA way: a small roadmap worked on a real git repository.

Five scripted agents and a lead work the roadmap of ``textkit`` (slugify, its tests,
title_case, the docs) in a fresh git repository. None of them writes a file: each
proposes (claim, patch, run a check, complete, report), the kernel judges it against
the repository's own contract and task list (``.roadmap/``), and the git adapter
carries it out once, a commit per patch. On the way:

- ben's claim of the tests comes before slugify is done: refused (dependencies);
- cy claims a task ada holds: refused (claims);
- eve, the docs writer, tries to write code: refused (her contract's paths);
- cy's title_case touches ``__init__.py`` while ada's open task holds it: a conflict,
  refused; later the same diff no longer applies (the file moved on): refused again,
  then made afresh and committed;
- ben's tests fail against ada's slugify; slugify is done, so it is immutable: quinn's
  issue report opens a hotfix task, ada fixes it there, and the tests pass;
- ben cannot complete his task before his acceptance run has passed.

Then it prints the roadmap (``dirk roadmap``), ``git log``, and checks what the journal
proves: the chain and the projections verify, every verdict re-judges the same, and the
roadmap replayed from the journal is the one the kernel held live.

    python -m examples.coding --seed 1 --db coding.db
    dirk verify --db coding.db --verdicts --pack policies.esaa
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from agents_sdk import Agent, Manifest, Proposal, WorkingContext
from examples.clock import SimClock
from examples.summary import journal_and_files, read_events, show, summarize
from kernel import FlowStatus, Kernel, KernelConfig, Ports, Principal, Supervision, open_kernel
from kernel.audit import events as ev
from kernel.audit import fold, open_journal, redact, rejudge
from kernel.testing import SeededIds
from policies.esaa import (
    CONTRACT_FILE,
    ESAA,
    TASKS_FILE,
    GitWorkTree,
    file_diff,
    init_repository,
    tree_files,
)

Step = Callable[[WorkingContext], dict[str, Any]]
WORK = ["esaa.claim", "esaa.file_patch", "esaa.run_check", "esaa.complete"]
PY = sys.executable

CONTRACT = f"""\
# Who may do what in this repository: the kernel refuses anything else.
[project]
name = "textkit"

[checks.tests]
argv = [{PY!r}, "-B", "-m", "unittest", "discover", "-s", "tests", "-t", "."]
timeout_s = 60

[checks.lint]
argv = [{PY!r}, "-B", "-m", "py_compile", "textkit/__init__.py"]
timeout_s = 60

[agents.ada]
kinds = {WORK!r}
paths = ["textkit/**"]
tasks = ["T-1*", "T-3*"]

[agents.cy]
kinds = {WORK!r}
paths = ["textkit/**"]
tasks = ["T-1*", "T-3*"]

[agents.ben]
kinds = {WORK!r}
paths = ["tests/**"]
tasks = ["T-2*"]

[agents.eve]
kinds = {WORK!r}
paths = ["README.md", "docs/**"]
tasks = ["T-4*"]

[agents.quinn]
kinds = ["esaa.report", "esaa.run_check"]
tasks = ["*"]
"""

TASKS = """\
[[tasks]]
id = "T-1"
title = "slugify(): text to a URL slug"
kind = "impl"
phase = "PH-1"
files = ["textkit/slug.py", "textkit/__init__.py"]
acceptance = ["lint"]

[[tasks]]
id = "T-2"
title = "tests for slugify()"
kind = "qa"
phase = "PH-1"
depends_on = ["T-1"]
files = ["tests/test_slug.py"]
acceptance = ["tests"]

[[tasks]]
id = "T-3"
title = "title_case(): capitalise each word"
kind = "impl"
phase = "PH-1"
files = ["textkit/title.py", "textkit/__init__.py"]
acceptance = ["lint"]

[[tasks]]
id = "T-4"
title = "document the helpers"
kind = "spec"
phase = "PH-2"
depends_on = ["T-1", "T-2", "T-3"]
files = ["README.md", "docs/**"]
acceptance = ["tests"]
"""

INIT = '"""textkit: small text helpers."""\n'
INIT_SLUG = INIT + '\nfrom textkit.slug import slugify\n\n__all__ = ["slugify"]\n'
INIT_BOTH = (
    INIT
    + "\nfrom textkit.slug import slugify\nfrom textkit.title import title_case\n\n"
    + '__all__ = ["slugify", "title_case"]\n'
)
INIT_TITLE = INIT + '\nfrom textkit.title import title_case\n\n__all__ = ["title_case"]\n'
SLUG = '''"""Text to URL slugs."""


def slugify(text: str) -> str:
    """Return ``text`` in lower case, its words joined by hyphens."""
    return "-".join(text.lower().split())
'''
SLUG_FIXED = '''"""Text to URL slugs."""

import re


def slugify(text: str) -> str:
    """Return ``text`` in lower case, its words joined by hyphens, punctuation dropped."""
    return "-".join(re.findall(r"[a-z0-9]+", text.lower()))
'''
TESTS = """import unittest

from textkit import slugify


class SlugifyTest(unittest.TestCase):
    def test_words_are_joined_by_hyphens(self) -> None:
        self.assertEqual(slugify("Small Text Helpers"), "small-text-helpers")

    def test_punctuation_is_dropped(self) -> None:
        self.assertEqual(slugify("Hello, World!"), "hello-world")
"""
TITLE = '''"""Title case."""


def title_case(text: str) -> str:
    """Return ``text`` with each word capitalised."""
    return " ".join(word.capitalize() for word in text.split())
'''
README = "# textkit\n\nSmall text helpers.\n"
README_DOCS = (
    README + "\n- `slugify(text)`: a URL slug.\n- `title_case(text)`: Each Word Capitalised.\n"
)
FILES = {
    "README.md": README,
    CONTRACT_FILE: CONTRACT,
    TASKS_FILE: TASKS,
    "textkit/__init__.py": INIT,
    "tests/__init__.py": "",
}


class Coder(Agent):
    """A scripted coding agent: for each flow it is woken for, it plays its next step.

    A step reads the repository (reading is free; writing is the kernel's) and returns
    the proposal; ``max_attempts=1``: a refusal ends the flow, and the story goes on.
    """

    def __init__(self, agent_id: str, kinds: list[str]) -> None:
        self.manifest = Manifest(
            agent_id=agent_id,
            version="1.0.0",
            capabilities=kinds,
            subscriptions=[f"work.{agent_id}"],
            max_attempts=1,
        )
        self.steps: list[Step] = []

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        step = self.steps.pop(0)
        return ctx.propose(step(ctx), explain=f"{self.manifest.agent_id}'s next step")


@dataclass
class Desk:
    """The run: the kernel, the repository, the agents and the story so far."""

    kernel: Kernel
    repo: Path
    clock: SimClock
    agents: dict[str, Coder]
    told: int = 0

    def read(self, path: str) -> str | None:
        """What the repository's working tree holds at ``path`` (None: no such file)."""
        target = self.repo / path
        return target.read_text() if target.exists() else None

    def change(self, path: str, after: str | None) -> str:
        """The diff of ``path`` from what the tree holds now to ``after``."""
        return file_diff(path, self.read(path), after)

    async def act(self, agent: str, what: str, step: Step | dict[str, Any]) -> str:
        """Let ``agent`` take ``step``; print and return how the kernel answered."""
        self.told += 1
        self.clock.at_minute(self.told)
        self.agents[agent].steps.append(step if callable(step) else fixed(step))
        [dfid] = await self.kernel.trigger(f"work.{agent}")
        flow = await self.kernel.wait_flow(dfid)
        answer = "done" if flow.status is FlowStatus.CLOSED else str(flow.status)
        for event in await self.kernel.journal.flow_events(dfid):
            match event.payload:
                case ev.ExecutionSucceeded(detail={"passed": passed}):
                    answer = "passed" if passed else "FAILED"  # a check run's result
                case ev.ProposalRejected(feedback=feedback):
                    answer = f"refused {feedback.reason_code}: {feedback.detail}"
                case ev.FlowAborted(reason_code=code, detail=why) if answer == str(flow.status):
                    answer = f"failed {code}: {why}"
        progress(f"{self.told:>2}. {agent:<5} {what}: {answer}")
        return answer


async def story(desk: Desk, head: str) -> None:
    """The day's work, in order (see the module docstring)."""
    act, change = desk.act, desk.change
    # The opening names the tree's files with their versions: a patch made against another
    # version of one of them is refused by the DIM, before the adapter is ever asked.
    files = tree_files(desk.repo, head)
    opened = {
        "kind": "esaa.open",
        "commit": head,
        "contract": CONTRACT,
        "tasks": TASKS,
        "files": files,
    }
    await act("lead", "opens the roadmap at the head", opened)
    await act("ben", "claims T-2 (tests) before T-1 is done", claim("T-2"))
    await act("ada", "claims T-1 (slugify)", claim("T-1"))
    await act("cy", "claims T-1 too", claim("T-1"))
    await act("cy", "claims T-3 (title_case)", claim("T-3"))
    # cy starts on title_case() at once: its diffs are made on the tree as it is now.
    title = {
        "textkit/title.py": change("textkit/title.py", TITLE),
        "textkit/__init__.py": change("textkit/__init__.py", INIT_TITLE),
    }
    slug = {"textkit/slug.py": SLUG, "textkit/__init__.py": INIT_SLUG}
    await act("ada", "writes slugify()", lambda _: patch("T-1", change, slug, "slugify"))
    await act("cy", "writes title_case(), and __init__.py", patch_of("T-3", title))
    sneaky = {"textkit/slug.py": change("textkit/slug.py", SLUG.replace("-", "_"))}
    await act("eve", "edits slugify() under the docs task", patch_of("T-4", sneaky))
    await act("ada", "runs lint on T-1", run("T-1", "lint"))
    await act("ada", "completes T-1", done("T-1", "slugify() in textkit/slug.py"))
    await act("ben", "claims T-2", claim("T-2"))
    tests = {"tests/test_slug.py": TESTS}
    await act("ben", "writes the tests", lambda _: patch("T-2", change, tests, "slugify tests"))
    await act("ben", "runs the tests", run("T-2", "tests"))
    await act("ben", "completes T-2 anyway", done("T-2", "tests written"))
    issue = {
        "kind": "esaa.report",
        "task": "T-1",
        "title": "slugify() keeps punctuation",
        "details": "slugify('Hello, World!') == 'hello,-world!'",
        "severity": "high",
    }
    await act("quinn", "reports an issue on T-1 (done)", issue)
    fix = {"textkit/slug.py": SLUG_FIXED}
    await act("ada", "patches T-1 itself", lambda _: patch("T-1", change, fix, "fix slugify"))
    await act("ada", "claims the hotfix T-1.fix1", claim("T-1.fix1"))
    await act("ada", "fixes slugify()", lambda _: patch("T-1.fix1", change, fix, "fix slugify"))
    await act("ada", "runs lint on T-1.fix1", run("T-1.fix1", "lint"))
    await act("ada", "completes T-1.fix1", done("T-1.fix1", "punctuation dropped"))
    await act("ben", "runs the tests again", run("T-2", "tests"))
    await act("ben", "completes T-2", done("T-2", "slugify() is tested"))
    await act("cy", "proposes its first title_case() patch again", patch_of("T-3", title))
    both = {"textkit/title.py": TITLE, "textkit/__init__.py": INIT_BOTH}
    await act("cy", "makes the patch afresh", lambda _: patch("T-3", change, both, "title_case"))
    await act("cy", "runs lint on T-3", run("T-3", "lint"))
    await act("cy", "completes T-3", done("T-3", "title_case() in textkit/title.py"))
    await act("eve", "claims T-4 (docs)", claim("T-4"))
    docs = {"README.md": README_DOCS}
    await act("eve", "documents the helpers", lambda _: patch("T-4", change, docs, "docs"))
    await act("eve", "runs the tests", run("T-4", "tests"))
    await act("eve", "completes T-4", done("T-4", "README lists the helpers"))


def fixed(policy: dict[str, Any]) -> Step:
    """A step that proposes ``policy`` whatever the context."""
    return lambda _: policy


def claim(task: str) -> dict[str, Any]:
    return {"kind": "esaa.claim", "task": task}


def run(task: str, check: str) -> dict[str, Any]:
    return {"kind": "esaa.run_check", "task": task, "check": check}


def done(task: str, summary: str) -> dict[str, Any]:
    return {"kind": "esaa.complete", "task": task, "summary": summary}


def patch_of(task: str, diffs: dict[str, str]) -> dict[str, Any]:
    return {"kind": "esaa.file_patch", "task": task, "patches": diffs}


def patch(
    task: str, change: Callable[[str, str | None], str], files: dict[str, str], message: str
) -> dict[str, Any]:
    """A patch of ``files`` (path -> new text), its diffs made on the tree as it is now."""
    diffs = {path: change(path, text) for path, text in files.items()}
    return {**patch_of(task, diffs), "message": message}


async def simulate(seed: int, db: Path | str, repo: Path) -> dict[str, Any]:
    """Run the story into journal ``db`` and repository ``repo``; return the live roadmap."""
    clock = SimClock()
    head = init_repository(repo, FILES, message="textkit: the roadmap", now_ns=clock.now_ns())
    git = GitWorkTree(repo, now_ns=clock.now_ns)
    agents = {name: Coder(name, WORK) for name in ("ada", "cy", "ben", "eve")}
    agents["lead"] = Coder("lead", ["esaa.open"])
    agents["quinn"] = Coder("quinn", ["esaa.report", "esaa.run_check"])
    async with open_kernel(
        db,
        packs=[ESAA],
        adapters={"git": git},
        allow=list(agents),
        config=KernelConfig(
            # This host vouches for one local user: every flow acts on its behalf
            # (KernelConfig.principal; docs/identity.md).
            principal=Principal(tenant="local", user="local"),
            ports=Ports(clock=clock, ids=SeededIds(seed), jitter_seed=seed),
            supervision=Supervision(inbox_poll_s=None),
        ),
    ) as kernel:
        for agent in agents.values():
            await kernel.register(agent)
        await story(Desk(kernel, repo, clock, agents), head)
        live: dict[str, Any] = kernel.projections.snapshot()["roadmap"]
    return live


async def check(db: Path | str, live: dict[str, Any]) -> dict[str, Any]:
    """What the journal proves: the summary, the verdicts re-judged, the roadmap replayed."""
    summary = await summarize(db, ("esaa.file_patch",))
    replayed = fold(await read_events(db)).snapshot().get("roadmap", {})
    async with open_journal(db, readonly=True) as journal:
        verdicts = await rejudge(journal, [ESAA])
    tasks = replayed.get("tasks", {})
    summary["story.roadmap"] = {t: tasks[t]["state"] for t in tasks}
    summary["story.verdicts"] = f"{verdicts.judged} re-judged, {len(verdicts.changes)} differ"
    summary["story.replay"] = (
        f"the roadmap replayed from the journal is the live one: {ev.digest(replayed)[:16]}"
        if ev.digest(replayed) == ev.digest(live)
        else f"DIFFERS: live {ev.digest(live)[:16]}, replayed {ev.digest(replayed)[:16]}"
    )
    summary["roadmap_hash"] = ev.digest(replayed)
    summary["verified"] = (
        summary["verified"] and not verdicts.changes and ev.digest(replayed) == ev.digest(live)
    )
    return summary


def printed(*argv: str, cwd: Path | None = None) -> None:
    """Run a command and print what it printed (through this process's stdout)."""
    done_ = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    print(done_.stdout, end="")
    if done_.returncode:
        print(done_.stderr, end="", file=sys.stderr)


def progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m examples.coding", description=__doc__.split("\n")[0]
    )
    p.add_argument("--seed", type=int, default=1, help="the seed of the run's ids (default 1)")
    p.add_argument(
        "--db", help="journal file or postgresql:// URL (default: a fresh temporary file)"
    )
    p.add_argument("--repo", help="where to create the repository (default: beside the journal)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on the last line")
    args = p.parse_args(argv)
    db, files = journal_and_files(args.db, "coding.db")
    repo = Path(args.repo) if args.repo else files.with_name(f"{files.stem}.repo")
    for taken in (files, repo):
        if taken.exists():
            print(f"error: {taken} exists; pick a new --db (or --repo) path", file=sys.stderr)
            return 2
    print(
        f"coding agents, seed {args.seed} -> {redact(str(db))}, repository {repo}", file=sys.stderr
    )
    live = anyio.run(simulate, args.seed, db, repo)
    summary = anyio.run(check, db, live)
    if not args.json:
        print("\n== dirk roadmap")
        printed(sys.executable, "-m", "kernel", "roadmap", "--db", str(db))
        print("\n== git log")
        printed("git", "log", "--format=%h %s", cwd=repo)
        print()
    show(f"coding agents, seed {args.seed}", summary, args.json)
    return 0 if summary["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
