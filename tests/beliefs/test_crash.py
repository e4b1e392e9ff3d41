"""SIGKILL a kernel keeping beliefs at a seeded commit, restart it: every belief effect once.

The beliefs executor's effect is its record: the engine appends its events with the
intent's ExecutionSucceeded, so a crash leaves either both or neither, and a restart
finishes what was executing without a second copy.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from collections import Counter
from pathlib import Path

import anyio
import pytest

from kernel.audit import fold, open_journal, verify_journal
from kernel.core.events import (
    BELIEF_PAYLOADS,
    ExecutionStarted,
    ExecutionSucceeded,
    ObservationRecorded,
)
from tests.support import ROOT, SUPPORT

WORKER = SUPPORT / "belief_worker.py"
SEEDS = range(int(os.environ.get("DIRK_KILL_SEEDS", "4")))


async def run_worker(*args: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = await anyio.run_process(
        [sys.executable, str(WORKER), *args], env=env, check=False, stderr=None
    )
    assert result.returncode in (0, -signal.SIGKILL), result.stdout
    return result.returncode


@pytest.mark.parametrize("seed", SEEDS)
async def test_a_killed_kernel_records_each_belief_effect_exactly_once(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    journal = str(tmp_path / "j.db")
    with anyio.fail_after(300):  # a guard against a hung child, not a timing assertion
        killed = await run_worker(journal, "run", f"commit:{rng.randint(3, 32)}")
        assert await run_worker(journal, "recover", "none") == 0
    assert (await verify_journal(journal)).ok
    async with open_journal(journal, readonly=True) as opened:
        events = await opened.read()
    started = {
        e.payload.intent.key
        for e in events
        if isinstance(e.payload, ExecutionStarted) and e.payload.intent.adapter == "beliefs"
    }
    succeeded = Counter(e.payload.key for e in events if isinstance(e.payload, ExecutionSucceeded))
    recorded = [(e.seq, e.payload) for e in events if isinstance(e.payload, BELIEF_PAYLOADS)]
    # Every belief intent the kernel started ended once, here or after the restart...
    assert all(succeeded[key] == 1 for key in started)
    # ...its events in the append of its ExecutionSucceeded, and no event of a key twice.
    by_key = Counter((p.key, type(p).__name__, seq) for seq, p in recorded)
    assert all(n == 1 for n in by_key.values())
    observations = Counter(p.observation for _, p in recorded if isinstance(p, ObservationRecorded))
    assert all(n == 1 for n in observations.values())
    for key in {p.key for _, p in recorded}:
        assert key in started and succeeded[key] == 1
    assert fold(events).beliefs.observations.keys() == set(observations)
    if killed == 0:  # the kill point lay past the end: the whole story ran
        assert fold(events).beliefs.propositions["p"].layer == "canonical"
