"""The suite's small test domain: one pack, a bank at the edge of the world, a clerk."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

import msgspec

from kernel import Clock, FlowState, Kernel, Proposal, WorkingContext, open_kernel, testing
from kernel.adapters import Adapter, ExecutionIntent, Receipt
from kernel.config import KernelConfig, Ports
from kernel.policy import PolicyKind, PolicyPack
from kernel.testing import ManualClock, SeededIds, Step
from tests.support.principals import LOCAL as LOCAL


def configured(config: KernelConfig, **settings: Any) -> KernelConfig:
    """Return ``config`` with flat settings (``max_in_flight=8``) put in their groups.

    A config that names no principal gets :data:`LOCAL` unless ``principal=`` is given
    (``principal=None``: a kernel that vouches for nobody).
    """
    if config.principal is None and "principal" not in settings:
        config = msgspec.structs.replace(config, principal=LOCAL)
    groups = {name: getattr(config, name) for name in ("limits", "supervision", "storage", "ports")}
    top = {}
    for key, value in settings.items():
        group = next((name for name, g in groups.items() if key in g.__struct_fields__), None)
        if group is not None:
            groups[group] = msgspec.structs.replace(groups[group], **{key: value})
        elif key in config.__struct_fields__:
            top[key] = value
        else:
            raise TypeError(f"no kernel setting is called {key!r}")
    return msgspec.structs.replace(config, **groups, **top)


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


def transfer(
    amount: int = 100, confidence: float = 0.9, **kw: Any
) -> Callable[[WorkingContext], Proposal]:
    """A step that proposes a transfer on the context it was given (a Step that always proposes)."""
    return lambda ctx: ctx.propose(
        Transfer(account="acc-1", amount_cents=amount),
        explain="pay the invoice",
        confidence=confidence,
        **kw,
    )


class ScriptedAgent(testing.ScriptedAgent):
    """kernel.testing's scripted agent with this suite's defaults: a clerk paying an invoice."""

    def __init__(
        self,
        agent_id: str = "clerk",
        steps: Sequence[Step] = (),
        *,
        capabilities: Sequence[str] = ("test.transfer",),
        subscriptions: Sequence[str] = ("bank",),
        **kw: Any,
    ) -> None:
        super().__init__(
            agent_id,
            list(steps) or [transfer()],
            capabilities=capabilities,
            subscriptions=subscriptions,
            **kw,
        )


@asynccontextmanager
async def kernel_for(
    path: Path,
    *,
    bank: Adapter | None = None,
    allow: Sequence[str] = ("clerk", "auditor", "other"),
    clock: Clock | None = None,
    packs: Sequence[Any] = (),
    **kw: Any,
) -> AsyncIterator[Kernel]:
    """Open a kernel on a real journal file with the test pack (and ``packs``) and a bank."""
    async with open_kernel(
        path,
        packs=[PACK, *packs],
        adapters={"bank": bank or Bank()},
        allow=allow,
        config=configured(
            KernelConfig(
                principal=LOCAL, ports=Ports(clock=clock or ManualClock(), ids=SeededIds(7))
            ),
            **kw,
        ),
    ) as kernel:
        yield kernel


def flow_of(kernel: Kernel, dfid: str) -> FlowState:
    """Return the state of a flow the test knows is there (``kernel.flow`` may say None)."""
    flow = kernel.flow(dfid)
    assert flow is not None, f"no flow {dfid}"
    return flow


def manual_clock(kernel: Kernel) -> ManualClock:
    """Return the kernel's clock where the test gave it a ``ManualClock`` (to advance it)."""
    clock = kernel.clock
    assert isinstance(clock, ManualClock), f"the kernel runs on {type(clock).__name__}"
    return clock
