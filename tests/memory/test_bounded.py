"""What the kernel keeps per key does not grow with the flows it serves (issue #20).

An intent's idempotency record goes with its recorded outcome, a flow tree's queries
when the tree's root has ended, and each agent keeps its newest QUERIED_TOPICS topics.
Journals from before these bounds fold exactly as their kernels did.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import pytest

from kernel import ReasonCode
from kernel.audit import fold, open_journal
from kernel.core.events import (
    AnyPayload,
    ConstraintAdded,
    Event,
    FlowAborted,
    FlowCreated,
    KernelStarted,
    MemoryQueried,
    ProposalRecord,
)
from kernel.state.constraints import check
from kernel.state.memory import QUERIED_TOPICS, MemoryState
from kernel.state.projections import FOLD, Projections
from kernel.state.snapshots import verify_projections
from tests.support import GOLDEN
from tests.support.memory_domain import Planner, book, booking_kernel, remember, run

ACCESS = "verify accessibility before booking"


async def test_memory_kept_per_key_does_not_grow_with_the_flows_served(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with booking_kernel(path, keep_finished=4, checkpoint_every=40) as kernel:
        agent = Planner()
        await kernel.register(agent)
        await run(kernel, agent, remember("memory.add_constraint", text=ACCESS))
        for n in range(12):
            await run(kernel, agent, remember("memory.add_fact", name=f"guest.{n}", value="x"))
            await run(kernel, agent, remember("memory.query", topic=f"accessibility {n}"))
            await run(kernel, agent, book())
        memory = kernel.projections.memory
        assert memory.written == {} and memory.pending == {}
        # Only the agent's own queries remain: every flow tree that queried has ended.
        assert set(memory.queried) == {"booker"} and len(memory.queried["booker"]) == 12
        assert len(memory.facts) == 12  # the memory itself is kept, of course
        live, last = kernel.projections.digest(), kernel.projections.last_seq

    async with open_journal(path, readonly=True) as journal:
        events = await journal.read()
        [started] = [e.payload for e in events if isinstance(e.payload, KernelStarted)]
        assert started.fold == FOLD >= 2
        assert fold(e for e in events if e.seq <= last).digest() == live
        report = await verify_projections(journal)
        assert report.ok and report.checkpoints >= 2, report.problems

        # The same events under the rules before the bounds: every record kept.
        unbounded = fold(
            msgspec.structs.replace(e, payload=msgspec.structs.replace(e.payload, fold=1))
            if isinstance(e.payload, KernelStarted)
            else e
            for e in events
            if e.seq <= last
        )
        assert len(unbounded.memory.written) == 1 + 12 + 12
        assert len(unbounded.memory.queried) == 1 + 12  # the agent and each querying tree
        assert unbounded.digest() != live


async def test_a_journal_from_before_the_bounds_folds_as_its_kernel_did(tmp_path: Path) -> None:
    # A copy: even a read-only open leaves -wal and -shm files beside a journal in WAL mode.
    path = tmp_path / "booking.db"
    shutil.copyfile(GOLDEN / "booking.db", path)
    async with open_journal(path, readonly=True) as journal:
        projections = fold(await journal.read())
        report = await verify_projections(journal)
    assert projections.fold == 1
    assert len(projections.memory.written) == 2  # kept, as the recorded checkpoints hash it
    assert report.ok, report.problems


def _event(
    seq: int, payload: AnyPayload, dfid: str | None = None, agent_id: str | None = None
) -> Event:
    return Event(seq=seq, ts=seq, payload=payload, dfid=dfid, agent_id=agent_id)


def _queried(state: MemoryState, topics: list[str], bounded: bool = True) -> None:
    for topic in topics:
        seq = len(state.queried.get("a", {})) + 1000 * len(topic)
        state.apply(_event(seq, MemoryQueried(topic=topic), agent_id="a"), bounded=bounded)


def test_each_agent_keeps_its_newest_queried_topics_and_must_query_the_older_again() -> None:
    memory = MemoryState()
    memory.apply(_event(1, ConstraintAdded(text="verify t0 before booking", priority="required")))
    memory.apply(_event(2, ConstraintAdded(text="verify t299 before booking", priority="required")))
    for n in range(300):
        memory.apply(_event(10 + n, MemoryQueried(topic=f"t{n}"), agent_id="a"), bounded=True)
    kept = memory.queried["a"]
    assert len(kept) == QUERIED_TOPICS
    assert set(kept) == {f"t{n}" for n in range(300 - QUERIED_TOPICS, 300)}
    booking = ProposalRecord(kind="booking.reserve", params={}, explain="booking")
    refusal = check(memory, booking, "a", "")
    assert refusal is not None and refusal.reason_code is ReasonCode.VERIFICATION_REQUIRED
    assert "t0" in refusal.detail  # fail closed: t0 must be queried again

    memory.apply(_event(400, MemoryQueried(topic="t0"), agent_id="a"), bounded=True)
    assert check(memory, booking, "a", "") is None
    assert "t300" not in kept and f"t{300 - QUERIED_TOPICS}" not in kept  # the oldest went


def test_which_topic_goes_depends_on_seqs_not_on_the_order_a_snapshot_restored() -> None:
    forward, backward = MemoryState(), MemoryState()
    seqs = {f"t{n}": 10 + n for n in range(QUERIED_TOPICS)}
    forward.queried["a"] = dict(seqs)
    backward.queried["a"] = dict(reversed(seqs.items()))
    for state in (forward, backward):
        state.apply(_event(999, MemoryQueried(topic="new"), agent_id="a"), bounded=True)
    assert forward.queried == backward.queried
    assert "t0" not in forward.queried["a"] and "new" in forward.queried["a"]


@pytest.mark.parametrize("bounded", [True, False])
def test_a_trees_queries_go_when_its_root_has_ended(bounded: bool) -> None:
    projections = Projections()
    events = [
        _event(1, KernelStarted(kernel_version="t", fold=2 if bounded else 1)),
        _event(2, FlowCreated(root_dfid="R"), dfid="R", agent_id="a"),
        _event(3, FlowCreated(root_dfid="R"), dfid="C", agent_id="b"),
        _event(4, MemoryQueried(topic="access", correlation_id="R"), agent_id="a"),
    ]
    projections.apply(events)
    assert projections.memory.queried["R"] == {"access": 4}
    projections.apply([_event(5, FlowAborted(reason_code=ReasonCode.AGENT_DECLINED), dfid="R")])
    # The child still moving must query again: its tree's earlier queries no longer count.
    assert ("R" in projections.memory.queried) is not bounded
    projections.apply([_event(6, MemoryQueried(topic="again", correlation_id="R"), agent_id="b")])
    assert "again" in projections.memory.queried["R"]
    projections.apply([_event(7, FlowAborted(reason_code=ReasonCode.AGENT_DECLINED), dfid="C")])
    assert ("R" in projections.memory.queried) is not bounded
    assert "a" in projections.memory.queried and "b" in projections.memory.queried
