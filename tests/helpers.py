"""A small test domain: one pack, an adapter at the edge of the world, scripted agents."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

import anyio

from agents_sdk import Agent, Manifest, Proposal, WorkingContext
from kernel import (
    Clock,
    ExecutionIntent,
    Kernel,
    ManualClock,
    PolicyKind,
    PolicyPack,
    Receipt,
    SeededIds,
    open_kernel,
)

POISON_CRASHES = {"remaining": 0}
"""How many more times a Poison policy with text 'poison' crashes the kernel code judging it."""


class Transfer(PolicyKind, tag="test.transfer"):
    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "bank"

    account: str
    amount_cents: int


class Note(PolicyKind, tag="test.note"):
    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "bank"

    text: str


class Poison(PolicyKind, tag="test.poison"):
    """A policy kind with a bug: judging it raises (the injected actor crash)."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "bank"

    text: str

    def __post_init__(self) -> None:
        if self.text == "poison" and POISON_CRASHES["remaining"] > 0:
            POISON_CRASHES["remaining"] -= 1
            raise RuntimeError("bug in a policy kind")


PACK = PolicyPack(
    name="test", version="1.0.0", kinds=(Transfer, Note, Poison), escalate_below_confidence=0.5
)
ALL_KINDS = ["test.transfer", "test.note", "test.poison"]


class Bank:
    """A simulated bank at the edge of the world: it deduplicates on the idempotency key."""

    def __init__(self) -> None:
        self.calls: list[ExecutionIntent] = []
        self.effects: dict[str, Receipt] = {}
        self._ids = itertools.count(1)

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        self.calls.append(intent)
        if intent.key not in self.effects:
            self.effects[intent.key] = Receipt(
                external_id=f"tx-{next(self._ids)}",
                detail={"amount": intent.params.get("amount_cents")},
            )
        return self.effects[intent.key]


Step = Callable[[WorkingContext], Proposal | None]


def transfer(amount: int = 100, confidence: float = 0.9, **kw: Any) -> Step:
    """A step that proposes a transfer on the context it was given."""
    return lambda ctx: ctx.propose(
        Transfer(account="acc-1", amount_cents=amount),
        explain="pay the invoice",
        confidence=confidence,
        **kw,
    )


class ScriptedAgent(Agent):
    """Plays its steps in order, one per attempt; remembers every context it saw."""

    def __init__(
        self,
        agent_id: str = "clerk",
        steps: Sequence[Step] = (),
        *,
        capabilities: Sequence[str] = ("test.transfer",),
        subscriptions: Sequence[str] = ("bank",),
        version: str = "1.0.0",
        max_attempts: int = 3,
        gate: anyio.Event | None = None,
    ) -> None:
        self.manifest = Manifest(
            agent_id=agent_id,
            version=version,
            capabilities=list(capabilities),
            subscriptions=list(subscriptions),
            max_attempts=max_attempts,
        )
        self.steps = list(steps) or [transfer()]
        self.contexts: list[WorkingContext] = []
        self.gate = gate
        self._arrived = anyio.Event()

    async def wait_context(self, count: int = 1) -> WorkingContext:
        """Wait until the agent has been handed ``count`` contexts; return the last."""
        while len(self.contexts) < count:
            await self._arrived.wait()
            self._arrived = anyio.Event()
        return self.contexts[count - 1]

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        self.contexts.append(ctx)
        self._arrived.set()
        if self.gate is not None:
            await self.gate.wait()
        step = self.steps[min(ctx.attempt, len(self.steps)) - 1]
        return step(ctx)


@asynccontextmanager
async def kernel_for(
    path: Path,
    *,
    bank: Bank | None = None,
    allow: Sequence[str] = ("clerk", "auditor", "other"),
    clock: Clock | None = None,
    **kw: Any,
) -> AsyncIterator[Kernel]:
    """Open a kernel on a real journal file with the test pack and a bank."""
    async with open_kernel(
        path,
        packs=[PACK],
        adapters={"bank": bank or Bank()},
        allow=allow,
        clock=clock or ManualClock(),
        ids=SeededIds(7),
        **kw,
    ) as kernel:
        yield kernel


def action_of(kernel: Kernel, dfid: str) -> str | None:
    """Return the hash of the action flow ``dfid`` waits on (what approving HIGH_IMPACT takes)."""
    approval = kernel.projections.approvals.get(dfid)
    return approval.action_hash if approval is not None else None


async def types_of(kernel: Kernel, dfid: str) -> list[str]:
    """The event types of one flow, in order."""
    return [e.type for e in await kernel.journal.flow_events(dfid)]
