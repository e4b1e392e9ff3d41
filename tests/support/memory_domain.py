"""A booking domain with governed memory: a hotel adapter and an agent that follows a plan."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

from agents_sdk import Agent, Manifest, Proposal, WorkingContext
from kernel import Kernel, open_kernel
from kernel.config import KernelConfig, Ports
from kernel.memory import MEMORY_PACK
from kernel.policy import PolicyKind, PolicyPack
from kernel.testing import ManualClock, SeededIds
from tests.support.helpers import PACK, Bank, configured
from tests.support.principals import LOCAL


class Reserve(PolicyKind, frozen=True, tag="booking.reserve"):
    adapter: ClassVar[str] = "bank"

    hotel: str
    nights: int


BOOKING = PolicyPack(name="booking", version="1.0.0", kinds=(Reserve,))
MEMORY_KINDS = [
    "memory.add_fact",
    "memory.add_constraint",
    "memory.deactivate_constraint",
    "memory.record_decision",
    "memory.query",
    "memory.propose_rule",
]

Step = Callable[[WorkingContext], Proposal | None]


def book(hotel: str = "Granvia", explain: str = "book the hotel the guest asked for") -> Step:
    return lambda ctx: ctx.propose(Reserve(hotel=hotel, nights=2), explain=explain)


def remember(kind: str, **params: Any) -> Step:
    return lambda ctx: ctx.propose({"kind": kind, **params}, explain=f"{kind} {params}")


def note(text: str) -> Step:
    return lambda ctx: ctx.propose({"kind": "test.note", "text": text}, explain=text)


class Planner(Agent):
    """Takes one plan (steps by attempt) per flow, in the order its flows arrive."""

    def __init__(self, agent_id: str = "booker", max_attempts: int = 3) -> None:
        self.manifest = Manifest(
            agent_id=agent_id,
            version="1.0.0",
            capabilities=["booking.reserve", "test.note", *MEMORY_KINDS],
            subscriptions=[f"desk.{agent_id}"],
            max_attempts=max_attempts,
        )
        self.plans: list[Sequence[Step]] = []
        self._flows: dict[str, int] = {}
        self.contexts: list[WorkingContext] = []

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        self.contexts.append(ctx)
        index = self._flows.setdefault(ctx.dfid, len(self._flows))
        steps = self.plans[index]
        return steps[min(ctx.attempt, len(steps)) - 1](ctx)


async def run(kernel: Kernel, agent: Planner, *steps: Step) -> str:
    """Open one flow for ``agent`` with these steps by attempt; return its DFID once it ends."""
    agent.plans.append(steps)
    topic = f"desk.{agent.manifest.agent_id}"
    [dfid] = await kernel.trigger(topic, {f"{topic}.request": len(agent.plans)})
    await kernel.wait_flow(dfid)
    return dfid


@asynccontextmanager
async def booking_kernel(path: Path, **kw: Any) -> AsyncIterator[Kernel]:
    async with open_kernel(
        path,
        packs=[PACK, BOOKING, MEMORY_PACK],
        adapters={"bank": Bank()},
        allow=["booker", "other"],
        config=configured(
            KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(), ids=SeededIds(11))), **kw
        ),
    ) as kernel:
        yield kernel
