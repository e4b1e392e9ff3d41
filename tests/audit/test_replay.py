"""Folding the journal from scratch gives exactly the live projections."""

from __future__ import annotations

import random
from pathlib import Path
from typing import cast

import anyio
import pytest

from kernel import FlowStatus, Proposal, WorkingContext
from kernel.audit import fold
from kernel.testing import ManualClock, Step, action_of
from tests.support.helpers import ScriptedAgent, kernel_for, transfer


class RandomAgent(ScriptedAgent):
    """Picks its behaviour per flow and attempt from the seed, whatever the scheduling."""

    def __init__(self, name: str, seed: int) -> None:
        super().__init__(name, subscriptions=[f"bank.{name}", "bank.all"])
        self.seed = seed

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        rng = random.Random(f"{self.seed}/{ctx.dfid}/{ctx.attempt}")
        return random_step(rng)(ctx)


def random_step(rng: random.Random) -> Step:
    choice = rng.random()
    if choice < 0.15:
        return lambda ctx: ctx.propose(
            {"kind": "test.transfer", "account": "a", "amount_cents": "x"}
        )
    if choice < 0.3:
        return transfer(rng.randrange(1, 10_000), confidence=0.2)
    if choice < 0.35:
        return lambda ctx: None
    return transfer(rng.randrange(1, 10_000), confidence=0.9)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_fold_from_scratch_equals_the_live_projections(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    async with kernel_for(tmp_path / "j.db") as kernel:
        agents = [RandomAgent(name, seed) for name in ("clerk", "auditor", "other")]
        for agent in agents:
            await kernel.register(agent)
        for i in range(60):
            topic = rng.choice(["bank.all", "bank.clerk", "bank.other"])
            await kernel.trigger(topic, {f"bank.{topic}.n": i})
            if rng.random() < 0.1:
                cast(ManualClock, kernel.clock).advance(rng.random())
        await kernel.wait_quiet()
        for flow in kernel.flows(FlowStatus.ESCALATED):
            decision = rng.choice(["override", "abort"])
            action = action_of(kernel, flow.dfid)
            await kernel.decide(
                flow.dfid, decision, operator="ana", reason="replay test", action_hash=action
            )
        with anyio.fail_after(30):
            await kernel.wait_quiet()

        events = await kernel.journal.read()
        rebuilt = fold(events)
        assert rebuilt.digest() == kernel.projections.digest()
        assert rebuilt.flows == kernel.projections.flows
        statuses = {f.status for f in rebuilt.flows.values()}
        assert FlowStatus.CLOSED in statuses and FlowStatus.ABORTED in statuses

    async with kernel_for(tmp_path / "j.db") as reopened:
        # Reopening folds the same journal (plus the new KernelStarted) to the same flows.
        assert reopened.projections.flows == rebuilt.flows


async def test_a_kernel_opened_from_a_snapshot_holds_the_whole_state(tmp_path: Path) -> None:
    # Approvals, escalation budgets and every other projection survive the snapshot.
    async with kernel_for(tmp_path / "j.db", checkpoint_every=5) as kernel:
        await kernel.register(ScriptedAgent(steps=[transfer(confidence=0.2)]))
        for _ in range(4):
            await kernel.trigger("bank.invoice")
        await kernel.wait_quiet()
        assert kernel.projections.approvals
    async with kernel_for(tmp_path / "j.db", checkpoint_every=5) as reopened:
        events = await reopened.journal.read()
        assert any(e.type == "ProjectionCheckpoint" for e in events)
        assert reopened.projections.digest() == fold(events).digest()
        assert reopened.projections.waiting == fold(events).waiting
