"""A read-only kind's call: judged and recorded as any other, committed without a sync of its own.

``Storage.group_reads`` (on by default): a call of a kind that changes nothing in the world
(``PolicyKind.read_only``) has its opening, verdict and intent, then its outcome, committed
with ``Journal.append(durable=False)``: safe from a killed kernel, durable with the next
synced commit (tests/journal/test_unsynced.py, and the SIGKILL test of a writer appending
so). A call of any other kind syncs each commit, and so does any transaction a read-only
call shares with it. The journal holds the same events either way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import ClassVar

import pytest

from kernel import DecisionVerdict, Kernel, Manifest, open_kernel
from kernel.adapters import ExecutionIntent, Receipt
from kernel.audit import open_journal, verify_journal
from kernel.config import KernelConfig, Ports, Storage
from kernel.policy import PolicyKind, PolicyPack
from kernel.testing import ManualClock, SeededIds
from tests.support.helpers import LOCAL


class Quote(PolicyKind, tag="desk.quote"):
    """Read a price: changes nothing."""

    adapter: ClassVar[str] = "desk"
    read_only: ClassVar[bool] = True

    symbol: str


class Buy(PolicyKind, tag="desk.buy"):
    adapter: ClassVar[str] = "desk"

    symbol: str
    quantity: int


DESK = PolicyPack(name="desk", version="1.0.0", kinds=(Quote, Buy))


class Desk:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        self.calls.append(intent.kind)
        return Receipt(external_id=f"x-{len(self.calls)}", detail={"price": "101.5"})


@asynccontextmanager
async def desk_kernel(path: Path, desk: Desk, group_reads: bool = True) -> AsyncIterator[Kernel]:
    config = KernelConfig(
        principal=LOCAL,
        ports=Ports(clock=ManualClock(), ids=SeededIds(3)),
        storage=Storage(group_reads=group_reads),
    )
    async with open_kernel(
        path, packs=[DESK], adapters={"desk": desk}, allow=["trader"], config=config
    ) as kernel:
        await kernel.handshake(
            Manifest(agent_id="trader", version="1.0.0", capabilities=["desk.quote", "desk.buy"])
        )
        yield kernel


async def quote(kernel: Kernel, n: int) -> None:
    decision = await kernel.propose(
        "trader",
        "desk.quote",
        {"symbol": "ACME"},
        explain="the price",
        confidence=0.9,
        tool_call_id=f"q-{n}",
    )
    assert decision.verdict is DecisionVerdict.EXECUTED, decision
    assert decision.result["price"] == "101.5"


async def test_a_read_only_call_commits_twice_without_a_sync_and_another_syncs(
    tmp_path: Path,
) -> None:
    path, desk = tmp_path / "j.db", Desk()
    async with desk_kernel(path, desk) as kernel:
        before = kernel.journal.statistics()
        await quote(kernel, 1)
        after = kernel.journal.statistics()
        # Opening + verdict + intent, then the outcome: two commits, neither synced.
        assert after.transactions - before.transactions == 2
        assert after.unsynced - before.unsynced == 2
        bought = await kernel.propose(
            "trader", "desk.buy", {"symbol": "ACME", "quantity": 3}, explain="buy", confidence=0.9
        )
        assert bought.verdict is DecisionVerdict.EXECUTED, bought
        assert kernel.journal.statistics().unsynced == after.unsynced  # each commit synced
    assert desk.calls == ["desk.quote", "desk.buy"]
    assert (await verify_journal(path)).ok


@pytest.mark.parametrize("group_reads", [True, False])
async def test_the_journal_holds_the_same_events_with_or_without_group_reads(
    tmp_path: Path, group_reads: bool
) -> None:
    path = tmp_path / "j.db"
    async with desk_kernel(path, Desk(), group_reads=group_reads) as kernel:
        for n in range(3):
            await quote(kernel, n)
        unsynced = kernel.journal.statistics().unsynced
    assert unsynced == (6 if group_reads else 0)
    async with open_journal(path) as journal:
        types = [e.type for e in await journal.read() if e.dfid is not None]
    # Three flows, each opened, judged, started, succeeded and closed.
    assert types.count("FlowCreated") == 3 and types.count("FlowClosed") == 3
    assert types.count("ExecutionStarted") == types.count("ExecutionSucceeded") == 3
