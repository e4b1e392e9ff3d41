"""Resource reservations end to end: reserved with the verdict, released at every end."""

from __future__ import annotations

import random
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel import FlowStatus, Kernel, ReasonCode, open_kernel
from kernel.adapters import ExecutionIntent, Receipt
from kernel.adapters.contract import AdapterError
from kernel.audit import fold, payload_of, payloads
from kernel.config import KernelConfig, Ports
from kernel.core.events import (
    ProposalAccepted,
    ProposalRejected,
    ResourceReleased,
    ResourceReserved,
)
from kernel.dim.verdict import Staged
from kernel.policy import PolicyKind, PolicyPack
from kernel.policy.packs import Consume
from kernel.state.projections import Projections
from kernel.state.reservations import Reservations
from kernel.testing import ManualClock, SeededIds, Step, action_of
from tests.support.helpers import LOCAL, ScriptedAgent, configured, flow_of


class Claim(PolicyKind, tag="race.claim"):
    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "depot"

    sku: str
    qty: int


PACK = PolicyPack(
    name="race",
    version="1.0.0",
    kinds=(Claim,),
    escalate_below_confidence=0.5,
    consumes=(Consume(Claim, "inventory:{sku}", "qty"),),
    capacities={"inventory:*": 1},
)


class Depot:
    """An adapter that holds every call until ``open`` is set; ``fail`` makes calls fail."""

    def __init__(self, fail: bool = False) -> None:
        self.open = anyio.Event()
        self.fail = fail
        self.calls: list[ExecutionIntent] = []

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        self.calls.append(intent)
        await self.open.wait()
        if self.fail:
            raise AdapterError("depot closed")
        return Receipt(external_id=f"c-{len(self.calls)}")


def claim(qty: int = 1, confidence: float = 0.9) -> Step:
    return lambda ctx: ctx.propose(Claim(sku="X", qty=qty), confidence=confidence)


def kernel(
    path: Path, depot: Depot, names: Sequence[str] = ("a",), **kw: Any
) -> AbstractAsyncContextManager[Kernel]:
    return open_kernel(
        path,
        packs=[PACK],
        adapters={"depot": depot},
        allow=list(names),
        config=configured(
            KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(), ids=SeededIds(3))), **kw
        ),
    )


def agent(
    name: str = "a",
    qty: int = 1,
    confidence: float = 0.9,
    subscriptions: Sequence[str] = ("depot",),
    **kw: Any,
) -> ScriptedAgent:
    return ScriptedAgent(
        name,
        [claim(qty, confidence)],
        capabilities=["race.claim"],
        subscriptions=subscriptions,
        max_attempts=1,
        **kw,
    )


async def events_of(k: Kernel, dfid: str) -> list[tuple[str, str | None]]:
    """Each event of the flow: its type, and the pool it reserves or releases (None: none)."""
    return [
        (
            e.type,
            e.payload.pool if isinstance(e.payload, ResourceReserved | ResourceReleased) else None,
        )
        for e in await k.journal.flow_events(dfid)
    ]


async def test_acceptance_reserves_in_the_same_append_and_closing_releases(tmp_path: Path) -> None:
    depot = Depot()
    async with kernel(tmp_path / "j.db", depot) as k:
        await k.register(agent())
        [dfid] = await k.trigger("depot.order")
        await k.wait_flow(dfid, {FlowStatus.EXECUTING})
        assert k.projections.held == {"inventory:X": 1}
        assert k.projections.reservations == {dfid: {"inventory:X": 1}}
        events = await k.journal.read(dfid=dfid)
        accepted = next(e for e in events if e.type == "ProposalAccepted")
        reserved = next(e for e in events if e.type == "ResourceReserved")
        assert reserved.seq == accepted.seq + 1 and reserved.caused_by == accepted.seq
        assert payload_of(accepted, ProposalAccepted).pack == PACK.hash

        depot.open.set()
        assert (await k.wait_flow(dfid)).status is FlowStatus.CLOSED
        events = await k.journal.read(dfid=dfid)
        closed = next(e for e in events if e.type == "FlowClosed")
        released = next(e for e in events if e.type == "ResourceReleased")
        assert released.seq == closed.seq + 1
        assert payload_of(released, ResourceReleased).reason == "CLOSED"
        assert k.projections.held == {} and k.projections.reservations == {}


