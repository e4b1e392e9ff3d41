"""Outbox.carry: one actor's staged batch recorded in another's append (two commits per flow).

The compiler's events travel to the DIM (kernel.runtime.messages.Carry) and are recorded
in its append, ahead of the proposal, verdict and intent staged on them: their causes
must still name the right events, the flows they open must be what the DIM stages on,
and a flow that moved since the compiler staged it must be refused, never recorded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel.audit import open_journal, verify_journal
from kernel.core.events import ContextCompiled, FlowAborted, FlowCreated, TriggerFired
from kernel.core.flow import FlowStatus, IllegalTransition
from kernel.core.ports import ManualClock
from kernel.core.reasons import ReasonCode
from kernel.runtime.actors import Outbox
from kernel.state.projections import Projections


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
