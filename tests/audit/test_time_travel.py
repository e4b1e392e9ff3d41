"""Time travel, projection checkpoints and snapshots."""

from __future__ import annotations

import json
import random
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel import FlowStatus
from kernel.audit import fold, open_journal, payload_of
from kernel.cli import main
from kernel.core.events import ProjectionCheckpoint
from kernel.state.snapshots import (
    ProjectedState,
    checkpoints,
    retained,
    state_at,
    trusted_snapshot,
    verify_projections,
)
from tests.audit.test_replay import RandomAgent
from tests.support.helpers import kernel_for


async def record(path: Path, *, every: int = 25, triggers: int = 40, seed: int = 5) -> None:
    """Let a kernel write a journal with checkpoints every ``every`` events."""
    rng = random.Random(seed)
    async with kernel_for(path, checkpoint_every=every) as kernel:
        for name in ("clerk", "other"):
            await kernel.register(RandomAgent(name, seed))
        for i in range(triggers):
            await kernel.trigger(rng.choice(["bank.all", "bank.clerk"]), {f"bank.n{i % 7}": i})
            await kernel.wait_quiet()
        for flow in kernel.flows(FlowStatus.ESCALATED):
            await kernel.decide(flow.dfid, "abort", operator="ana", reason="test")
        await kernel.wait_quiet()


async def test_state_at_every_tenth_seq_equals_the_fold_of_the_prefix(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    await record(path)
    async with open_journal(path, readonly=True) as journal:
        events = await journal.read()
        points = await checkpoints(journal)
        assert len(points) >= 4  # snapshots are in play below, not only full replays
        for seq in range(10, journal.head_seq + 1, 10):
            at = await state_at(journal, seq)
            prefix = fold([e for e in events if e.seq <= seq])  # a seq may hold two events
            assert at.last_seq == seq
            assert at.digest() == prefix.digest()
            # Finished flows are counts and a hash in the state; the open ones are whole.
            assert at.open_flows() == prefix.open_flows() and at.memory == prefix.memory
            assert at.finished == prefix.finished and at.finished_hash == prefix.finished_hash
        # The whole journal, from the latest snapshot plus its tail, equals a full fold.
        assert (await state_at(journal, None)).digest() == fold(events).digest()
        report = await verify_projections(journal)
        stored = await journal.snapshot_seqs()
    assert report.ok, report.problems
    # Every checkpoint is checked; old snapshots were thinned out as the journal grew.
    assert report.checkpoints == len(points)
    # (The kernel may close between a checkpoint and the thinning after it.)
    assert retained([p.seq for p in points], 25) <= set(stored)
    assert report.snapshots == len(stored) < len(points)
    assert stored[-1] == points[-1].seq


async def test_each_checkpoint_is_the_digest_of_the_state_it_names(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    await record(path, triggers=20)
    async with open_journal(path, readonly=True) as journal:
        events = await journal.read()
    recorded = [e for e in events if isinstance(e.payload, ProjectionCheckpoint)]
    assert recorded
    for event in recorded:
        point = payload_of(event, ProjectionCheckpoint)
        assert point.seq < event.seq  # written after the state it describes, by the kernel
        assert event.dfid is None and event.agent_id is None
        assert fold([e for e in events if e.seq <= point.seq]).digest() == point.digest


def tamper(path: Path, seq: int) -> None:
    """Change one flow's status inside the snapshot of ``seq``, leaving its digest column."""
    with closing(sqlite3.connect(path)) as db:
        ((body,),) = db.execute("SELECT body FROM snapshots WHERE seq = ?", (seq,))
        # The saved state's fields are made at run time from the domains: Any to mypy.
        state: Any = msgspec.msgpack.decode(body, type=ProjectedState)
        dfid, flow = next(iter(state.flows.items()))
        state.flows[dfid] = msgspec.structs.replace(flow, external_id="forged")
        db.execute(
            "UPDATE snapshots SET body = ? WHERE seq = ?", (msgspec.msgpack.encode(state), seq)
        )
        db.commit()


async def test_a_tampered_snapshot_is_reported_and_never_loaded(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    await record(path)
    async with open_journal(path, readonly=True) as journal:
        points = await checkpoints(journal)
        honest = await trusted_snapshot(journal)
    latest = points[-1].seq
    assert honest is not None and honest.last_seq == latest
    tamper(path, latest)

    async with open_journal(path, readonly=True) as journal:
        report = await verify_projections(journal)
        fallback = await trusted_snapshot(journal)
        events = await journal.read()
    assert not report.ok
    assert report.problems == [f"at seq {latest}: snapshot does not match replay"]
    # The tampered one is skipped: the one before it is used instead.
    assert fallback is not None and fallback.last_seq == points[-2].seq

    async with kernel_for(path, checkpoint_every=0) as kernel:
        assert kernel.projections.open_flows() == fold(events).open_flows()
        assert kernel.projections.digest() == fold(await kernel.journal.read()).digest()
        assert all(f.external_id != "forged" for f in kernel.projections.flows.values())


async def test_reopening_from_a_snapshot_equals_the_full_fold(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    await record(path)
    async with kernel_for(path) as kernel:
        events = await kernel.journal.read()
        # Everything but the KernelStarted this run appended came from snapshot + tail.
        folded = fold(events)
        assert kernel.projections.open_flows() == folded.open_flows()
        assert kernel.projections.digest() == folded.digest()
        # Flows that ended before the snapshot are not in memory; the journal answers.
        assert len(kernel.projections.flows) < len(folded.flows)
        for dfid, flow in folded.flows.items():
            assert await kernel.wait_flow(dfid, until=[flow.status]) == flow


def test_dirk_state_at_and_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "j.db"
    anyio.run(record, path)
    assert main(["state", "--db", str(path), "--at", "30"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert state["last_seq"] == 30
    assert set(state) >= {"flows", "finished", "finished_hash", "agents", "state", "memory"}

    assert main(["verify", "--db", str(path)]) == 0
    out = capsys.readouterr().out
    assert "checkpoints" in out and "snapshots match replay" in out

    async def latest() -> int:
        async with open_journal(path, readonly=True) as journal:
            return (await checkpoints(journal))[-1].seq

    tamper(path, anyio.run(latest))
    assert main(["verify", "--db", str(path)]) == 1
    assert "snapshot does not match replay" in capsys.readouterr().out
    assert main(["state", "--db", str(path), "--at", "999999"]) == 1


@given(st.integers(1, 300), st.integers(1, 50), st.randoms(use_true_random=False))
def test_snapshots_thin_out_to_about_two_per_doubling_of_age(
    n: int, every: int, rng: random.Random
) -> None:
    """Thinning after each checkpoint keeps the same set as thinning once at the end."""
    seqs: list[int] = []
    kept: set[int] = set()
    for number in range(1, n + 1):
        seq = number * every + rng.randrange(every)  # a checkpoint lands a batch late
        seqs.append(seq)
        kept = retained(sorted(kept | {seq}), every)
        assert seq in kept
    assert kept == retained(seqs, every)
    assert len(kept) <= 2 * n.bit_length() + 1
    assert sorted(seqs)[-2:] == sorted(kept)[-2:]
    # Time travel to any checkpoint starts from a snapshot at most about twice its age back.
    for i, seq in enumerate(seqs):
        age = n - 1 - i
        start = max(s for s in kept | {0} if s <= seq)
        assert (seq - start) // every <= 2 * age + 2
