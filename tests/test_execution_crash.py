"""The kill test: SIGKILL a kernel mid-execution at seeded points, restart, check invariants.

Each seed runs a stream of flows (single intents, sagas, failing sagas that
are compensated) in a subprocess that kills itself with SIGKILL at a point
drawn from the seed: after the Nth journal commit, before the Nth adapter
call, or after the Nth effect is durable but before the kernel hears of it.
Then the kernel is restarted on the same journal (and may be killed again),
and finally runs to the end. Rerun with more seeds: ``DIRK_KILL_SEEDS=200``.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import sys
from collections import Counter
from pathlib import Path

import anyio
import msgspec
import pytest

from kernel import FlowStatus, fold, open_journal, verify_journal

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("execution_worker.py")
SEEDS = range(int(os.environ.get("DIRK_KILL_SEEDS", "6")))


def kill_point(rng: random.Random) -> str:
    what = rng.choice(["commit", "commit", "call", "effect"])
    return f"{what}:{rng.randint(1, 60 if what == 'commit' else 16)}"


async def run_worker(*args: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = await anyio.run_process(
        [sys.executable, str(WORKER), *args], env=env, check=False, stderr=None
    )
    assert result.returncode in (0, -signal.SIGKILL), result.stdout
    return result.returncode


@pytest.mark.parametrize("lookup", ["0", "1"], ids=["dedupe", "lookup"])
@pytest.mark.parametrize("seed", SEEDS)
async def test_a_killed_kernel_resumes_every_intent_with_exactly_one_effect(tmp_path, seed, lookup):
    rng = random.Random(f"{seed}/{lookup}")
    journal, ledger = str(tmp_path / "j.db"), str(tmp_path / "ledger.db")
    # A guard against a hung child, not a timing assertion.
    with anyio.fail_after(120):
        mode = "run"
        for _ in range(rng.randint(1, 3)):
            await run_worker(journal, ledger, mode, kill_point(rng), lookup)
            mode = "recover"
        assert await run_worker(journal, ledger, "recover", "none", lookup) == 0

    report = await verify_journal(journal)
    assert report.ok, report.problem
    async with open_journal(journal) as j:
        events = await j.read()
    state = fold(events)
    with sqlite3.connect(ledger) as db:
        effects = Counter(key for (key,) in db.execute("SELECT key FROM effects"))

    succeeded = {
        e.payload.key
        for e in events
        if e.type in ("ExecutionSucceeded", "CompensationSucceeded") and e.payload.external_id
    }
    started = [e.payload.intent.key for e in events if e.type == "CompensationStarted"]
    accepted = {e.dfid for e in events if e.type == "ProposalAccepted"}
    # Every recorded effect happened exactly once, and nothing happened unrecorded.
    unrecorded = set(effects) - succeeded
    flows_of = {e.dfid for e in events if unrecorded & {_key_of(e)}}
    story = [f"{e.seq} {e.type} {msgspec.json.encode(e.payload).decode()[:160]}" for e in events]
    assert not unrecorded, "\n".join(
        line for line, e in zip(story, events, strict=True) if e.dfid in flows_of or not e.dfid
    )
    assert set(effects) == succeeded
    assert all(count == 1 for count in effects.values()), effects
    # Every accepted intent ran to its end; every compensation that started finished.
    for dfid in accepted:
        assert state.flows[dfid].status in (FlowStatus.CLOSED, FlowStatus.COMPENSATED)
    assert set(started) <= succeeded


def _key_of(event):  # type: ignore[no-untyped-def]
    intent = getattr(event.payload, "intent", None)
    return intent.key if intent is not None else getattr(event.payload, "key", None)
