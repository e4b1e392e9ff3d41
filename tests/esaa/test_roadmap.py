"""The roadmap end to end: a real kernel, the esaa pack, the git adapter on a real repository.

Each test is a story of agents proposing, asserted from what the journal recorded
and what git holds: claims and dependencies, contract boundaries, conflicts and
stale patches, acceptance before completion, immutability of done tasks and their
hotfixes, and a replay that rebuilds the roadmap the kernel held.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec

from kernel import ReasonCode
from kernel.audit import fold, open_journal, rejudge, verify_journal
from kernel.core import events as ev
from kernel.state.roadmap.domain import Roadmap
from kernel.state.roadmap.model import DONE, HOTFIX, IN_PROGRESS, TODO, RoadmapState
from policies.esaa import ESAA, blob_id, file_diff
from tests.esaa.kit import (
    CONTRACT,
    TASKS,
    Desk,
    Outcome,
    claim,
    commits_with,
    complete,
    desk,
    git,
    run,
)

ONE = "def one() -> int:\n    return 1\n"
INIT_ONE = '"""pkg."""\n\nfrom pkg.one import one\n'
INIT_THREE = '"""pkg."""\n\nfrom pkg.three import three\n'
INIT_BOTH = '"""pkg."""\n\nfrom pkg.one import one\nfrom pkg.three import three\n'
THREE = "def three() -> int:\n    return 3\n"
PASSING = "import unittest\n\nfrom pkg import one\n\n\nclass T(unittest.TestCase):\n"
PASSING += "    def test_one(self) -> None:\n        self.assertEqual(one(), 1)\n"
FAILING = PASSING.replace("(one(), 1)", "(one(), 2)")
ZERO_FILE = blob_id("")


def roadmap(desk_: Desk) -> RoadmapState:
    return desk_.kernel.projections.domain(Roadmap).state


def refused(outcome: Outcome, code: ReasonCode, *words: str) -> None:
    assert not outcome.done, outcome
    assert outcome.code == code, outcome
    for word in words:
        assert word in outcome.detail, outcome


async def finish_t1(d: Desk) -> None:
    """Ada claims T-1, writes pkg/one.py and its export, passes its check, completes it."""
    assert (await d.act("ada", claim("T-1"))).done
    assert (await d.patch("ada", "T-1", {"pkg/one.py": ONE, "pkg/__init__.py": INIT_ONE})).done
    assert (await d.act("ada", run("T-1", "ok"))).done
    assert (await d.act("ada", complete("T-1"))).done


# --- opening: the repository's own contract and task list, once ---------------------------


async def test_nothing_is_granted_before_a_roadmap_is_open(tmp_path: Path) -> None:
    async with desk(tmp_path) as d:
        refused(await d.act("ada", claim("T-1")), ReasonCode.UNAUTHORIZED, "no roadmap")
        refused(
            await d.patch("ada", "T-1", {"pkg/one.py": ONE}), ReasonCode.UNAUTHORIZED, "no roadmap"
        )
        assert git(d.repo, "rev-list", "--count", "HEAD").strip() == "1"


async def test_the_roadmap_opens_with_exactly_what_the_repository_holds(tmp_path: Path) -> None:
    async with desk(tmp_path) as d:
        opening = {"kind": "esaa.open", "commit": d.head, "contract": CONTRACT, "tasks": TASKS}
        # Valid text, but not the repository's: the adapter refuses it before anything.
        other = TASKS.replace("the first function", "something else")
        lied = await d.act("lead", {**opening, "tasks": other})
        refused(lied, ReasonCode.EXECUTION_FAILED, ".roadmap/tasks.toml", "not the text proposed")
        # Not the head: the roadmap starts where the branch is.
        old = await d.act("lead", {**opening, "commit": "0" * 40})
        refused(old, ReasonCode.EXECUTION_FAILED, "head")
        # Invalid: the DIM names the file and the field.
        broken = CONTRACT.replace('paths = ["pkg/**"]', 'paths = ["../**"]')
        bad = await d.act("lead", {**opening, "contract": broken})
        refused(bad, ReasonCode.SCHEMA_INVALID, "contract.toml", "$.agents.ada.paths[0]")
        # Files named with versions the commit does not hold: refused, nothing opens.
        named = {**opening, "files": {"pkg/__init__.py": "1" * 40}}
        refused(await d.act("lead", named), ReasonCode.EXECUTION_FAILED, "pkg/__init__.py")
        named = {**opening, "files": {".git/config": "1" * 40}}
        refused(await d.act("lead", named), ReasonCode.SCHEMA_INVALID, "files")
        assert not roadmap(d).open
        assert (await d.open()).done
        state = roadmap(d)
        assert state.base == state.head == d.head
        assert state.blobs == {
            "pkg/__init__.py": blob_id('"""pkg."""\n'),
            "tests/__init__.py": ZERO_FILE,
        }
        assert list(state.tasks) == ["T-1", "T-2", "T-3", "T-4"]
        assert sorted(state.contract.agents) == ["ada", "bo", "eve", "quinn"]
        assert state.phases == {"PH-1": 0, "PH-2": 0}
        refused(await d.open(), ReasonCode.CONSTRAINT_VIOLATION, "stays in force")


# --- claims and dependencies ---------------------------------------------------------------


async def test_a_task_is_claimed_after_its_dependencies_and_by_one_agent(tmp_path: Path) -> None:
    async with desk(tmp_path) as d:
        await d.open()
        refused(await d.act("bo", claim("T-2")), ReasonCode.CONSTRAINT_VIOLATION, "depends on T-1")
        refused(await d.act("bo", claim("T-19")), ReasonCode.CONSTRAINT_VIOLATION, "no task")
        assert (await d.act("ada", claim("T-1"))).done
        refused(await d.act("bo", claim("T-1")), ReasonCode.RESOURCE_CONTENTION, "claimed by ada")
        refused(await d.act("ada", claim("T-1")), ReasonCode.RESOURCE_CONTENTION, "claimed by you")
        task = roadmap(d).tasks["T-1"]
        assert (task.state, task.claimed_by) == (IN_PROGRESS, "ada")
        # Work on a task is its claimant's alone.
        refused(
            await d.patch("bo", "T-1", {"pkg/one.py": ONE}),
            ReasonCode.CONSTRAINT_VIOLATION,
            "claimed by ada",
        )
        await d.patch("ada", "T-1", {"pkg/one.py": ONE, "pkg/__init__.py": INIT_ONE})
        await d.act("ada", run("T-1", "ok"))
        await d.act("ada", complete("T-1"))
        assert (await d.act("bo", claim("T-2"))).done


async def test_agents_racing_for_one_task_never_both_win(tmp_path: Path) -> None:
    async with desk(tmp_path) as d:
        await d.open()
        for task in ("T-1", "T-3"):
            outcomes: list[Outcome] = []

            async def take(agent: str, task: str = task, seen: list[Outcome] = outcomes) -> None:
                seen.append(await d.act(agent, claim(task)))

            async with anyio.create_task_group() as tg:
                tg.start_soon(take, "ada")
                tg.start_soon(take, "bo")
            winners = [o for o in outcomes if o.done]
            assert len(winners) == 1, outcomes
            [loser] = [o for o in outcomes if not o.done]
            assert loser.code == ReasonCode.RESOURCE_CONTENTION, loser


# --- the contract's boundaries ---------------------------------------------------------------


async def test_a_contract_bounds_each_agents_kinds_tasks_and_paths(tmp_path: Path) -> None:
    async with desk(tmp_path) as d:
        await d.open()
        await d.act("ada", claim("T-1"))
        refused(await d.act("eve", claim("T-1")), ReasonCode.UNAUTHORIZED, "outside eve's tasks")
        refused(
            await d.act("eve", run("T-4", "ok")),
            ReasonCode.UNAUTHORIZED,
            "eve's contract does not grant esaa.run_check",
        )
        refused(await d.act("mallory", claim("T-3")), ReasonCode.UNAUTHORIZED, "no agent 'mallory'")
        outside = await d.patch("eve", "T-4", {"pkg/one.py": ONE})
        refused(outside, ReasonCode.UNAUTHORIZED, "pkg/one.py is outside eve's paths (docs/**)")
        tests = await d.patch("ada", "T-1", {"tests/test_one.py": PASSING})
        refused(tests, ReasonCode.UNAUTHORIZED, "outside ada's paths")
        other = await d.patch("ada", "T-1", {"pkg/two.py": ONE})
        refused(other, ReasonCode.UNAUTHORIZED, "outside task T-1's files")
        for path in (".roadmap/contract.toml", ".git/config", "pkg/../x.py", "/etc/passwd"):
            bad = await d.act(
                "ada",
                {
                    "kind": "esaa.file_patch",
                    "task": "T-1",
                    "patches": {path: file_diff("x", None, "x\n")},
                },
            )
            refused(bad, ReasonCode.UNAUTHORIZED)
        # None of it reached the repository.
        assert git(d.repo, "rev-list", "--count", "HEAD").strip() == "1"
        assert git(d.repo, "status", "--porcelain") == ""


# --- conflicts and patches that do not apply -------------------------------------------------


async def test_a_file_another_open_task_changed_conflicts_until_that_task_is_done(
    tmp_path: Path,
) -> None:
    async with desk(tmp_path) as d:
        await d.open()
        await d.act("ada", claim("T-1"))
        await d.act("bo", claim("T-3"))
        early = {
            "pkg/three.py": d.diff("pkg/three.py", THREE),
            "pkg/__init__.py": d.diff("pkg/__init__.py", INIT_THREE),
        }
        await d.patch("ada", "T-1", {"pkg/one.py": ONE, "pkg/__init__.py": INIT_ONE})
        proposal = {"kind": "esaa.file_patch", "task": "T-3", "patches": early}
        conflict = await d.act("bo", proposal)
        refused(conflict, ReasonCode.RESOURCE_CONTENTION, "pkg/__init__.py", "open task T-1 (ada)")
        await d.act("ada", run("T-1", "ok"))
        await d.act("ada", complete("T-1"))
        # No conflict now, but bo's diff was made against the file before ada's patch.
        stale = await d.act("bo", proposal)
        refused(stale, ReasonCode.STALE_CONTEXT, "pkg/__init__.py", "made against blob")
        fresh = await d.patch("bo", "T-3", {"pkg/three.py": THREE, "pkg/__init__.py": INIT_BOTH})
        assert fresh.done, fresh
        assert (d.repo / "pkg/__init__.py").read_text() == INIT_BOTH
        assert roadmap(d).tasks["T-3"].touched == ["pkg/__init__.py", "pkg/three.py"]


async def test_a_patch_that_does_not_apply_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    async with desk(tmp_path) as d:
        await d.open()
        await d.act("ada", claim("T-1"))
        created = file_diff("pkg/one.py", None, ONE)
        assert (await d.act("ada", patch_of("T-1", {"pkg/one.py": created}))).done
        head = git(d.repo, "rev-parse", "HEAD")
        # Creating it again: the roadmap knows it exists.
        again = await d.act("ada", patch_of("T-1", {"pkg/one.py": created}))
        refused(again, ReasonCode.STALE_CONTEXT, "exists")
        # The right version, but hunks that are not in the file: git says no, nothing changes.
        wrong = file_diff("pkg/one.py", ONE, ONE + "x = 1\n").replace(
            " def one() -> int:", " def uno() -> int:"
        )
        failed = await d.act("ada", patch_of("T-1", {"pkg/one.py": wrong}))
        refused(failed, ReasonCode.EXECUTION_FAILED, "does not apply")
        # A file no patch changed yet, but the opening named its version: the DIM knows it.
        elsewhere = file_diff("pkg/__init__.py", '"""another pkg."""\n', INIT_ONE)
        older = await d.act("ada", patch_of("T-1", {"pkg/__init__.py": elsewhere}))
        refused(older, ReasonCode.STALE_CONTEXT, "pkg/__init__.py", "made against blob")
        # Not a plain git diff of its path.
        mislabelled = file_diff("pkg/__init__.py", '"""pkg."""\n', INIT_ONE)
        odd = await d.act("ada", patch_of("T-1", {"pkg/one.py": mislabelled}))
        refused(odd, ReasonCode.SCHEMA_INVALID, "diff --git a/pkg/one.py")
        assert git(d.repo, "rev-parse", "HEAD") == head
        assert git(d.repo, "status", "--porcelain") == ""


def patch_of(task: str, patches: dict[str, str]) -> dict[str, object]:
    return {"kind": "esaa.file_patch", "task": task, "patches": patches}


# --- verification, completion and immutability ----------------------------------------------


async def test_nothing_is_done_before_its_acceptance_run_passed(tmp_path: Path) -> None:
    async with desk(tmp_path) as d:
        await d.open()
        await finish_t1(d)
        await d.act("bo", claim("T-2"))
        await d.patch("bo", "T-2", {"tests/test_one.py": FAILING})
        refused(await d.act("bo", complete("T-2")), ReasonCode.VERIFICATION_REQUIRED, "not run")
        failed = await d.act("bo", run("T-2", "tests"))
        assert failed.done and failed.receipt["passed"] is False, failed
        assert "AssertionError" in failed.receipt["output"]
        refused(await d.act("bo", complete("T-2")), ReasonCode.VERIFICATION_REQUIRED, "failed")
        await d.patch("bo", "T-2", {"tests/test_one.py": PASSING})
        # The failed run was before this patch: the check must run again.
        refused(
            await d.act("bo", complete("T-2")),
            ReasonCode.VERIFICATION_REQUIRED,
            "since its last patch",
        )
        passed = await d.act("bo", run("T-2", "tests"))
        assert passed.receipt["passed"] is True, passed
        assert (await d.act("bo", complete("T-2"))).done
        task = roadmap(d).tasks["T-2"]
        assert task.state == DONE and task.acceptance_results == {"tests": True}
        assert task.runs["tests"].commit == git(d.repo, "rev-parse", "HEAD").strip()


async def test_a_check_runs_the_contracts_command_never_the_agents(tmp_path: Path) -> None:
    async with desk(tmp_path) as d:
        await d.open()
        await d.act("ada", claim("T-1"))
        sneaky = {**run("T-1", "ok"), "argv": ["sh", "-c", "rm -rf ~"]}
        refused(await d.act("ada", sneaky), ReasonCode.SCHEMA_INVALID)
        refused(
            await d.act("ada", run("T-1", "deploy")), ReasonCode.CONSTRAINT_VIOLATION, "no check"
        )
        done = await d.act("ada", run("T-1", "ok"))
        [accepted] = await d.kernel.journal.read(dfid=done.dfid, types=["ProposalAccepted"])
        [started] = await d.kernel.journal.read(dfid=done.dfid, types=["ExecutionStarted"])
        assert isinstance(accepted.payload, ev.ProposalAccepted)
        assert isinstance(started.payload, ev.ExecutionStarted)
        ok = roadmap(d).contract.checks["ok"]
        assert accepted.payload.applied is not None
        assert accepted.payload.applied.params["argv"] == ok.argv
        assert started.payload.intent.params["argv"] == ok.argv
        assert started.payload.intent.params["timeout_s"] == ok.timeout_s


async def test_a_done_task_is_immutable_and_an_issue_on_it_opens_a_hotfix(tmp_path: Path) -> None:
    async with desk(tmp_path) as d:
        await d.open()
        await finish_t1(d)
        before = roadmap(d).tasks["T-1"]
        for step in (
            claim("T-1"),
            run("T-1", "ok"),
            complete("T-1"),
            patch_of("T-1", {"pkg/one.py": d.diff("pkg/one.py", ONE + "# more\n")}),
        ):
            refused(await d.act("ada", step), ReasonCode.CONSTRAINT_VIOLATION, "immutable")
        report = {
            "kind": "esaa.report",
            "task": "T-1",
            "title": "one() should be two",
            "severity": "high",
        }
        assert (await d.act("quinn", report)).done
        state = roadmap(d)
        after = state.tasks["T-1"]
        assert msgspec.structs.replace(after, issues=[]) == before  # nothing else changed
        [issue] = after.issues
        assert (issue.agent, issue.severity, issue.hotfix) == ("quinn", "high", "T-1.fix1")
        hotfix = state.tasks["T-1.fix1"]
        assert (hotfix.spec.kind, hotfix.state, hotfix.hotfix_of) == (HOTFIX, TODO, "T-1")
        assert hotfix.spec.files == before.spec.files
        assert hotfix.spec.acceptance == before.spec.acceptance
        # The hotfix is a task like any other: claimed, patched, checked, completed.
        assert (await d.act("ada", claim("T-1.fix1"))).done
        fixed = await d.patch("ada", "T-1.fix1", {"pkg/one.py": ONE.replace("1", "2")})
        assert fixed.done, fixed
        await d.act("ada", run("T-1.fix1", "ok"))
        assert (await d.act("ada", complete("T-1.fix1"))).done
        # An issue on an open task is recorded on it, and opens nothing.
        await d.act("bo", claim("T-3"))
        assert (await d.act("quinn", {**report, "task": "T-3"})).done
        assert roadmap(d).tasks["T-3"].issues[0].hotfix == ""
        assert "T-3.fix1" not in roadmap(d).tasks


# --- replay ----------------------------------------------------------------------------------


async def test_a_replay_rebuilds_the_roadmap_and_rejudges_every_verdict(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with desk(tmp_path) as d:
        await d.open()
        await finish_t1(d)
        await d.act("bo", claim("T-2"))
        await d.patch("bo", "T-2", {"tests/test_one.py": FAILING})
        await d.act("bo", run("T-2", "tests"))
        await d.act("quinn", {"kind": "esaa.report", "task": "T-1", "title": "wrong"})
        await d.act("eve", claim("T-4"))
        live = msgspec.to_builtins(roadmap(d))
        patches = [
            e.payload.key
            for e in await d.kernel.journal.read(types=["ExecutionSucceeded"])
            if isinstance(e.payload, ev.ExecutionSucceeded) and "files" in e.payload.detail
        ]
    async with open_journal(db, readonly=True) as journal:
        events = await journal.read()
        verdicts = await rejudge(journal, [ESAA])
    replayed = fold(events).domain(Roadmap).state
    assert msgspec.to_builtins(replayed) == live
    assert verdicts.judged >= 10 and verdicts.changes == [], verdicts.changes
    assert (await verify_journal(db)).ok
    # Exactly one commit per recorded patch, and each names its key.
    assert len(patches) == 2
    for key in patches:
        assert len(commits_with(d.repo, key)) == 1
    # A kernel opened again on the journal holds the same roadmap (restored, then folded).
    async with desk(tmp_path) as again:
        assert msgspec.to_builtins(roadmap(again)) == live
