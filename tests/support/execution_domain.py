"""A test domain for the execution engine: a desk adapter with scripted faults, sagas, orders."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

import anyio

from kernel import Kernel, open_kernel
from kernel.adapters import AdapterError, ExecutionIntent, Quote, Receipt, RetryPolicy, SagaStep
from kernel.audit import Event
from kernel.config import KernelConfig, Ports
from kernel.policy import PolicyKind, PolicyPack
from kernel.testing import ManualClock, SeededIds, Step
from tests.support.helpers import ScriptedAgent, configured
from tests.support.principals import LOCAL


class Ping(PolicyKind, tag="desk.ping"):
    adapter: ClassVar[str] = "desk"

    text: str


class Order(PolicyKind, tag="desk.order"):
    adapter: ClassVar[str] = "desk"

    symbol: str
    side: str
    quantity: int
    reference_price: str
    max_slippage_bps: int
    limit_price: str | None = None
    required_market_state: str | None = None


class Trip(PolicyKind, tag="desk.trip"):
    """A saga: one booking per leg, each cancelled when a later leg fails."""

    adapter: ClassVar[str] = "desk"

    legs: list[str]

    def steps(self) -> list[SagaStep]:
        return [
            SagaStep(action=f"book_{leg}", params={"leg": leg}, compensation={"leg": leg})
            for leg in self.legs
        ]


DESK = PolicyPack(name="desk", version="1.0.0", kinds=(Ping, Order, Trip))
KINDS = ["desk.ping", "desk.order", "desk.trip"]


class After(Exception):
    """Script entry: carry out the effect, then fail with ``error`` (the answer is lost)."""

    def __init__(self, error: AdapterError) -> None:
        super().__init__(str(error))
        self.error = error


def name_of(intent: ExecutionIntent) -> str:
    """The script name of an intent: its action (or kind), ``undo:`` for compensations."""
    return ("undo:" if intent.compensation else "") + (intent.action or intent.kind)


class Desk:
    """An in-memory external system that deduplicates on the key and fails on script.

    ``script`` maps an intent's name to the errors its next calls raise, in order.
    ``gates`` hold calls of a name until the test sets the event.
    """

    def __init__(
        self,
        script: dict[str, list[Exception]] | None = None,
        *,
        price: str = "100.00",
        market_state: str = "open",
        retry_policy: RetryPolicy | None = None,
        gates: dict[str, anyio.Event] | None = None,
    ) -> None:
        self.script = script or {}
        self.price = price
        self.market_state = market_state
        self.gates = gates or {}
        self.calls: list[ExecutionIntent] = []
        self.effects: dict[str, Receipt] = {}
        self.quotes = 0
        if retry_policy is not None:
            self.retry_policy = retry_policy

    def names(self) -> list[str]:
        return [name_of(i) for i in self.calls]

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        self.calls.append(intent)
        name = name_of(intent)
        if name in self.gates:
            await self.gates[name].wait()
        queue = self.script.get(name)
        failure = queue.pop(0) if queue else None
        if failure is not None and not isinstance(failure, After):
            raise failure
        if intent.key not in self.effects:
            self.effects[intent.key] = Receipt(external_id=f"{name}-{len(self.effects) + 1}")
        if isinstance(failure, After):
            raise failure.error
        return self.effects[intent.key]

    async def quote(self, intent: ExecutionIntent) -> Quote:
        self.quotes += 1
        return Quote(price=self.price, market_state=self.market_state)


class LookupDesk(Desk):
    """A desk whose system does not deduplicate, but can be asked what happened to a key."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.lookups: list[str] = []

    async def lookup(self, key: str) -> Receipt | None:
        self.lookups.append(key)
        return self.effects.get(key)


def agent(*policies: PolicyKind, confidence: float = 0.9, **kw: Any) -> ScriptedAgent:
    """A clerk proposing ``policies`` in order, one per attempt."""

    def step(policy: PolicyKind) -> Step:
        return lambda ctx: ctx.propose(policy, confidence=confidence, valid_for_s=60)

    steps = [step(p) for p in policies]
    return ScriptedAgent(steps=steps, capabilities=KINDS, subscriptions=["desk"], **kw)


@asynccontextmanager
async def desk_kernel(
    path: Path, desk: Desk, *, clock: ManualClock | None = None, **kw: Any
) -> AsyncIterator[Kernel]:
    """Open a kernel on a real journal file with the desk pack and adapter."""
    async with open_kernel(
        path,
        packs=[DESK],
        adapters={"desk": desk},
        allow=["clerk"],
        config=configured(
            KernelConfig(
                principal=LOCAL,
                ports=Ports(clock=clock or ManualClock(), ids=SeededIds(7), jitter_seed=1),
            ),
            **kw,
        ),
    ) as kernel:
        yield kernel


class Watch:
    """Wait for recorded events of a flow without polling: wakes on every commit."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self._wake = anyio.Event()
        kernel.journal.add_listener(self._committed)

    def _committed(self, events: Sequence[Event]) -> None:
        wake, self._wake = self._wake, anyio.Event()
        wake.set()

    async def events(self, dfid: str, type_: str, count: int = 1) -> list[Event]:
        """Return the flow's events of ``type_`` once there are at least ``count``."""
        while True:
            wake = self._wake
            found = await self.kernel.journal.read(dfid=dfid, types=[type_])
            if len(found) >= count:
                return found
            await wake.wait()
