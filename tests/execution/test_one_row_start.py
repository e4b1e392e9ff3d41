"""A submission, its acceptance and the start of its execution: one row, three events.

Issue 45's fourth lever. When the DIM accepts a proposal and starts its execution in the
same append with nothing recorded between them, the ProposalAccepted carries the intent
(``ProposalAccepted.start``) and stores no ExecutionStarted row; when it judged the
proposal with nothing recorded since its submission, the ProposalSubmitted row carries
that acceptance too (``ProposalSubmitted.accepted``). Every reader gets the events a row
stands for right after it. With something recorded between (a reservation, say) the
start keeps its own row. A P1 flow is then three rows for its seven events.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from kernel import FlowStatus
from kernel.audit import open_journal, verify_journal
from kernel.audit.narrative import narrate
from kernel.cli import main as dirk_main
from kernel.core.carrying import derived_chain
from kernel.core.events import (
    Event,
    ExecutionStarted,
    ExecutionSucceeded,
    ProposalAccepted,
    ProposalSubmitted,
    derived_of,
    is_derived,
    with_derived,
)
from kernel.journal.store import SCHEMA_VERSION
from tests.execution.test_one_row_close import row_types
from tests.support.execution_domain import Desk, Trip, agent, desk_kernel
from tests.support.helpers import ScriptedAgent, kernel_for


async def test_an_acceptance_carries_its_start_in_one_row_and_every_reader_sees_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "j.db"
    heard: list[Event] = []
    async with kernel_for(path) as kernel:
        kernel.journal.add_listener(heard.extend)
        await kernel.register(ScriptedAgent())
        [dfid] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        events = await kernel.journal.read(dfid=dfid)
        [started] = await kernel.journal.read(dfid=dfid, types=["ExecutionStarted"])
        [succeeded] = await kernel.journal.read(dfid=dfid, types=["ExecutionSucceeded"])
        verdicts = await kernel.journal.read(dfid=dfid, types=["ProposalAccepted"])

    assert row_types(path, dfid) == ["FlowCreated", "ProposalSubmitted", "ExecutionSucceeded"]
    assert [e.type for e in events] == [
        "FlowCreated",
        "ContextCompiled",
        "ProposalSubmitted",
        "ProposalAccepted",
        "ExecutionStarted",
        "ExecutionSucceeded",
        "FlowClosed",
    ]
    submitted, accepted = events[2], events[3]
    assert isinstance(submitted.payload, ProposalSubmitted) and not is_derived(submitted)
    assert submitted.payload.accepted == accepted.payload and is_derived(accepted)
    assert isinstance(accepted.payload, ProposalAccepted) and accepted.payload.start is not None
    assert derived_chain(submitted) == [accepted, started]
    assert started == events[4] and is_derived(started)
    assert isinstance(started.payload, ExecutionStarted)
    assert started.payload.intent == accepted.payload.start
    for derived in (accepted, started):
        assert (derived.seq, derived.ts, derived.hash) == (
            submitted.seq,
            submitted.ts,
            submitted.hash,
        )
        assert (derived.dfid, derived.agent_id) == (submitted.dfid, submitted.agent_id)
        assert derived.caused_by == submitted.seq
    # The success is caused by the start, as it was when the start had a row of its own.
    assert isinstance(succeeded.payload, ExecutionSucceeded)
    assert succeeded.caused_by == started.seq
    assert [e for e in heard if e.dfid == dfid] == events
    assert verdicts == [accepted]  # a read by type gets what a row stands for, only that

    # Verify folds what readers see; a reopened kernel folds the flow closed again.
    assert (await verify_journal(path)).ok
    async with kernel_for(path) as kernel:
        again = kernel.flow(dfid)
        assert again is not None and again.status is FlowStatus.CLOSED and again.pending is None
    async with open_journal(path, readonly=True) as journal:
        scanned = [e for batch in [b async for b in journal.scan()] for e in batch]
        assert [e for e in scanned if e.dfid == dfid] == events
    assert narrate(started) == narrate(derived_of(accepted))  # type: ignore[arg-type]
    assert await anyio.to_thread.run_sync(dirk_main, ["show", dfid, "--db", str(path)]) == 0
    assert "CLOSED" in capsys.readouterr().out
    with closing(sqlite3.connect(path)) as db:
        ((version,),) = db.execute("SELECT value FROM meta WHERE key = 'schema_version'")
    assert version == SCHEMA_VERSION == "5"  # an older kernel refuses it by name


async def test_a_start_with_something_recorded_before_it_keeps_its_own_row(
    tmp_path: Path,
) -> None:
    """A saga's later step starts after its first succeeded: a row of its own."""
    desk = Desk()
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        await kernel.register(agent(Trip(legs=["flight", "hotel"])))
        [dfid] = await kernel.trigger("desk.go")
        flow = await kernel.wait_flow(dfid)
        events = await kernel.journal.read(dfid=dfid)
        started = await kernel.journal.read(dfid=dfid, types=["ExecutionStarted"])
        closed_seq = next(e.seq for e in events if e.type == "FlowClosed")
        # A page that asks for what a row may stand for, where none stands for it yet.
        before_close = await kernel.journal.read(
            dfid=dfid, types=["FlowClosed"], stop=closed_seq - 1
        )
        accepted_only = await kernel.journal.read(dfid=dfid, types=["ProposalAccepted"])
    assert (flow.status, flow.done) == (FlowStatus.CLOSED, 2)
    assert [is_derived(e) for e in started] == [True, False]
    assert all(type(e.payload) is ExecutionStarted for e in started)
    assert before_close == []
    assert [e.type for e in accepted_only] == ["ProposalAccepted"]
    assert with_derived(events) == events  # read once, derived once
