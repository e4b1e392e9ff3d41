"""A live kernel: a pack's refusal monitor demotes a drifting agent; an operator restores it.

The clerk pays invoices; mid-run its invoices go bad (amount 0, refused by the pack's
Range invariant), its refusal rate climbs past the monitor's bound, and the drift watch
records the breach and demotes it to PASSIVE. The breach is a pure function of the
journal: evaluated again from the file, it is found again, identically.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from kernel import FlowStatus, Kernel
from kernel.audit import open_journal, payloads
from kernel.core.events import AgentStatusChanged, DriftBreached, Event
from kernel.policy.monitors import Monitor
from kernel.state.drift import OPERATOR, monitors_of, reevaluate, unproven
from kernel.state.records import AgentStatus
from kernel.testing import ManualClock
from tests.cli.test_operator_admin import dirk
from tests.support.approvals_domain import pack, pay_kernel, sender

pytestmark = pytest.mark.anyio

REFUSALS = Monitor(
    name="refusals",
    metric="refusal_rate",
    window_s=600,
    bound=0.3,
    min_samples=8,
    action="demote",
)

PACK_SPEC = "tests.drift.test_live:WATCHED"
WATCHED = pack(monitors=(REFUSALS,))
"""The payments pack with the refusal monitor (``dirk verify --pack`` loads it by name)."""


async def pay(kernel: Kernel, clock: ManualClock, cents: int) -> FlowStatus | None:
    """One invoice, ten seconds on; None when no flow opened (a PASSIVE agent gets none)."""
    clock.advance(10)
    opened = await kernel.trigger(f"pay.{cents}")
    return (await kernel.wait_flow(opened[0])).status if opened else None


def status(kernel: Kernel) -> AgentStatus:
    return kernel.projections.agents["clerk"].status


async def first(kernel: Kernel, kind: type[object], from_seq: int = 1) -> Event:
    """The first committed event of a type from ``from_seq`` on (history, then live)."""
    with anyio.fail_after(10):
        async with kernel.journal.subscribe(from_seq) as batches:
            async for batch in batches:
                for event in batch:
                    if isinstance(event.payload, kind):
                        return event
    raise AssertionError("the journal ended")


async def test_a_drifting_agent_is_demoted_then_restored_by_an_operator(tmp_path: Path) -> None:
    clock = ManualClock()
    path = tmp_path / "j.db"
    async with pay_kernel(path, [WATCHED], clock=clock) as kernel:
        await kernel.register(sender())
        for _ in range(10):
            assert await pay(kernel, clock, 100) is FlowStatus.CLOSED
        for _ in range(8):  # the invoices go bad: refused
            await pay(kernel, clock, 0)
        breached = await first(kernel, DriftBreached)
        demoted = await first(kernel, AgentStatusChanged)
        breach = breached.payload
        assert isinstance(breach, DriftBreached) and breach.subject == "clerk"
        assert breach.value > REFUSALS.bound and breach.samples >= REFUSALS.min_samples  # type: ignore[operator]
        assert isinstance(demoted.payload, AgentStatusChanged)
        assert demoted.payload.status == AgentStatus.PASSIVE
        assert demoted.payload.operator == OPERATOR and demoted.agent_id == "clerk"
        assert status(kernel) is AgentStatus.PASSIVE

        # ``dirk agents`` says who demoted it, and how to restore it.
        code, out, err = await dirk("agents", "--db", path)
        assert code == 0, err
        assert "clerk 1.0.0: PASSIVE  (demoted by a drift monitor: drift monitor refusals" in out
        assert "  restore: dirk agent clerk --set ACTIVE" in out

        # The operator looks, rolls the model back, and restores the agent.
        await kernel.set_agent_status("clerk", "ACTIVE", operator="ana", reason="model rolled back")
        assert status(kernel) is AgentStatus.ACTIVE
        assert await pay(kernel, clock, 100) is FlowStatus.CLOSED

    # Read again from the file, the window gives the same breach.
    async with open_journal(path) as journal:
        events = await journal.read()
    [recorded] = payloads(events, DriftBreached)
    assert recorded == breach
    assert reevaluate(recorded, REFUSALS, events)
    assert unproven(events, monitors_of([WATCHED])) == []

    # ``dirk agent`` shows the breach, in words and as JSON.
    code, out, err = await dirk("agent", "clerk", "--db", path)
    assert code == 0, err
    assert f"drift refusals: refusal_rate {breach.value:g} crossed 0.3 (seq {breached.seq}" in out
    code, out, err = await dirk("agent", "clerk", "--db", path, "--json")
    shown = json.loads(out)["drift"]["refusals"]
    assert code == 0 and shown["seq"] == breached.seq and shown["action"] == "demote"

    # ``dirk agents`` lists it beside the agent's status, in words and as JSON.
    code, out, err = await dirk("agents", "--db", path)
    assert code == 0, err
    assert f"  drift refusals: refusal_rate {breach.value:g} crossed 0.3 (seq {breached.seq}" in out
    code, out, err = await dirk("agents", "--db", path, "--json")
    [row] = json.loads(out)
    assert row["status"] == "ACTIVE" and row["drift"]["refusals"]["seq"] == breached.seq

    # ``dirk verify --verdicts`` re-derives the breach from the journal.
    code, out, err = await dirk("verify", "--db", path, "--verdicts", "--pack", PACK_SPEC)
    assert code == 0, out + err
    assert "verify: drift breaches ok: 1 of 1 re-derived" in out


async def test_a_kernel_without_monitors_records_no_drift(tmp_path: Path) -> None:
    clock = ManualClock()
    async with pay_kernel(tmp_path / "j.db", clock=clock) as kernel:
        await kernel.register(sender())
        for _ in range(10):
            await pay(kernel, clock, 0)
        events = await kernel.journal.read()
        assert not payloads(events, DriftBreached)
        assert not payloads(events, AgentStatusChanged)
        assert status(kernel) is AgentStatus.ACTIVE
