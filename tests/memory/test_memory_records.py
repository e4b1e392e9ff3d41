"""The memory executor never writes: the engine records its events with ExecutionSucceeded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from kernel import FlowStatus, Kernel, open_kernel
from kernel.adapters import ExecutionIntent, Receipt
from kernel.audit import payload_of
from kernel.config import KernelConfig, Ports
from kernel.core.events import (
    Draft,
    ExecutionFailed,
    ExecutionStarted,
    ExecutionSucceeded,
    FactAdded,
    RuleDecided,
    RuleProposed,
)
from kernel.core.reasons import ReasonCode
from kernel.memory import MEMORY_PACK
from kernel.state.domain import RecordingReceipt
from kernel.testing import ManualClock, SeededIds
from tests.support.helpers import PACK, Bank
from tests.support.memory_domain import BOOKING, Planner, book, booking_kernel, remember, run
from tests.support.principals import LOCAL

RULE = {
    "rule": "access",
    "title": "Access",
    "content": "Ask first.",
    "repo": "acme/runbooks",
    "path": "a.md",
    "blob": "b1",
}


@asynccontextmanager
async def kernel_with(path: Path, **adapters: Any) -> AsyncIterator[Kernel]:
    async with open_kernel(
        path,
        packs=[PACK, BOOKING, MEMORY_PACK],
        adapters={"bank": Bank(), **adapters},
        allow=["booker"],
        config=KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(), ids=SeededIds(3))),
    ) as kernel:
        yield kernel


async def test_a_fact_and_the_end_of_its_execution_are_one_append(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db") as kernel:
        agent = Planner()
        await kernel.register(agent)
        dfid = await run(kernel, agent, remember("memory.add_fact", name="a", value="b"))
        events = await kernel.journal.flow_events(dfid)
        types = [e.type for e in events]
        at = types.index("FactAdded")
        assert types[at : at + 3] == ["FactAdded", "ExecutionSucceeded", "FlowClosed"]
        fact, succeeded, closed = events[at : at + 3]
        # One transaction: consecutive seqs, one timestamp; the FlowClosed is derived from
        # the success (one row for both: kernel.core.events.with_derived), so it shares its seq.
        assert [succeeded.seq, closed.seq] == [fact.seq + 1, fact.seq + 1]
        assert fact.ts == succeeded.ts == closed.ts
        started = next(e for e in events if isinstance(e.payload, ExecutionStarted))
        assert fact.caused_by == started.seq and succeeded.caused_by == started.seq
        assert isinstance(succeeded.payload, ExecutionSucceeded)
        key = payload_of(started, ExecutionStarted).intent.key
        assert succeeded.payload.external_id == f"memory:{key}"


async def test_an_agents_rule_proposal_is_recorded_by_the_dim_and_answered(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db") as kernel:
        agent = Planner()
        await kernel.register(agent)
        dfid = await run(kernel, agent, remember("memory.propose_rule", **RULE))
        events = await kernel.journal.flow_events(dfid)
        proposed = next(e for e in events if isinstance(e.payload, RuleProposed))
        decided = next(e for e in events if isinstance(e.payload, RuleDecided))
        succeeded = next(e for e in events if isinstance(e.payload, ExecutionSucceeded))
        started = next(e for e in events if isinstance(e.payload, ExecutionStarted))
        assert proposed.caused_by == started.seq and decided.caused_by == proposed.seq
        assert proposed.agent_id == "booker" and decided.seq < succeeded.seq
        assert payload_of(succeeded, ExecutionSucceeded).detail == {
            "decision": "promote",
            "reason": "NEW_RULE",
            "version": 1,
        }


class Hung:
    """A memory adapter whose call never answers (the kernel stops while it runs)."""

    def __init__(self) -> None:
        self.called = anyio.Event()

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        self.called.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


async def test_a_fact_an_earlier_kernel_recorded_alone_is_found_not_written_again(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    hung = Hung()
    async with kernel_with(db, memory=hung) as kernel:
        agent = Planner()
        await kernel.register(agent)
        agent.plans.append([remember("memory.add_fact", name="a", value="b")])
        [dfid] = await kernel.trigger("desk.booker", {"desk.booker.request": 1})
        await hung.called.wait()
        started = next(
            e for e in await kernel.journal.flow_events(dfid) if e.type == "ExecutionStarted"
        )
        key = payload_of(started, ExecutionStarted).intent.key
        # What the previous kernel's executor did: append the fact by itself, then crash.
        fact = FactAdded(name="a", value="b", correlation_id=dfid, key=key)
        await kernel.journal.append(
            [Draft(payload=fact, dfid=dfid, caused_by=started.seq, agent_id="booker")]
        )
    async with booking_kernel(db) as kernel:
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.CLOSED
        assert flow.external_id == f"memory:{key}"
        [succeeded] = [
            e.payload
            for e in await kernel.journal.flow_events(dfid)
            if isinstance(e.payload, ExecutionSucceeded)
        ]
        assert succeeded.recovered  # found by lookup, not done again
        assert len(await kernel.journal.read(types=["FactAdded"])) == 1


class Forger:
    """An adapter that returns events to record that are not its intent's to record."""

    def __init__(self, key: str = "another key") -> None:
        self.key = key

    async def execute(self, intent: Any) -> Receipt:
        fact = FactAdded(name="forged", value="x", key=self.key or intent.key)
        return RecordingReceipt(external_id="x", records=(fact,))


async def test_events_outside_the_memory_executors_own_are_refused(tmp_path: Path) -> None:
    async with kernel_with(tmp_path / "j.db", memory=Forger(), bank=Forger("")) as kernel:
        agent = Planner(max_attempts=1)
        await kernel.register(agent)
        wrong_key = await run(kernel, agent, remember("memory.add_fact", name="a", value="b"))
        not_memory = await run(kernel, agent, book())
        for dfid in (wrong_key, not_memory):
            flow = kernel.flow(dfid)
            assert flow is not None and flow.status is FlowStatus.ABORTED
            assert flow.reason_code is ReasonCode.EXECUTION_FAILED
            [failed] = [
                e.payload
                for e in await kernel.journal.flow_events(dfid)
                if isinstance(e.payload, ExecutionFailed)
            ]
            assert "record" in failed.error or "outside" in failed.error
        assert await kernel.journal.read(types=["FactAdded"]) == []
        assert kernel.projections.memory.facts == {}
