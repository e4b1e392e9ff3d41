"""A hosted agent's crew grows as it is needed: one task while idle, its size under a burst.

A thousand hosted agents that wait for a topic nothing fires were 64 tasks each (64,000);
they are one task each now. An agent that reasons about many flows at once still gets
a task per flow up to ``concurrency``, and never more.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio
import anyio.lowlevel

from kernel import FlowStatus, Proposal, WorkingContext
from tests.support.helpers import ScriptedAgent, kernel_for, transfer


class Slow(ScriptedAgent):
    """A clerk that holds each context until released, counting how many it holds at once."""

    def __init__(self) -> None:
        super().__init__("clerk", [transfer(100)] * 40)
        self.release = anyio.Event()
        self.full = anyio.Event()
        self.holding = 0
        self.most = 0

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        self.holding += 1
        self.most = max(self.most, self.holding)
        if self.holding == 8:
            self.full.set()
        await self.release.wait()
        self.holding -= 1
        return await super().decide(ctx)


def crew_tasks() -> int:
    return sum(1 for t in asyncio.all_tasks() if t.get_name().startswith("agent:"))


async def test_an_idle_agent_has_one_reasoning_task(tmp_path: Path) -> None:
    async with kernel_for(tmp_path / "j.db") as kernel:
        await kernel.register(ScriptedAgent("clerk", [transfer(100)]))
        await anyio.lowlevel.checkpoint()
        # The crew's own task and its one reasoner: not the 64 of its size.
        assert crew_tasks() <= 2


async def test_a_burst_grows_the_crew_to_its_size_and_no_further(tmp_path: Path) -> None:
    agent = Slow()
    async with kernel_for(tmp_path / "j.db", agent_concurrency=8) as kernel:
        await kernel.register(agent)
        dfids = []
        for _ in range(12):
            dfids += await kernel.trigger("bank.invoice")
        with anyio.fail_after(30):  # a guard against a hang, not a timing assertion
            await agent.full.wait()
        assert agent.most == 8  # eight at once: the crew's size, never more
        agent.release.set()
        for dfid in dfids:
            assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
    assert agent.most == 8