async def test_a_failed_execution_releases(tmp_path: Path) -> None:
    depot = Depot(fail=True)
    depot.open.set()
    async with kernel(tmp_path / "j.db", depot) as k:
        await k.register(agent())
        [dfid] = await k.trigger("depot.order")
        flow = await k.wait_flow(dfid)
        assert flow.reason_code is ReasonCode.EXECUTION_FAILED
        assert ("ResourceReleased", "inventory:X") in await events_of(k, dfid)
        assert k.projections.held == {}


@pytest.mark.parametrize("decision", ["abort", "override"])
async def test_an_escalated_flow_holds_until_a_human_ends_it(tmp_path: Path, decision: str) -> None:
    depot = Depot()
    depot.open.set()
    async with kernel(tmp_path / "j.db", depot, names=("a", "b")) as k:
        await k.register(agent("a", confidence=0.1))
        [first] = await k.trigger("depot.order")
        assert (await k.wait_flow(first)).status is FlowStatus.ESCALATED
        assert k.projections.held == {"inventory:X": 1}
        # While a human thinks, the unit is not free for anyone else.
        await k.register(agent("b", subscriptions=["other"]))
        [second] = await k.trigger("other.order")
        assert (await k.wait_flow(second)).status is FlowStatus.ABORTED
        [rejected] = await k.journal.read(dfid=second, types=["ProposalRejected"])
        feedback = payload_of(rejected, ProposalRejected).feedback
        assert feedback.reason_code is ReasonCode.RESOURCE_CONTENTION

        await k.decide(
            first, decision, operator="ana", reason="checked", action_hash=action_of(k, first)
        )
        await k.wait_flow(first, {FlowStatus.CLOSED, FlowStatus.ABORTED})
        assert k.projections.held == {}


async def test_reservations_survive_a_restart_and_are_released_after_it(tmp_path: Path) -> None:
    async with kernel(tmp_path / "j.db", Depot()) as k:
        await k.register(agent(confidence=0.1))
        [dfid] = await k.trigger("depot.order")
        await k.wait_flow(dfid)

    depot = Depot()
    depot.open.set()
    async with kernel(tmp_path / "j.db", depot) as k:
        assert k.projections.held == {"inventory:X": 1}
        await k.decide(dfid, "abort", operator="ana", reason="no")
        await k.wait_flow(dfid)
        assert k.projections.held == {}
        assert fold(await k.journal.read()).digest() == k.projections.digest()


async def test_an_over_commit_beyond_capacity_is_insufficient(tmp_path: Path) -> None:
    async with kernel(tmp_path / "j.db", Depot()) as k:
        await k.register(agent(qty=2))
        [dfid] = await k.trigger("depot.order")
        await k.wait_flow(dfid)
        [rejected] = payloads(
            await k.journal.read(dfid=dfid, types=["ProposalRejected"]), ProposalRejected
        )
        feedback = rejected.feedback
        assert feedback.reason_code is ReasonCode.INSUFFICIENT_RESOURCES
        assert (feedback.layer, feedback.rule, feedback.limit) == ("resources", "inventory:X", "1")
        assert rejected.pack == PACK.hash


async def test_a_capacity_fact_resizes_a_pool(tmp_path: Path) -> None:
    depot = Depot()
    async with kernel(tmp_path / "j.db", depot) as k:
        await k.register(agent(qty=3))
        [dfid] = await k.trigger("depot.order", {"capacity.inventory:X": 5})
        await k.wait_flow(dfid, {FlowStatus.EXECUTING})
        assert k.projections.held == {"inventory:X": 3}
        depot.open.set()
        await k.wait_flow(dfid)


