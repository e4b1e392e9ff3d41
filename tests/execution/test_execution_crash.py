"""The kill test: SIGKILL a kernel mid-execution at seeded points, restart, check invariants.

Each seed runs a stream of flows (single intents, sagas, failing sagas that
are compensated) in a subprocess that kills itself with SIGKILL at a point
drawn from the seed: after the Nth journal commit, before the Nth adapter
call, or after the Nth effect is durable but before the kernel hears of it.
Then the kernel is restarted on the same journal (and may be killed again),
and finally runs to the end. Rerun with more seeds: ``DIRK_KILL_SEEDS=200``.

The clerk either reasons in its crew (after its context committed) or decides
synchronously: then its flow commits twice (issue 35, lever 4), its context reaching
it before it is durable, and a kill point in its ``decide`` (before the append that
records context, proposal, verdict and intent) must leave nothing recorded and
nothing executed.
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

from kernel import FlowStatus, ReasonCode
from kernel.adapters import ExecutionIntent
from kernel.audit import Event, fold, open_journal, payloads, verify_journal
from kernel.core.events import (
    CompensationFailed,
    CompensationStarted,
    CompensationSucceeded,
    ExecutionSucceeded,
)
from tests.support import ROOT, SUPPORT

WORKER = SUPPORT / "execution_worker.py"
SEEDS = range(int(os.environ.get("DIRK_KILL_SEEDS", "6")))


def kill_point(rng: random.Random, *, decide: bool = False) -> str:
    what = rng.choice(["commit", "commit", "call", "effect", *(["decide"] if decide else [])])
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
async def test_a_killed_kernel_resumes_every_intent_with_exactly_one_effect(
    tmp_path: Path, seed: int, lookup: str
) -> None:
    await kill_run(tmp_path, seed, lookup)


@pytest.mark.parametrize("seed", SEEDS)
async def test_a_killed_kernel_whose_clerk_decides_before_its_context_is_durable_loses_nothing(
    tmp_path: Path, seed: int
) -> None:
    await kill_run(tmp_path, seed, "0", agent="sync")


@pytest.mark.parametrize("seed", SEEDS)
async def test_a_killed_kernel_whose_calls_came_through_propose_executes_each_once(
    tmp_path: Path, seed: int
) -> None:
    # Each call's opening, verdict and intent are one append (issue 45); every run
    # proposes the same keyed calls again, as a framework resuming its run would.
    await kill_run(tmp_path, seed, "0", agent="propose")


async def test_a_kill_between_a_context_reaching_its_agent_and_its_append_records_nothing(
    tmp_path: Path,
) -> None:
    journal, ledger = str(tmp_path / "j.db"), str(tmp_path / "ledger.db")
    with anyio.fail_after(300):  # a guard against a hung child, not a timing assertion
        killed = await run_worker(journal, ledger, "run", "decide:1", "0", "sync")
        assert killed == -signal.SIGKILL
        async with open_journal(journal) as j:
            events = await j.read()
        # The trigger, the flow, its context: none of it was recorded, nothing ran.
        assert not [e.type for e in events if e.dfid is not None or e.type == "TriggerFired"]
        assert not _effects(ledger)
        # Restarted, the kernel finds no flow to recover: the flow never started.
        assert await run_worker(journal, ledger, "recover", "none", "0", "sync") == 0
        async with open_journal(journal) as j:
            assert not fold(await j.read()).flows
        # Triggered again, every flow runs to its end, each effect once.
        assert await run_worker(journal, ledger, "run", "none", "0", "sync") == 0
    await check(journal, ledger, decided=False)
    async with open_journal(journal) as j:
        state = fold(await j.read())
    assert len(state.flows) == 9
    assert all(flow.terminal for flow in state.flows.values())
    assert sum(_effects(ledger).values()) >= 9


def _effects(ledger: str) -> Counter[str]:
    with sqlite3.connect(ledger) as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
        if "effects" not in tables:
            return Counter()
        return Counter(key for (key,) in db.execute("SELECT key FROM effects"))


async def kill_run(tmp_path: Path, seed: int, lookup: str, *, agent: str = "crew") -> None:
    """Run one seed of the kill test and check its invariants (tests.support.kill_loop runs it too).

    The invariant: every effect in the ledger is recorded exactly once, or its
    flow waits for a human with OUTCOME_UNKNOWN; once an operator has decided
    those (retry, or reconcile with what the ledger shows), every effect is
    recorded exactly once and nothing is recorded that did not happen.
    """
    rng = random.Random(f"{seed}/{lookup}")
    journal, ledger = str(tmp_path / "j.db"), str(tmp_path / "ledger.db")
    # A guard against a hung child, not a timing assertion.
    with anyio.fail_after(300):
        mode = "run"
        for _ in range(rng.randint(1, 3)):
            kill = kill_point(rng, decide=agent == "sync")
            await run_worker(journal, ledger, mode, kill, lookup, agent)
            mode = "run" if agent == "propose" else "recover"
        assert await run_worker(journal, ledger, "recover", "none", lookup, agent) == 0
        await check(journal, ledger, decided=False)
        # The operator decides what waits: retry first (by the seed), reconcile after.
        first = rng.choice(["retry", "reconcile"])
        for round_ in range(3):
            if not await waiting_unknown(journal):
                break
            decision = first if round_ == 0 else "reconcile"
            assert await run_worker(journal, ledger, decision, "none", lookup) == 0
        await check(journal, ledger, decided=True)


async def waiting_unknown(journal: str) -> list[str]:
    async with open_journal(journal) as j:
        state = fold(await j.read())
    return [
        dfid
        for dfid, flow in state.flows.items()
        if flow.status is FlowStatus.ESCALATED and flow.reason_code is ReasonCode.OUTCOME_UNKNOWN
    ]


async def check(journal: str, ledger: str, *, decided: bool) -> None:
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
        if isinstance(e.payload, ExecutionSucceeded | CompensationSucceeded)
        and e.payload.external_id
    }
    started = [p.intent.key for p in payloads(events, CompensationStarted)]
    accepted = {e.dfid for e in events if e.type == "ProposalAccepted"}
    reconciled = {e.dfid for e in events if e.type == "HumanDecided"}
    # Flows that wait for a human because an effect may exist that no answer showed.
    in_doubt = {
        flow.pending.key: dfid
        for dfid, flow in state.flows.items()
        if flow.status is FlowStatus.ESCALATED
        and flow.reason_code is ReasonCode.OUTCOME_UNKNOWN
        and flow.pending is not None
    }
    assert not (decided and in_doubt), in_doubt
    # Every effect is recorded, or its flow waits for a human with outcome unknown.
    unrecorded = set(effects) - succeeded - set(in_doubt)
    flows_of = {e.dfid for e in events if unrecorded & {_key_of(e)}}
    story = [f"{e.seq} {e.type} {msgspec.json.encode(e.payload).decode()[:160]}" for e in events]
    assert not unrecorded, "\n".join(
        line for line, e in zip(story, events, strict=True) if e.dfid in flows_of or not e.dfid
    )
    # Nothing is recorded that did not happen, and nothing happened twice.
    assert succeeded <= set(effects)
    assert all(count == 1 for count in effects.values()), effects
    # Every accepted intent ran to its end, or waits for a human on an unknown outcome;
    # after a reconcile as not done it failed (and was compensated) as any failure does.
    for dfid in accepted:
        assert dfid is not None, "an acceptance outside a flow"
        flow = state.flows[dfid]
        if flow.status in (FlowStatus.CLOSED, FlowStatus.COMPENSATED):
            continue
        if dfid in in_doubt.values():
            continue
        assert dfid in reconciled, (dfid, flow.status, flow.reason_code, flow.detail)
        assert flow.reason_code is ReasonCode.EXECUTION_FAILED
        assert flow.status in (FlowStatus.ABORTED, FlowStatus.ESCALATED)
    # Every compensation that started finished, waits on its unknown outcome, or was
    # found not done by the operator (a known failure, escalated with the partial state).
    assert set(started) <= succeeded | set(in_doubt) | _known_failed_compensations(events)


def _known_failed_compensations(events: list[Event]) -> set[str]:
    return {p.key for p in payloads(events, CompensationFailed) if not p.unknown}


def _key_of(event: Event) -> str | None:
    """The idempotency key an event is about: its intent's, or its own (None: neither)."""
    intent: ExecutionIntent | None = getattr(event.payload, "intent", None)
    key: str | None = intent.key if intent is not None else getattr(event.payload, "key", None)
    return key
