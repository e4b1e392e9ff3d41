"""A hosted agent's crew grows as it is needed: one task while idle, its size under a burst.

A thousand hosted agents that wait for a topic nothing fires were 64 tasks each (64,000);
they are one task each now, and none for an agent that decides synchronously until a
context is left to its crew (issue 45, P19). An agent that reasons about many flows at
once still gets a task per flow up to ``concurrency``, and never more.
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


class Instant(ScriptedAgent):
    """The clerk saying its decide never waits (it does not, unless ``hold`` is given)."""

    synchronous = True


def crew_tasks() -> int:
    return sum(1 for t in asyncio.all_tasks() if t.get_name().startswith("agent:"))


async def test_an_idle_agent_has_one_reasoning_task(tmp_path: Path) -> None:
    async with kernel_for(tmp_path / "j.db") as kernel:
        await kernel.register(ScriptedAgent("clerk", [transfer(100)]))
        await anyio.lowlevel.checkpoint()
        # The crew's own task and its one reasoner: not the 64 of its size.
        assert crew_tasks() <= 2


async def test_a_synchronous_agent_has_no_task_until_its_crew_is_needed(tmp_path: Path) -> None:
    hold = anyio.Event()
    async with kernel_for(tmp_path / "j.db") as kernel:
        await kernel.register(Instant("clerk", [transfer(100)] * 3))
        await anyio.lowlevel.checkpoint()
        assert crew_tasks() == 0  # its contexts are decided where they are delivered
        [first] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(first)).status is FlowStatus.CLOSED
        assert crew_tasks() == 0
        # Registered again, it waits in its decide: the crew is started and takes it.
        liar = Instant("clerk", [transfer(100)], hold=hold)
        await kernel.register(liar)
        [second] = await kernel.trigger("bank.invoice")
        with anyio.fail_after(30):  # a guard against a hang, not a timing assertion
            await liar.wait_context(2)  # closed at its wait, then reasoned again by the crew
        assert crew_tasks() >= 1
        hold.set()
        assert (await kernel.wait_flow(second)).status is FlowStatus.CLOSED
        assert kernel.stopped is None


async def test_a_synchronous_agent_displaced_before_it_had_a_crew_never_gets_one(
    tmp_path: Path,
) -> None:
    async with kernel_for(tmp_path / "j.db") as kernel:
        agent = Instant("clerk", [transfer(100)])
        await kernel.register(agent)
        await kernel.handshake(agent.manifest)  # now it submits on its own, elsewhere
        await anyio.lowlevel.checkpoint()
        assert crew_tasks() == 0
        assert not kernel.actors.agents.hosting("clerk")
        await kernel.trigger("bank.invoice")
        await anyio.lowlevel.checkpoint()
        assert crew_tasks() == 0 and agent.contexts == []
        assert kernel.stopped is None


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
