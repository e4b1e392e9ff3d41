"""End to end: trigger -> context -> agent -> DIM -> escalation -> execution -> journal."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import NoReturn

import anyio
import anyio.lowlevel
import pytest

from kernel import (
    FlowStatus,
    HumanDecision,
    Kernel,
    Outcome,
    Proposal,
    ReasonCode,
    Verdict,
    WorkingContext,
    open_kernel,
)
from kernel.audit import open_journal, payload_of
from kernel.audit.reverify import rejudge
from kernel.cli import main as dirk_main
from kernel.config import KernelConfig, Ports
from kernel.core.events import FlowFlagged, HumanDecided, ProposalRejected
from kernel.dim import BUDGET_GUARD
from kernel.policy.rules import ALLOW, RuleVerdict, View, deny, rule
from kernel.runtime.actors import Reply
from kernel.runtime.messages import Execute
from kernel.testing import ManualClock, SeededIds, action_of, flow_types
from tests.support.helpers import (
    PACK,
    Bank,
    ScriptedAgent,
    Transfer,
    flow_of,
    kernel_for,
    transfer,
)
from tests.support.principals import LOCAL


async def test_accepted_flow_executes_once_and_is_recorded(kernel: Kernel, bank: Bank) -> None:
    agent = ScriptedAgent(steps=[transfer(250)])
    await kernel.register(agent)
    [dfid] = await kernel.trigger("bank.invoice", {"bank.invoice.amount": 250})
    flow = await kernel.wait_flow(dfid)

    assert flow.status is FlowStatus.CLOSED
    assert len(bank.calls) == 1 and len(bank.effects) == 1
    assert bank.calls[0].params == {"account": "acc-1", "amount_cents": 250}
    assert flow.external_id == bank.effects[bank.calls[0].key].external_id
    assert agent.contexts[0].state == {"bank.invoice.amount": 250}
    assert await flow_types(kernel, dfid) == [
        "FlowCreated",
        "ContextCompiled",
        "ProposalSubmitted",
        "ProposalAccepted",
        "ExecutionStarted",
        "ExecutionSucceeded",
        "FlowClosed",
    ]


async def test_the_same_intent_again_has_no_second_effect(kernel: Kernel, bank: Bank) -> None:
    agent = ScriptedAgent()
    session = await kernel.register(agent)
    [dfid] = await kernel.trigger("bank.invoice")
    closed = await kernel.wait_flow(dfid)
    proposal = transfer()(agent.contexts[0])

    again = await kernel.submit(session.token, dfid, proposal)
    assert again.outcome is Outcome.DUPLICATE
    assert again.external_id == closed.external_id

    # The accepted intent delivered to the engine a second time.
    reply: Reply[Verdict] = Reply()
    await kernel.actors.execution.send(Execute(dfid=dfid, reply=reply))
    redelivered = await reply.wait()
    assert redelivered.outcome is Outcome.DUPLICATE
    assert redelivered.external_id == closed.external_id

    types = await flow_types(kernel, dfid)
    assert types.count("DuplicateSuppressed") == 2
    assert types.count("ExecutionStarted") == 1
    assert len(bank.calls) == 1
    assert flow_of(kernel, dfid).status is FlowStatus.CLOSED


async def test_rejected_then_revised_and_accepted_on_attempt_two(tmp_path: Path) -> None:
    def bad(ctx: WorkingContext) -> Proposal:
        return ctx.propose({"kind": "test.transfer", "account": "a", "amount_cents": "ten"})

    async with kernel_for(tmp_path / "j.db") as kernel:
        agent = ScriptedAgent(steps=[bad, transfer(10)])
        await kernel.register(agent)
        [dfid] = await kernel.trigger("bank.invoice")
        flow = await kernel.wait_flow(dfid)

        assert flow.status is FlowStatus.CLOSED
        assert flow.attempts == 2 and flow.rejections == 1
        second = agent.contexts[1]
        assert second.attempt == 2
        assert second.feedback is not None
        assert second.feedback.reason_code is ReasonCode.SCHEMA_INVALID
        assert second.feedback.field == "params.amount_cents"


async def test_three_rejections_end_in_reasoning_exhaustion(kernel: Kernel, bank: Bank) -> None:
    agent = ScriptedAgent(
        capabilities=["test.transfer"],
        steps=[lambda ctx: ctx.propose({"kind": "test.note", "text": "x"})],
    )
    await kernel.register(agent)
    [dfid] = await kernel.trigger("bank.invoice")
    flow = await kernel.wait_flow(dfid)

    assert flow.status is FlowStatus.ABORTED
    assert flow.reason_code is ReasonCode.REASONING_EXHAUSTION
    assert flow.rejections == 3 and len(agent.contexts) == 3
    assert bank.calls == []


async def test_low_confidence_escalates_and_a_human_override_executes(
    kernel: Kernel, bank: Bank
) -> None:
    await kernel.register(ScriptedAgent(steps=[transfer(5_000, confidence=0.3)]))
    [dfid] = await kernel.trigger("bank.invoice")
    flow = await kernel.wait_flow(dfid)
    assert flow.status is FlowStatus.ESCALATED
    assert flow.reason_code is ReasonCode.LOW_CONFIDENCE
    assert bank.calls == []

    verdict = await kernel.decide(
        dfid,
        HumanDecision.OVERRIDE,
        operator="ana",
        reason="known vendor",
        action_hash=action_of(kernel, dfid),
    )
    assert verdict.outcome is Outcome.ACCEPTED
    flow = await kernel.wait_flow(dfid)
    assert flow.status is FlowStatus.CLOSED
    assert len(bank.calls) == 1
    [decided] = await kernel.journal.read(dfid=dfid, types=["HumanDecided"])
    human = payload_of(decided, HumanDecided)
    assert (human.operator, human.reason) == ("ana", "known vendor")


async def test_a_human_abort_ends_the_flow(kernel: Kernel, bank: Bank) -> None:
    await kernel.register(ScriptedAgent(steps=[transfer(confidence=0.1)]))
    [dfid] = await kernel.trigger("bank.invoice")
    await kernel.wait_flow(dfid)
    verdict = await kernel.decide(dfid, "abort", operator="ana", reason="looks wrong")

    assert verdict.outcome is Outcome.ABORTED
    flow = flow_of(kernel, dfid)
    assert flow.status is FlowStatus.ABORTED
    assert flow.reason_code is ReasonCode.HUMAN_REJECTED
    assert bank.calls == []
    again = await kernel.decide(
        dfid, "override", operator="bob", reason="too late", action_hash=action_of(kernel, dfid)
    )
    assert again.outcome is Outcome.REFUSED


async def test_a_human_modification_goes_through_the_dim_again(kernel: Kernel, bank: Bank) -> None:
    await kernel.register(ScriptedAgent(steps=[transfer(9_000, confidence=0.2)]))
    first, second = await kernel.trigger("bank.invoice"), await kernel.trigger("bank.invoice")
    await kernel.wait_flow(first[0])
    await kernel.wait_flow(second[0])

    refused = await kernel.decide(
        first[0],
        "modify",
        operator="ana",
        reason="halve it",
        params={"account": "acc-1", "amount_cents": "half"},
    )
    assert refused.outcome is Outcome.ABORTED
    assert refused.reason_code is ReasonCode.SCHEMA_INVALID

    accepted = await kernel.decide(
        second[0],
        "modify",
        operator="ana",
        reason="halve it",
        params={"account": "acc-1", "amount_cents": 4_500},
    )
    assert accepted.outcome is Outcome.ACCEPTED
    assert (await kernel.wait_flow(second[0])).status is FlowStatus.CLOSED
    assert [c.params["amount_cents"] for c in bank.calls] == [4_500]


async def test_a_proposal_past_its_validity_window_is_expired(tmp_path: Path) -> None:
    hold, clock = anyio.Event(), ManualClock()
    async with kernel_for(tmp_path / "j.db", clock=clock) as kernel:
        agent = ScriptedAgent(steps=[transfer(valid_for_s=1)], hold=hold, max_attempts=1)
        await kernel.register(agent)
        [dfid] = await kernel.trigger("bank.invoice")
        await agent.wait_context()
        clock.advance(5)
        hold.set()
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.ABORTED
        [rejected] = await kernel.journal.read(dfid=dfid, types=["ProposalRejected"])
        assert payload_of(rejected, ProposalRejected).feedback.reason_code is ReasonCode.EXPIRED


async def test_a_proposal_on_a_changed_state_is_stale_and_retried_on_fresh_context(
    tmp_path: Path,
) -> None:
    hold = anyio.Event()
    async with kernel_for(tmp_path / "j.db") as kernel:
        agent = ScriptedAgent(subscriptions=["bank.rates"], hold=hold)
        await kernel.register(agent)
        [dfid] = await kernel.trigger("bank.rates", {"bank.rates.eur": "1.10"})
        await agent.wait_context()
        # The world moves while the agent thinks (a source nobody subscribes to as a topic).
        await kernel.trigger("feeds.fx", {"bank.rates.eur": "1.12"})
        hold.set()
        flow = await kernel.wait_flow(dfid)

        assert flow.status is FlowStatus.CLOSED and flow.attempts == 2
        feedback = agent.contexts[1].feedback
        assert feedback is not None and feedback.reason_code is ReasonCode.STALE_CONTEXT
        assert agent.contexts[1].state == {"bank.rates.eur": "1.12"}


async def test_child_flows_carry_their_parents_dfid(kernel: Kernel) -> None:
    await kernel.register(ScriptedAgent())
    [parent] = await kernel.trigger("bank.mandate")
    [child] = await kernel.trigger("bank.invoice", parent=parent)
    [grandchild] = await kernel.trigger("bank.invoice", parent=child)
    await kernel.wait_quiet()

    assert flow_of(kernel, child).parent_dfid == parent
    assert flow_of(kernel, grandchild).parent_dfid == child
    assert {flow_of(kernel, d).root_dfid for d in (parent, child, grandchild)} == {parent}
    [created] = await kernel.journal.read(dfid=child, types=["FlowCreated"])
    assert created.parent_dfid == parent


async def test_an_agent_that_declines_or_fails_ends_its_flow_with_a_reason(tmp_path: Path) -> None:
    def boom(ctx: WorkingContext) -> NoReturn:
        raise ValueError("model returned garbage")

    async with kernel_for(tmp_path / "j.db") as kernel:
        await kernel.register(ScriptedAgent("clerk", steps=[lambda ctx: None]))
        await kernel.register(ScriptedAgent("other", steps=[boom]))
        dfids = await kernel.trigger("bank.invoice")
        await kernel.wait_quiet()
        reasons = {flow_of(kernel, d).agent_id: flow_of(kernel, d).reason_code for d in dfids}
        assert reasons == {"clerk": ReasonCode.AGENT_DECLINED, "other": ReasonCode.AGENT_ERROR}


async def test_flows_survive_a_restart_of_the_kernel(tmp_path: Path) -> None:
    async with kernel_for(tmp_path / "j.db") as kernel:
        await kernel.register(ScriptedAgent(steps=[transfer(confidence=0.2)]))
        [dfid] = await kernel.trigger("bank.invoice")
        await kernel.wait_flow(dfid)

    bank = Bank()
    async with kernel_for(tmp_path / "j.db", bank=bank) as kernel:
        assert flow_of(kernel, dfid).status is FlowStatus.ESCALATED
        await kernel.decide(
            dfid,
            "override",
            operator="ana",
            reason="checked by phone",
            action_hash=action_of(kernel, dfid),
        )
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        assert len(bank.calls) == 1


async def test_transfer_kind_has_no_floats() -> None:
    # Money is integer minor units: a float amount is a schema error, not a rounding.
    import msgspec
    import pytest

    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"kind": "test.transfer", "account": "a", "amount_cents": 1.5}, Transfer)


async def test_a_burst_wider_than_the_mailboxes_is_admitted_gradually_and_completes(
    tmp_path: Path,
) -> None:
    # 16 agents on one topic and 200 concurrent triggers: 3,200 flows through mailboxes
    # sized for 32 in flight. Without admission at the edge this deadlocks.
    names = [f"agent-{i}" for i in range(16)]
    async with kernel_for(tmp_path / "j.db", allow=names, max_in_flight=32) as kernel:
        for name in names:
            await kernel.register(ScriptedAgent(name))
        peak: list[int] = []
        kernel.journal.add_listener(lambda _: peak.append(len(kernel.projections.moving)))
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(200):
                    tg.start_soon(kernel.trigger, "bank.invoice")
            await kernel.wait_quiet()
        assert len(kernel.flows(FlowStatus.CLOSED)) == 3_200
        assert max(peak) <= 32


async def test_a_flow_left_in_an_agents_mind_by_a_stopped_kernel_ends_interrupted(
    tmp_path: Path,
) -> None:
    hold = anyio.Event()
    async with kernel_for(tmp_path / "j.db") as kernel:
        agent = ScriptedAgent(hold=hold)
        await kernel.register(agent)
        [dfid] = await kernel.trigger("bank.invoice")
        await agent.wait_context()
    async with kernel_for(tmp_path / "j.db") as reopened:
        flow = flow_of(reopened, dfid)
        assert (flow.status, flow.reason_code) == (FlowStatus.ABORTED, ReasonCode.INTERRUPTED)
        assert "not resumed" in flow.detail


# --- a rule past its time budget: a finding beside the verdict, never another verdict ---

DAWDLE_S = 0.005


def _dawdle() -> None:
    """Take real time, as a heavy computation or a blocking lookup in a rule would.

    (A rule that calls ``time`` itself is refused at load; the purity check reads
    only the rule's own body, and a slow helper is the case the budget is for.)
    """
    time.sleep(DAWDLE_S)


@rule(Transfer, fields=("amount_cents",), budget_us=1_000)
def dawdling_cap(view: View) -> RuleVerdict:
    _dawdle()
    if view.params.amount_cents > 500:
        return deny("above 500 cents", field="amount_cents", limit=500)
    return ALLOW


SLOW = dataclasses.replace(PACK, version="1.1.0", rules=(dawdling_cap,))


def invoice(ctx: WorkingContext) -> Proposal:
    amount = ctx.state["bank.invoice.amount"]
    confidence = 0.3 if amount == 300 else 0.9
    return ctx.propose(Transfer(account="acc-1", amount_cents=amount), confidence=confidence)


async def test_a_rule_sleeping_past_its_budget_keeps_its_verdict_live_and_on_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    expected = {
        250: (FlowStatus.CLOSED, None),
        900: (FlowStatus.ABORTED, ReasonCode.REASONING_EXHAUSTION),  # the rule denied it
        300: (FlowStatus.ESCALATED, ReasonCode.LOW_CONFIDENCE),
    }
    dfids: dict[int, str] = {}
    async with open_kernel(
        db,
        packs=[SLOW],
        adapters={"bank": Bank()},
        allow=["clerk"],
        config=KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(), ids=SeededIds(7))),
    ) as kernel:
        await kernel.register(ScriptedAgent(steps=[invoice], max_attempts=1))
        for amount, (status, code) in expected.items():
            [dfid] = await kernel.trigger("bank.invoice", {"bank.invoice.amount": amount})
            flow = await kernel.wait_flow(dfid)
            # The verdict the rule gives, as if it had been quick (today's main: KERNEL_FAULT).
            assert (flow.status, flow.reason_code) == (status, code)
            assert flow.needs_review
            [flag] = await kernel.journal.read(dfid=dfid, types=["FlowFlagged"])
            f = payload_of(flag, FlowFlagged)
            assert (f.guard, f.rule, f.budget_us, f.pack) == (
                BUDGET_GUARD,
                "dawdling_cap",
                1_000,
                SLOW.hash,
            )
            # A sleep lasts at least as long as asked: a lower bound, not a timing assertion.
            assert f.took_us >= DAWDLE_S * 1e6 and not f.failed
            assert "of pack test 1.1.0" in f.reason and "over its budget of 1000 us" in f.reason
            [verdict] = await kernel.journal.read(
                dfid=dfid, types=["ProposalAccepted", "ProposalRejected", "FlowEscalated"]
            )
            assert flag.seq > verdict.seq
            dfids[amount] = dfid
        [rejected] = await kernel.journal.read(dfid=dfids[900], types=["ProposalRejected"])
        denied = payload_of(rejected, ProposalRejected).feedback
        assert denied.reason_code is ReasonCode.RISK_LIMIT_EXCEEDED
        assert denied.rule == "dawdling_cap"

    async with open_journal(db, readonly=True) as journal:
        again = await rejudge(journal, [SLOW])
    assert (again.judged, again.changes, again.mismatches) == (3, [], [])

    spec = "tests.dim.test_pipeline:SLOW"
    exit_code = await anyio.to_thread.run_sync(
        dirk_main, ["verify", "--db", str(db), "--verdicts", "--pack", spec]
    )
    out = capsys.readouterr().out
    assert exit_code == 0 and "verify: verdicts ok: 3 re-judged, 0 differ" in out
    assert await anyio.to_thread.run_sync(dirk_main, ["flows", "--db", str(db)]) == 0
    assert capsys.readouterr().out.count("NEEDS_REVIEW") == 3
    assert await anyio.to_thread.run_sync(dirk_main, ["show", dfids[250], "--db", str(db)]) == 0
    assert f"NEEDS_REVIEW by guard {BUDGET_GUARD}: rule dawdling_cap" in capsys.readouterr().out
