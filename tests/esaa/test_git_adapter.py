"""The git adapter on real repositories: the adapter contract, one commit per key, check runs.

It is run without a kernel here, as the execution engine calls it: the shipped
:class:`~kernel.testing.AdapterContract`, then what only a working tree shows (a
diff that touches another path, a commit found after a crash, the time limit and
the environment of a check).
"""

from __future__ import annotations

import os
import random
import select
import sys
from pathlib import Path
from typing import Any

import pytest

from kernel.adapters import Adapter, AdapterError, ExecutionIntent, Receipt
from kernel.testing import AdapterContract
from policies.esaa import GitWorkTree, blob_id, file_diff, init_repository
from tests.esaa.kit import commits_with, git

PY = sys.executable


def patch(key: str, patches: dict[str, str], task: str = "T-1") -> ExecutionIntent:
    params = {"task": task, "patches": patches, "message": f"patch {key}"}
    return ExecutionIntent(key=key, kind="esaa.file_patch", adapter="git", params=params)


def check(key: str, argv: list[str], timeout_s: int = 60) -> ExecutionIntent:
    params = {"task": "T-1", "check": "c", "argv": argv, "timeout_s": timeout_s}
    return ExecutionIntent(key=key, kind="esaa.run_check", adapter="git", params=params)


def new_file(key: str) -> ExecutionIntent:
    """A patch creating ``files/<key>.txt``."""
    path = f"files/{key}.txt"
    return patch(key, {path: file_diff(path, None, f"{key}\n")})


def fresh_repo(path: Path) -> Path:
    repo = path / "repo"
    init_repository(repo, {"README.md": "hello\n"})
    return repo


class Flaky(GitWorkTree):
    """Fails some calls, from a seed: before the branch moves (nothing happened), or after
    (the commit is there; the answer is lost)."""

    def __init__(self, path: Path, seed: int) -> None:
        super().__init__(path)
        self.rng = random.Random(seed)

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        if self.rng.random() < 0.3:
            raise AdapterError("git is busy", transient=True, outcome_unknown=False)
        return await super().execute(intent)

    def after_effect(self, intent: ExecutionIntent, external_id: str) -> None:
        if self.rng.random() < 0.4:
            raise AdapterError("the answer was lost", transient=True)


class TestGitWorkTreeKeepsTheAdapterContract(AdapterContract):
    def make_adapter(self, path: Path) -> Adapter:
        return GitWorkTree(fresh_repo(path))

    def intent(self, key: str) -> ExecutionIntent:
        return new_file(key)

    def effects_of(self, adapter: Adapter, key: str) -> int | None:
        assert isinstance(adapter, GitWorkTree)
        return len(commits_with(adapter.path, key))

    def make_refusing_adapter(self, path: Path) -> Adapter | None:
        # The file the intent would create is there already: the patch does not apply.
        repo = path / "repo"
        init_repository(repo, {"files/contract-key-refused.txt": "taken\n"})
        return GitWorkTree(repo)

    def make_flaky_adapter(self, path: Path) -> Adapter | None:
        return Flaky(fresh_repo(path), seed=7)


async def test_a_patch_is_one_commit_whose_id_is_the_receipt(tmp_path: Path) -> None:
    repo = fresh_repo(tmp_path)
    adapter = GitWorkTree(repo, now_ns=lambda: 1_700_000_000 * 10**9)
    intent = patch("k1", {"README.md": file_diff("README.md", "hello\n", "hello, world\n")})
    receipt = await adapter.execute(intent)
    head = git(repo, "rev-parse", "HEAD").strip()
    assert receipt.external_id == head == receipt.detail["commit"]
    assert receipt.detail["files"] == {"README.md": blob_id("hello, world\n")}
    assert (repo / "README.md").read_text() == "hello, world\n"
    message = git(repo, "log", "-1", "--format=%B")
    assert "Dirk-Key: k1" in message and "Dirk-Task: T-1" in message
    assert git(repo, "log", "-1", "--format=%ad", "--date=unix").strip() == "1700000000"
    # The same key again: the same commit, no other.
    assert (await adapter.execute(intent)).external_id == head
    assert commits_with(repo, "k1") == [head]
    assert await adapter.lookup("k1") == receipt
    assert await adapter.lookup("k2") is None


async def test_a_diff_filed_under_another_path_is_refused_by_git_too(tmp_path: Path) -> None:
    repo = fresh_repo(tmp_path)
    adapter = GitWorkTree(repo)
    other = file_diff("README.md", "hello\n", "bye\n")
    for patches in ({"docs/x.md": other}, {"README.md": other + file_diff("b", None, "b\n")}):
        with pytest.raises(AdapterError, match="exactly that one") as refused:
            await adapter.execute(patch("k", patches))
        assert not refused.value.transient and not refused.value.outcome_unknown
    # Made against a version the head does not hold: refused, even if its hunks would fit.
    stale = file_diff("README.md", "hello\n", "bye\n").replace(blob_id("hello\n")[:40], "1" * 40)
    with pytest.raises(AdapterError, match="made against blob"):
        await adapter.execute(patch("k", {"README.md": stale}))
    assert git(repo, "rev-list", "--count", "HEAD").strip() == "1"


class CrashesAfterTheCommit(GitWorkTree):
    """Stops as a crash would: the branch moved, the answer never leaves."""

    def after_effect(self, intent: ExecutionIntent, external_id: str) -> None:
        raise SystemExit("killed")


