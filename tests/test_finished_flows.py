"""Finished flows leave the canonical state; the live kernel keeps only the latest in memory.

The digest must not depend on how many finished flows a kernel keeps, and a
request naming a flow it forgot must be answered from the record as before.
"""

from __future__ import annotations

from pathlib import Path

from kernel import FlowStatus, Kernel, Outcome
from kernel.audit import fold
from kernel.core.reasons import ReasonCode
from kernel.testing import action_of, flow_types
from tests.support.helpers import Bank, ScriptedAgent, kernel_for, transfer


async def close_flows(kernel: Kernel, count: int) -> list[str]:
    """Trigger ``count`` flows one after the other and let each close."""
    dfids = []
    for _ in range(count):
        [dfid] = await kernel.trigger("bank.invoice")
        await kernel.wait_quiet()
        dfids.append(dfid)
    return dfids


async def test_only_the_latest_finished_flows_stay_in_memory(tmp_path: Path) -> None:
    async with kernel_for(tmp_path / "j.db", keep_finished=2) as kernel:
        await kernel.register(ScriptedAgent())
        dfids = await close_flows(kernel, 5)
        assert [f.dfid for f in kernel.flows()] == dfids[-2:]
        assert kernel.flow(dfids[0]) is None
        assert kernel.finished() == {FlowStatus.CLOSED: 5}
        folded = fold(await kernel.journal.read())
        # A fold from scratch keeps every flow; the digest does not see the difference.
        assert len(folded.flows) == 5
        assert folded.digest() == kernel.projections.digest()
        # An older flow is read back from the journal, whole.
        assert await kernel.wait_flow(dfids[0]) == folded.flows[dfids[0]]


async def test_a_repeated_submission_on_a_forgotten_flow_is_answered_from_the_record(
    tmp_path: Path,
) -> None:
    bank = Bank()
    async with kernel_for(tmp_path / "j.db", bank=bank, keep_finished=0) as kernel:
        agent = ScriptedAgent()
        session = await kernel.register(agent)
        first, _ = await close_flows(kernel, 2)
        assert kernel.flow(first) is None and kernel.projections.flows == {}
        closed = fold(await kernel.journal.flow_events(first)).flows[first]

        proposal = transfer()(agent.contexts[0])
        assert proposal is not None
        again = await kernel.submit(session.token, first, proposal)
        assert again.outcome is Outcome.DUPLICATE
        assert again.external_id == closed.external_id
        assert len(bank.calls) == 2  # one effect per flow, none for the repeat
        assert (await flow_types(kernel, first))[-1] == "DuplicateSuppressed"

        late = await kernel.decide(
            first, "approve", operator="ana", reason="late", action_hash=action_of(kernel, first)
        )
        assert late.outcome is Outcome.REFUSED
        assert late.feedback is not None
        assert late.feedback.reason_code is ReasonCode.FLOW_NOT_ACTIVE
        assert "CLOSED" in late.feedback.detail

        # Notes on a finished flow never reach the canonical state, kept or not.
        folded = fold(await kernel.journal.read())
        assert folded.digest() == kernel.projections.digest()
        assert folded.finished == {FlowStatus.CLOSED: 2}


async def test_reopening_keeps_the_counts_and_the_rolling_hash(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with kernel_for(path, checkpoint_every=5, keep_finished=1) as kernel:
        await kernel.register(ScriptedAgent())
        dfids = await close_flows(kernel, 4)
        before = kernel.projections.snapshot()
    async with kernel_for(path, keep_finished=1) as kernel:
        # Restored from a snapshot plus its tail: the finished flows are counts and a hash.
        now = kernel.projections.snapshot()
        assert now["finished"] == before["finished"] == {FlowStatus.CLOSED: 4}
        assert now["finished_hash"] == before["finished_hash"] != ""
        assert kernel.projections.digest() == fold(await kernel.journal.read()).digest()
        assert (await kernel.wait_flow(dfids[0])).status is FlowStatus.CLOSED
