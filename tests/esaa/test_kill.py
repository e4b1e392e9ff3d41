"""SIGKILL a kernel working a roadmap, restart it, and find every patch committed exactly once.

A real subprocess (tests/esaa/kill_worker.py) works T-1 and T-3 on a real git
repository and kills itself at a point: after a journal commit, after git wrote a
commit object but before the branch moved to it, or after the branch moved (or a
check's result was stored) but before the kernel heard of it. A second process opens
the same journal and repository and finishes what was left. Then:

- every commit on the branch carrying a key is recorded, once, as that key's
  ExecutionSucceeded, and every recorded patch is exactly one commit on the branch;
- no accepted intent is left unfinished (lookup finds what a crash hid);
- the roadmap folded from the journal names the branch's head and each file's blob;
- the journal verifies and the working tree is the branch's head.

More seeds: ``DIRK_KILL_SEEDS=20``.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from pathlib import Path

import anyio
import pytest

from kernel import FlowStatus
from kernel.audit import fold, open_journal, verify_journal
from kernel.core import events as ev
from kernel.state.roadmap.domain import Roadmap
from tests.esaa.kit import git, repository
from tests.support import ROOT

WORKER = Path(__file__).with_name("kill_worker.py")
SEEDS = range(int(os.environ.get("DIRK_KILL_SEEDS", "3")))
FIXED = ["made:1", "effect:1", "effect:2", "effect:3"]
"""The points every run covers: before the first branch move, right after it, after a
check's result is stored, and after the second patch moved the branch."""


def seeded(seed: int) -> str:
    """A journal commit to die after, drawn from the seed (the story makes about 40)."""
    return f"commit:{random.Random(f'esaa/{seed}').randint(1, 40)}"


async def worker(workdir: Path, mode: str, kill: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = await anyio.run_process(
        [sys.executable, str(WORKER), str(workdir), mode, kill], env=env, check=False, stderr=None
    )
    assert done.returncode in (0, -signal.SIGKILL), done.stdout
    return done.returncode


@pytest.mark.parametrize("kill", FIXED + [seeded(seed) for seed in SEEDS])
async def test_a_killed_kernel_commits_each_patch_exactly_once(tmp_path: Path, kill: str) -> None:
    repository(tmp_path / "repo")
    with anyio.fail_after(300):  # a guard against a hung child, not a timing assertion
        killed = await worker(tmp_path, "run", kill)
        if not kill.startswith("commit:"):
            assert killed == -signal.SIGKILL  # the story reaches every fixed point
        assert await worker(tmp_path, "recover", "none") == 0
    await check(tmp_path)


async def check(workdir: Path) -> None:
    db, repo = workdir / "j.db", workdir / "repo"
    assert (await verify_journal(db)).ok
    async with open_journal(db, readonly=True) as journal:
        events = await journal.read()
    state = fold(events)
    recorded: dict[str, list[str]] = {}
    for event in events:
        if isinstance(event.payload, ev.ExecutionSucceeded) and "files" in event.payload.detail:
            recorded.setdefault(event.payload.key, []).append(event.payload.external_id)
    on_branch: dict[str, list[str]] = {}
    for entry in git(
        repo, "log", "--format=%H %(trailers:key=Dirk-Key,valueonly,separator=)"
    ).split("\n"):
        commit, _, key = entry.partition(" ")
        if key.strip():
            on_branch.setdefault(key.strip(), []).append(commit)
    # One commit per key on the branch, each recorded once as its key's receipt.
    assert {k: len(v) for k, v in on_branch.items()} == dict.fromkeys(on_branch, 1)
    assert recorded == on_branch
    unfinished = [
        (f.dfid, f.status)
        for f in state.flows.values()
        if f.status in (FlowStatus.ACCEPTED, FlowStatus.EXECUTING, FlowStatus.ESCALATED)
    ]
    assert unfinished == []
    roadmap = state.domain(Roadmap).state
    head = git(repo, "rev-parse", "HEAD").strip()
    if on_branch:
        assert roadmap.head == head
    for path, blob in roadmap.blobs.items():
        assert git(repo, "rev-parse", f"HEAD:{path}").strip() == blob
    assert git(repo, "status", "--porcelain") == ""