async def test_a_commit_made_before_a_crash_is_found_and_never_made_twice(tmp_path: Path) -> None:
    repo = fresh_repo(tmp_path)
    intent = new_file("k7")
    with pytest.raises(SystemExit):
        await CrashesAfterTheCommit(repo).execute(intent)
    [made] = commits_with(repo, "k7")
    # The restarted kernel's adapter: lookup finds it; a repeated call answers it.
    again = GitWorkTree(repo)
    found = await again.lookup("k7")
    assert found is not None and found.external_id == made
    assert (await again.execute(intent)).external_id == made
    assert commits_with(repo, "k7") == [made]
    assert git(repo, "status", "--porcelain") == ""


async def test_an_agent_written_key_trailer_answers_no_other_flows_patch(tmp_path: Path) -> None:
    repo = fresh_repo(tmp_path)
    adapter = GitWorkTree(repo)
    victim = new_file("victim")
    # The attacker's patch names the victim flow's key in its message, or in its task id.
    for params in (
        {"message": "tidy\n\nDirk-Key: victim"},
        {"message": "tidy\n  dirk-key : victim"},
        {"message": "tidy\nDirk-Task: T-9"},
        {"task": "T-1\nDirk-Key: victim"},
    ):
        forged = new_file("attacker")
        forged = ExecutionIntent(
            key=forged.key, kind=forged.kind, adapter="git", params={**forged.params, **params}
        )
        with pytest.raises(AdapterError, match=r"only the adapter|one line") as refused:
            await adapter.execute(forged)
        assert not refused.value.transient
    assert git(repo, "rev-list", "--count", "HEAD").strip() == "1"
    # A commit already on the branch whose message names the key before its last line (made
    # by hand, or by an adapter before the refusal): it answers for no key but its own.
    (repo / "notes.txt").write_text("n\n")
    git(repo, "add", "notes.txt")
    git(repo, "commit", "-q", "-m", "notes\n\nDirk-Key: victim\n\nDirk-Task: T-2\nDirk-Key: notes")
    planted = git(repo, "rev-parse", "HEAD").strip()
    assert await adapter.lookup("victim") is None
    found = await adapter.lookup("notes")
    assert found is not None and found.external_id == planted
    # A key that merely starts with another's names nothing of it either.
    assert await adapter.lookup("note") is None and await adapter.lookup("victi") is None
    receipt = await adapter.execute(victim)
    assert receipt.external_id != planted
    assert (repo / "files" / "victim.txt").read_text() == "victim\n"
    assert git(repo, "log", "-1", "--format=%B").rstrip().endswith("Dirk-Key: victim")


async def test_a_check_that_outlives_its_time_is_stopped_with_what_it_started(
    tmp_path: Path,
) -> None:
    repo = fresh_repo(tmp_path)
    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time, pathlib;"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
        f"pathlib.Path({str(pid_file)!r}).write_text(str(child.pid));"
        "print('started', flush=True); time.sleep(600)"
    )
    receipt = await GitWorkTree(repo).execute(check("slow", [PY, "-c", script], timeout_s=1))
    detail = receipt.detail
    assert (detail["passed"], detail["timed_out"], detail["exit_code"]) == (False, True, None)
    assert "started" in detail["output"]
    assert _ended(int(pid_file.read_text()))


def _ended(pid: int) -> bool:
    """Whether process ``pid`` ends: waited for on a pidfd, which turns readable when it does
    (a 30 s guard for a hung test, not a timing assertion)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], 30)
        return bool(readable)
    finally:
        os.close(fd)


async def test_a_check_runs_in_the_tree_with_none_of_the_kernels_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DIRK_SECRET", "s3cret")
    repo = fresh_repo(tmp_path)
    script = (
        "import os, sys; print(sorted(os.environ)); sys.exit(3 * ('DIRK_SECRET' in os.environ))"
    )
    adapter = GitWorkTree(repo)
    receipt = await adapter.execute(check("env", [PY, "-c", script]))
    assert receipt.detail["passed"] is True, receipt.detail
    assert "s3cret" not in receipt.detail["output"]
    failing = await adapter.execute(check("fails", [PY, "-c", "import sys; sys.exit(4)"]))
    assert (failing.detail["passed"], failing.detail["exit_code"]) == (False, 4)
    head = git(repo, "rev-parse", "HEAD").strip()
    assert failing.detail["commit"] == head
    # Answered again from its record, whatever the command would say now.
    again = await adapter.execute(check("fails", [PY, "-c", "pass"]))
    assert again == failing
    assert await adapter.lookup("fails") == failing
    with pytest.raises(AdapterError, match="cannot start"):
        await adapter.execute(check("missing", [str(tmp_path / "no-such-program")]))
    with pytest.raises(AdapterError, match="no command"):
        await adapter.execute(check("bare", []))


async def test_the_roadmap_opens_only_on_the_repositorys_own_text(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    head = init_repository(repo, {".roadmap/contract.toml": "c\n", ".roadmap/tasks.toml": "t\n"})
    adapter = GitWorkTree(repo)

    def opening(**given: Any) -> ExecutionIntent:
        params = {"commit": head, "contract": "c\n", "tasks": "t\n", **given}
        return ExecutionIntent(key="open", kind="esaa.open", adapter="git", params=params)

    receipt = await adapter.execute(opening())
    assert receipt.detail == {"commit": head}
    for wrong in ({"tasks": "t"}, {"contract": "c\r\n"}, {"commit": "1" * 40}):
        with pytest.raises(AdapterError):
            await adapter.execute(opening(**wrong))
    with pytest.raises(AdapterError, match="does not carry out"):
        await adapter.execute(ExecutionIntent(key="x", kind="esaa.claim", adapter="git"))