@pytest.mark.parametrize("seed", range(24), ids=lambda s: f"seed={s}")
async def test_racing_agents_never_over_commit(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    capacity = rng.choice([1, 1, 2, 3])
    names = [f"agent-{i}" for i in range(rng.randint(2, 6))]
    wants = {name: rng.choice([1, 1, 2]) for name in names}
    gates = {name: anyio.Event() for name in names}
    depot = Depot()  # holds every accepted flow open: reservations only grow
    async with kernel(tmp_path / "j.db", depot, names=names) as k:
        over: list[dict[str, int]] = []
        k.journal.add_listener(
            lambda _: (
                over.append(dict(k.projections.held))
                if k.projections.held.get("inventory:X", 0) > capacity
                else None
            )
        )
        agents = {n: agent(n, qty=wants[n], hold=gates[n]) for n in names}
        for n in names:
            await k.register(agents[n])
        dfids = await k.trigger("depot.order", {"capacity.inventory:X": capacity})
        for a in agents.values():
            await a.wait_context()
        # Release the agents in a seeded order, with seeded pauses between them.
        for name in rng.sample(names, len(names)):
            gates[name].set()
            for _ in range(rng.randint(0, 6)):
                await anyio.lowlevel.checkpoint()
        for dfid in dfids:
            await k.wait_flow(dfid, {FlowStatus.EXECUTING, FlowStatus.ABORTED})
        flows = {flow_of(k, d).agent_id: flow_of(k, d) for d in dfids}
        won = [n for n, f in flows.items() if f.status is FlowStatus.EXECUTING]
        lost = [n for n, f in flows.items() if f.status is FlowStatus.ABORTED]
        assert over == []
        taken = sum(wants[n] for n in won)
        assert taken <= capacity and k.projections.held.get("inventory:X", 0) == taken
        if any(wants[n] <= capacity for n in names):
            assert won, "someone must win a free pool"
        for n in lost:
            assert wants[n] > capacity - taken  # no rejection was unnecessary
            [rejected] = await k.journal.read(dfid=flows[n].dfid, types=["ProposalRejected"])
            assert payload_of(rejected, ProposalRejected).feedback.reason_code in (
                ReasonCode.RESOURCE_CONTENTION,
                ReasonCode.INSUFFICIENT_RESOURCES,
            )
        if capacity == 1 and 1 in [wants[n] for n in names]:
            assert len(won) == 1  # the last unit: exactly one wins
        depot.open.set()
        for dfid in dfids:
            await k.wait_flow(dfid)
        assert k.projections.held == {}


_POOLS = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 5), max_size=3)


@settings(max_examples=200, deadline=None)
@given(
    committed=st.dictionaries(st.sampled_from(["f1", "f2", "f3"]), _POOLS, max_size=3),
    steps=st.lists(st.tuples(st.sampled_from(["f1", "f2", "f3", "f4"]), _POOLS, st.booleans())),
)
def test_what_a_batch_holds_is_kept_as_it_reserves_and_equals_counting_it_afresh(
    committed: dict[str, dict[str, int]], steps: list[tuple[str, dict[str, int], bool]]
) -> None:
    projections = Projections()
    reservations = projections.domain(Reservations)
    reservations.holds = {dfid: dict(pools) for dfid, pools in committed.items()}
    reservations.held = {}
    for pools in committed.values():
        for pool, amount in pools.items():
            reservations.held[pool] = reservations.held.get(pool, 0) + amount
    staged = Staged()
    for dfid, pools, look in steps:
        if look:
            staged.held(projections)  # counted now, then kept as reservations are staged
        staged.reserve(dfid, dict(pools))
        afresh = Staged(reserved=dict(staged.reserved))
        kept = staged.held(projections)
        counted = afresh.held(projections)
        assert {p: n for p, n in kept.items() if n} == {p: n for p, n in counted.items() if n}
