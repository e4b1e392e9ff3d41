"""Outbox.carry: one actor's staged batch recorded in another's append (two commits per flow).

The compiler's events travel to the DIM (kernel.runtime.messages.Carry) and are recorded
in its append, ahead of the proposal, verdict and intent staged on them: their causes
must still name the right events, the flows they open must be what the DIM stages on,
and a flow that moved since the compiler staged it must be refused, never recorded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from kernel.audit import open_journal, verify_journal
from kernel.core.carrying import derived_chain
from kernel.core.events import (
    ContextCompiled,
    FlowAborted,
    FlowClosed,
    FlowCreated,
    TriggerFired,
    is_derived,
)
from kernel.core.flow import FlowState, FlowStatus, IllegalTransition
from kernel.core.flow import apply as flow_apply
from kernel.core.ports import ManualClock
from kernel.core.reasons import ReasonCode
from kernel.runtime.actors import Outbox
from kernel.state.projections import Projections
from tests.support.helpers import ScriptedAgent, kernel_for


def compiler_batch(projections: Projections, dfid: str) -> Outbox:
    """What the compiler stages for one trigger waking one agent."""
    out = Outbox(projections, ManualClock())
    trigger = out.emit(TriggerFired(topic="bank.invoice"))
    out.emit(
        FlowCreated(root_dfid=dfid, topic="bank.invoice"),
        dfid=dfid,
        agent_id="clerk",
        after=trigger,
    )
    out.emit(ContextCompiled(attempt=1, context_ref="ref-1"), dfid=dfid)
    return out


async def test_carried_events_keep_their_causes_and_open_their_flows_for_the_carrier(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    async with open_journal(path) as journal:
        projections = Projections()
        journal.add_listener(projections.apply)
        await journal.append([compiler_batch(projections, "other").drafts[0]])  # seqs move on
        compiler = compiler_batch(projections, "f-1")
        dim = Outbox(projections, ManualClock())
        dim.emit(TriggerFired(topic="before"))  # the carrier's own events come first
        start = dim.carry(compiler.drafts, compiler.opened)
        assert start == 1
        assert dim.flow("f-1") == compiler.flow("f-1")
        # What the carrier stages next is caused by the carried context, as in one batch.
        dim.emit(FlowAborted(reason_code=ReasonCode.AGENT_DECLINED, detail="no"), dfid="f-1")
        committed = await journal.append(dim.drafts)
        events = await journal.read(dfid="f-1")
    by_type = {e.type: e for e in committed}
    assert by_type["FlowCreated"].caused_by == by_type["TriggerFired"].seq
    assert by_type["ContextCompiled"].caused_by == by_type["FlowCreated"].seq
    assert by_type["FlowAborted"].caused_by == by_type["ContextCompiled"].seq
    assert [e.type for e in events] == ["FlowCreated", "ContextCompiled", "FlowAborted"]
    assert projections.flows["f-1"].status is FlowStatus.ABORTED
    assert (await verify_journal(path)).ok


async def test_a_carried_event_on_a_flow_that_ended_since_is_refused_and_rolled_back(
    tmp_path: Path,
) -> None:
    async with open_journal(tmp_path / "j.db") as journal:
        projections = Projections()
        journal.add_listener(projections.apply)
        await journal.append(compiler_batch(projections, "f-1").drafts)
        # The compiler stages the next attempt's context; an operator ends the flow first.
        compiler = Outbox(projections, ManualClock())
        compiler.emit(ContextCompiled(attempt=2, context_ref="ref-2"), dfid="f-1")
        ended = Outbox(projections, ManualClock())
        ended.emit(FlowAborted(reason_code=ReasonCode.AGENT_DECLINED, detail="no"), dfid="f-1")
        await journal.append(ended.drafts)
        dim = Outbox(projections, ManualClock())
        dim.begin()
        with pytest.raises(IllegalTransition):
            dim.carry(compiler.drafts, compiler.opened)
        dim.rollback()
        assert compiler.opened == {}
        assert dim.drafts == []
        assert dim.flow("f-1") == projections.flows["f-1"]


async def test_a_row_made_to_stand_for_the_next_event_folds_as_its_readers_will(
    tmp_path: Path,
) -> None:
    """Outbox.travel_with: the overlay after each carried event is the flow readers fold.

    A P1 flow's seven events, as its readers get them, staged again on a fresh batch: its
    rows by ``emit``, each derived event by ``travel_with`` on the row before it. The flow
    the batch stages on after each step is the flow its readers fold from the same events
    (times and seqs aside: a batch's are provisional until the journal numbers them).
    """
    path = tmp_path / "j.db"
    async with kernel_for(path) as kernel:
        await kernel.register(ScriptedAgent())
        [dfid] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        events = await kernel.journal.read(dfid=dfid)
    out = Outbox(Projections(), ManualClock())
    folded: FlowState | None = None
    carried = staged_with_row = 0
    for event in events:
        if staged_with_row:
            staged_with_row -= 1  # folded with its row (a closing success's FlowClosed)
            continue
        if is_derived(event):
            assert out.travel_with(dfid, bare(event.payload)) is not None, event.type
            carried += 1
            folded = flow_apply(folded, event)
        else:
            # A row as first staged: standing for none of what it is made to carry later,
            # but for what it carries as it is staged (a closing success its FlowClosed).
            row = replace(event, payload=bare(event.payload))
            out.emit(row.payload, dfid=dfid, agent_id=event.agent_id)
            for step in [event, *derived_chain(row)]:
                folded = flow_apply(folded, step)
            staged_with_row = len(derived_chain(row))
        assert timeless(out.flow(dfid)) == timeless(folded), event.type
    assert carried == 3 and folded is not None and folded.status is FlowStatus.CLOSED
    # The rows staged are the rows recorded.
    assert [d.payload for d in out.drafts] == [e.payload for e in events if not is_derived(e)]


def bare(payload: Any) -> Any:
    """``payload`` as an actor first stages it, before any event travels with it."""
    for field, empty in (("context", None), ("accepted", None), ("start", None)):
        if getattr(payload, field, empty) is not empty and not isinstance(payload, FlowClosed):
            payload = replace(payload, **{field: empty})
    return payload


def timeless(state: FlowState | None) -> FlowState | None:
    """``state`` without its times and seq (a batch's are provisional)."""
    if state is None:
        return None
    return replace(state, created_ts=0, updated_ts=0, last_seq=0)
