"""One verdict function: the live DIM and its replay judge through kernel.dim.verdict.verdict.

Every recorded verdict of mixed workloads (the golden journals, the re-judging
workload, needs-human escalations, an agent made passive by an unsettled saga)
equals what the function returns against the projections folded up to the
submission, in full: layer, rule, field, limit, detail and pack hash, not only
the outcome and reason code ``dirk verify --verdicts`` compares. And a layer
added inside the function shows up in both paths.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest

import kernel.audit.reverify
import kernel.dim._actor
import kernel.dim.verdict
from examples import desk
from examples.desk_0_1 import DESK_0_1
from kernel import FlowStatus, ReasonCode
from kernel.adapters import AdapterError
from kernel.audit import Projections, open_journal
from kernel.audit.reverify import rejudge
from kernel.core.events import (
    Event,
    FlowAborted,
    FlowEscalated,
    ProposalAccepted,
    ProposalRejected,
    ProposalSubmitted,
)
from kernel.dim import Judgement, reject
from kernel.dim.verdict import verdict
from kernel.memory import MEMORY_PACK
from kernel.policy.packs import PolicyCatalog, PolicyPack
from policies.booking import BOOKING
from policies.booking_0_1 import BOOKING_0_1
from policies.memory_1_0 import MEMORY_PACK_1_0
from policies.trading import TRADING
from policies.trading_0_2 import TRADING_0_2
from policies.trading_0_3 import TRADING_0_3
from tests.audit import test_verdicts
from tests.audit.test_golden import GOLDEN
from tests.escalation import test_escalation as gov
from tests.support.execution_domain import DESK, Desk, Ping, Trip, desk_kernel
from tests.support.execution_domain import agent as clerk_agent
from tests.support.helpers import PACK

Recorded = ProposalAccepted | ProposalRejected | FlowEscalated


def _recorded_verdicts(events: list[Event]) -> dict[int, Recorded]:
    """Map the seq of each ProposalSubmitted to the verdict recorded for it."""
    waiting: dict[str, int] = {}
    found: dict[int, Recorded] = {}
    for event in events:
        payload, dfid = event.payload, event.dfid or ""
        if isinstance(payload, ProposalSubmitted):
            waiting[dfid] = event.seq
        elif isinstance(payload, Recorded) and dfid in waiting:
            found[waiting.pop(dfid)] = payload
        elif isinstance(payload, FlowAborted):
            waiting.pop(dfid, None)
    return found


def _as_recorded(judgement: Judgement) -> tuple[Any, ...]:
    if judgement.rejection is not None:
        return ("rejected", judgement.rejection, judgement.pack)
    if judgement.escalation is not None:
        f = judgement.escalation
        return ("escalated", f.reason_code, f.detail, f.rule, judgement.pack)
    return ("accepted", judgement.pack)


def _of(payload: Recorded) -> tuple[Any, ...]:
    match payload:
        case ProposalRejected(feedback=f, pack=pack):
            return ("rejected", f, pack)
        case FlowEscalated(reason_code=code, detail=detail, rule=rule, pack=pack):
            return ("escalated", code, detail, rule, pack)
        case ProposalAccepted(pack=pack):
            return ("accepted", pack)


async def judged_again(path: Path, packs: list[PolicyPack]) -> tuple[int, list[str]]:
    """Judge every recorded proposal with ``verdict()``; return (count, differences).

    Each proposal is judged by the pack version whose hash its verdict records.
    """
    async with open_journal(path, readonly=True) as journal:
        events = await journal.read()
    recorded = _recorded_verdicts(events)
    # The memory pack in force beside each: 1.0.0 judged the golden journals.
    memory = MEMORY_PACK_1_0 if path.name in ("trading.db", "booking.db") else MEMORY_PACK
    by_hash = {pack.hash: PolicyCatalog([pack, memory]) for pack in packs}
    by_hash[memory.hash] = PolicyCatalog([memory])
    by_hash[""] = PolicyCatalog([])
    projections = Projections()
    count, differences = 0, []
    for event in events:
        payload = event.payload
        then = recorded.get(event.seq)
        if isinstance(payload, ProposalSubmitted) and then is not None:
            flow = projections.flows[event.dfid or ""]
            agent = projections.agents[flow.agent_id]
            judgement = verdict(
                payload.proposal,
                flow,
                agent,
                by_hash[then.pack],
                event.ts,
                projections,
                by_human=payload.by_human,
            )
            count += 1
            if _as_recorded(judgement) != _of(then):
                differences.append(f"seq {event.seq}: {_of(then)} != {_as_recorded(judgement)}")
        projections.apply((event,))
    return count, differences


def test_the_dim_and_replay_call_the_same_function():
    assert kernel.dim._actor.verdict is kernel.dim.verdict.verdict
    assert kernel.audit.reverify.verdict is kernel.dim.verdict.verdict


@pytest.mark.parametrize(
    ("name", "packs", "verdicts"),
    [
        ("trading", [TRADING, desk.DESK, TRADING_0_3, TRADING_0_2, DESK_0_1], 51),
        ("booking", [BOOKING, BOOKING_0_1], 8),
    ],
)
async def test_every_golden_verdict_is_the_functions_output_in_full(
    tmp_path, name, packs, verdicts
):
    # trading: accepted, escalated, and rejected at every layer from schema to guards.
    db = tmp_path / f"{name}.db"
    shutil.copyfile(GOLDEN / f"{name}.db", db)
    count, differences = await judged_again(db, packs)
    assert (count, differences) == (verdicts, [])


async def test_every_verdict_of_the_rejudging_workload_is_the_functions_output(tmp_path):
    path = tmp_path / "j.db"
    await test_verdicts.workload(path)
    count, differences = await judged_again(path, [TRADING])
    assert differences == []
    # Accepted, rejected for several codes, escalated, a human's modification.
    assert count == 14


async def test_needs_human_escalations_are_the_functions_output(tmp_path):
    path = tmp_path / "j.db"
    async with gov.gov_kernel(path) as kernel:
        await kernel.register(gov.agent([gov.pay(gov.LIMIT_CENTS + 1)], subscriptions=["pay"]))
        await kernel.register(
            gov.agent([gov.notice("refund?")], agent_id="other", subscriptions=["notice"])
        )
        [big] = await kernel.trigger("pay.invoice")
        [vague] = await kernel.trigger("notice.customer")
        await kernel.wait_quiet()
        codes = {kernel.flow(big).reason_code, kernel.flow(vague).reason_code}
    assert codes == {ReasonCode.RISK_LIMIT_EXCEEDED, ReasonCode.AMBIGUOUS}
    count, differences = await judged_again(path, [PACK, gov.GOV])
    assert (count, differences) == (2, [])


async def test_an_unsettled_saga_refusal_is_the_functions_output(tmp_path):
    gate = anyio.Event()
    bank = Desk({"book_hotel": [AdapterError("full")]}, gates={"undo:book_flight": gate})
    path = tmp_path / "j.db"
    async with desk_kernel(path, bank) as kernel:
        clerk = clerk_agent(Trip(legs=["flight", "hotel"]), Ping(text="next"), max_attempts=1)
        await kernel.register(clerk)
        [first] = await kernel.trigger("desk.go")
        await kernel.wait_flow(first, {FlowStatus.DIRTY})
        [second] = await kernel.trigger("desk.go")
        await kernel.wait_flow(second)
        [rejected] = await kernel.journal.read(dfid=second, types=["ProposalRejected"])
        assert rejected.payload.feedback.reason_code is ReasonCode.AGENT_PASSIVE
        gate.set()
        await kernel.wait_flow(first)
    count, differences = await judged_again(path, [DESK])
    assert (count, differences) == (2, [])


async def test_a_layer_added_to_the_function_shows_up_live_and_in_replay(tmp_path, monkeypatch):
    """Patch the one function's pipeline: the live DIM and ``rejudge`` both see the new layer."""
    judge = kernel.dim.verdict.judge

    def no_selling(proposal, *args, **kw):
        judgement = judge(proposal, *args, **kw)
        if judgement.rejection is None and proposal.params.get("side") == "sell":
            refusal = reject("rules", ReasonCode.RISK_LIMIT_EXCEEDED, "no selling today")
            return Judgement(rejection=refusal, pack=judgement.pack)
        return judgement

    path = tmp_path / "j.db"
    with monkeypatch.context() as patched:
        patched.setattr(kernel.dim.verdict, "judge", no_selling)
        flows = await test_verdicts.workload(path)
        async with open_journal(path, readonly=True) as journal:
            again = await rejudge(journal, [TRADING, MEMORY_PACK])
            [rejected] = await journal.read(dfid=flows["sell"], types=["ProposalRejected"])
    assert rejected.payload.feedback.detail == "no selling today"
    assert again.changes == []  # replay judges with the added layer too

    async with open_journal(path, readonly=True) as journal:
        without = await rejudge(journal, [TRADING, MEMORY_PACK])
    assert [(c.dfid, c.now) for c in without.changes] == [
        (flows["sell"], "would have been accepted")
    ]
