"""A single action's success and its flow's end: one row, both events for every reader.

Issue 35's third lever. The engine records a single action's ExecutionSucceeded with
``closes`` set and no FlowClosed row; every reader of the journal (reads, scans, listeners,
subscriptions, folds, verify, followers, narratives, spans) gets the FlowClosed it stands
for right after it, as before. Journals written before (both rows) read as they did.
"""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel import FlowStatus
from kernel.audit import open_journal, verify_journal
from kernel.audit.narrative import narrate
from kernel.cli import main as dirk_main
from kernel.core.events import (
    Event,
    ExecutionSucceeded,
    FlowClosed,
    TriggerFired,
    closing_of,
    with_derived,
)
from kernel.journal.follow import follow_journal
from tests.support import ROOT
from tests.support.helpers import ScriptedAgent, kernel_for

GOLDEN = ROOT / "tests" / "golden"


def row_types(path: Path, dfid: str) -> list[str]:
    with closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT type FROM events WHERE dfid = ? ORDER BY seq", (dfid,))
        return [t for (t,) in rows]


async def test_a_single_action_stores_one_row_and_every_reader_sees_its_flow_closed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "j.db"
    heard: list[Event] = []
    async with kernel_for(path) as kernel:
        kernel.journal.add_listener(heard.extend)
        async with kernel.journal.subscribe(kernel.journal.head_seq + 1) as sub:
            await kernel.register(ScriptedAgent())
            [dfid] = await kernel.trigger("bank.invoice")
            assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
            events = await kernel.journal.read(dfid=dfid)
            followed: list[Event] = []
            async for batch in sub:
                followed += [e for e in batch if e.dfid == dfid]
                if any(type(e.payload) is FlowClosed for e in followed):
                    break
        [closed] = await kernel.journal.read(dfid=dfid, types=["FlowClosed"])
        [only] = await kernel.journal.read(types=["FlowClosed"])

    assert "FlowClosed" not in row_types(path, dfid)
    succeeded, derived = events[-2:]
    assert isinstance(succeeded.payload, ExecutionSucceeded) and succeeded.payload.closes
    assert isinstance(derived.payload, FlowClosed)
    assert (derived.seq, derived.ts, derived.caused_by) == (
        succeeded.seq,
        succeeded.ts,
        succeeded.seq,
    )
    assert (derived.dfid, derived.agent_id) == (succeeded.dfid, succeeded.agent_id)
    assert closed == only == derived
    assert [e for e in heard if e.dfid == dfid] == events
    assert followed == events

    # Verify folds what readers see; a reopened kernel folds the flow closed again.
    assert (await verify_journal(path)).ok
    async with kernel_for(path) as kernel:
        again = kernel.flow(dfid)
        assert again is not None and again.status is FlowStatus.CLOSED
    async with open_journal(path, readonly=True) as journal:
        scanned = [e for batch in [b async for b in journal.scan()] for e in batch]
        assert [e for e in scanned if e.dfid == dfid] == events
    tail: list[Event] = []
    with anyio.move_on_after(10):
        async for batch in follow_journal(path):
            tail += batch
            if derived.seq in [e.seq for e in tail if type(e.payload) is FlowClosed]:
                break
    assert [e for e in tail if e.dfid == dfid] == events
    assert narrate(derived) == narrate(closing_of(succeeded))
    assert await anyio.to_thread.run_sync(dirk_main, ["show", dfid, "--db", str(path)]) == 0
    assert "CLOSED" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.glob("*.db")))
async def test_old_journals_keep_both_rows_and_get_no_second_flow_closed(
    name: str, tmp_path: Path
) -> None:
    # Read on a copy: opening a journal leaves -wal and -shm files beside it, and the golden
    # directory holds only what is checked in.
    beside = sorted(p.name for p in GOLDEN.iterdir())
    path = tmp_path / name
    shutil.copyfile(GOLDEN / name, path)
    async with open_journal(path, readonly=True) as journal:
        events = [e for batch in [b async for b in journal.scan()] for e in batch]
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT COUNT(*) FROM events WHERE type = 'FlowClosed'").fetchone()[0]
    assert sum(type(e.payload) is FlowClosed for e in events) == rows
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert sorted(p.name for p in GOLDEN.iterdir()) == beside


def _event(seq: int, payload: ExecutionSucceeded | TriggerFired) -> Event:
    return Event(seq=seq, ts=seq, payload=payload, dfid=f"f{seq}", hash=f"{seq:064x}")


@given(
    st.lists(
        st.sampled_from(["closes", "succeeds", "other"]),
        max_size=12,
    )
)
def test_derived_events_follow_their_rows_once(kinds: list[str]) -> None:
    payloads: dict[str, ExecutionSucceeded | TriggerFired] = {
        "closes": ExecutionSucceeded(key="k", closes=True),
        "succeeds": ExecutionSucceeded(key="k"),
        "other": TriggerFired(topic="t"),
    }
    events = [_event(n + 1, payloads[kind]) for n, kind in enumerate(kinds)]
    derived = with_derived(events)
    # Each closing success is followed by its FlowClosed, and nothing else moves.
    assert [e for e in derived if type(e.payload) is not FlowClosed] == events
    assert [e.seq for e in derived if type(e.payload) is FlowClosed] == [
        e.seq for e, kind in zip(events, kinds, strict=True) if kind == "closes"
    ]
    for index, event in enumerate(derived):
        if type(event.payload) is FlowClosed:
            assert derived[index - 1].seq == event.seq
    assert with_derived(derived) == derived  # handed on twice, derived once
    assert (derived is events) == ("closes" not in kinds)
