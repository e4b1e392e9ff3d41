"""Governance by exception: triggers, approvals, budgets, all on the manual clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agents_sdk import Proposal, WorkingContext
from kernel import (
    ApprovalStatus,
    EscalationBudget,
    EscalationPolicy,
    FlowStatus,
    Kernel,
    Outcome,
    ReasonCode,
    open_kernel,
)
from kernel.adapters import AdapterError, RetryPolicy
from kernel.audit import open_journal, payload_of
from kernel.config import KernelConfig, Ports
from kernel.core.events import (
    AgentStatusChanged,
    Draft,
    FlowEscalated,
    HumanDecided,
    ProposalAccepted,
    ProposalRejected,
)
from kernel.policy import Impact, NeedsHuman, PolicyKind, PolicyPack
from kernel.state.approvals import EscalationBudget as Budget
from kernel.state.approvals import over_budget
from kernel.telemetry import Telemetry
from kernel.testing import ManualClock, SeededIds, action_of, flow_types
from tests.support.helpers import PACK, Bank, ScriptedAgent, configured, flow_of, transfer
from tests.support.principals import LOCAL

LIMIT_CENTS = 10_000


class Payment(PolicyKind, tag="gov.payment"):
    """Financial: HIGH_IMPACT by default; above the limit it needs a human."""

    adapter: ClassVar[str] = "bank"

    account: str
    amount_cents: int

    def needs_human(self) -> NeedsHuman | None:
        if self.amount_cents > LIMIT_CENTS:
            return NeedsHuman(
                reason_code=ReasonCode.RISK_LIMIT_EXCEEDED,
                detail=f"{self.amount_cents} cents is above the limit of {LIMIT_CENTS}",
            )
        return None


class Notice(PolicyKind, tag="gov.notice"):
    """Informational: LOW_IMPACT; a rule reports ambiguity on a question mark."""

    adapter: ClassVar[str] = "bank"
    impact: ClassVar[Impact] = Impact.LOW_IMPACT

    text: str

    def needs_human(self) -> NeedsHuman | None:
        if "?" in self.text:
            return NeedsHuman(reason_code=ReasonCode.AMBIGUOUS, detail="which customer?")
        return None


GOV = PolicyPack(name="gov", version="1.0.0", kinds=(Payment, Notice))
KINDS = ["test.transfer", "gov.payment", "gov.notice"]


def pay(amount: int) -> Any:
    return lambda ctx: ctx.propose(Payment(account="acc-1", amount_cents=amount), explain="pay")


def notice(text: str) -> Any:
    return lambda ctx: ctx.propose(Notice(text=text), explain="tell them")


class GatedAgent(ScriptedAgent):
    """Holds each flow's reasoning until ``release(n)`` lets the n-th context through."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.gates: list[anyio.Event] = [anyio.Event() for _ in range(16)]

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        index = len(self.contexts)
        self.contexts.append(ctx)
        self._arrived.set()
        await self.gates[index].wait()
        return self.steps[min(ctx.attempt, len(self.steps)) - 1](ctx)


@asynccontextmanager
async def gov_kernel(
    path: Path, clock: ManualClock | None = None, bank: Bank | None = None, **kw: Any
) -> AsyncIterator[Kernel]:
    async with open_kernel(
        path,
        packs=[PACK, GOV],
        adapters={"bank": bank or Bank()},
        allow=["clerk", "other"],
        config=configured(
            KernelConfig(
                principal=LOCAL, ports=Ports(clock=clock or ManualClock(), ids=SeededIds(5))
            ),
            **kw,
        ),
    ) as kernel:
        yield kernel


def agent(steps: list[Any], **kw: Any) -> ScriptedAgent:
    return ScriptedAgent(steps=steps, capabilities=KINDS, **kw)


# --- triggers and impact ------------------------------------------------------


async def test_authority_and_ambiguity_rules_escalate_with_the_packs_impact(tmp_path: Path) -> None:
    async with gov_kernel(tmp_path / "j.db") as kernel:
        await kernel.register(agent([pay(LIMIT_CENTS + 1)], subscriptions=["pay"]))
        await kernel.register(
            agent([notice("refund?")], agent_id="other", subscriptions=["notice"])
        )
        [big] = await kernel.trigger("pay.invoice")
        [vague] = await kernel.trigger("notice.customer")
        await kernel.wait_quiet()

        assert flow_of(kernel, big).status is FlowStatus.ESCALATED
        assert flow_of(kernel, big).reason_code is ReasonCode.RISK_LIMIT_EXCEEDED
        assert flow_of(kernel, vague).reason_code is ReasonCode.AMBIGUOUS
        assert kernel.projections.approvals[big].impact is Impact.HIGH_IMPACT
        assert kernel.projections.approvals[vague].impact is Impact.LOW_IMPACT
        [escalated] = await kernel.journal.read(dfid=big, types=["FlowEscalated"])
        assert payload_of(escalated, FlowEscalated).impact == "HIGH_IMPACT"
        assert len(payload_of(escalated, FlowEscalated).action_hash) == 64


async def test_within_the_limit_nothing_escalates(tmp_path: Path) -> None:
    async with gov_kernel(tmp_path / "j.db") as kernel:
        await kernel.register(agent([pay(LIMIT_CENTS)]))
        [dfid] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED


async def test_the_watchdog_escalates_a_silent_agent(tmp_path: Path) -> None:
    clock = ManualClock()
    policy = EscalationPolicy(silence_s=60)
    async with gov_kernel(tmp_path / "j.db", clock, escalation=policy) as kernel:
        silent = GatedAgent(steps=[transfer()])
        await kernel.register(silent)
        [dfid] = await kernel.trigger("bank.invoice")
        await silent.wait_context()
        clock.advance(61)
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.ESCALATED
        assert flow.reason_code is ReasonCode.AGENT_SILENT

        # Nothing was proposed, so there is nothing to approve; rejecting ends it.
        approve = await kernel.decide(dfid, "approve", operator="ana", reason="go")
        assert approve.outcome is Outcome.REFUSED
        reject = await kernel.decide(dfid, "reject", operator="ana", reason="stuck")
        assert reject.outcome is Outcome.ABORTED
        # The agent wakes up late: its proposal finds the flow ended.
        silent.gates[0].set()
        await kernel.wait_quiet()
        assert flow_of(kernel, dfid).status is FlowStatus.ABORTED


# --- approvals ----------------------------------------------------------------


async def test_an_approval_is_bound_to_its_action_and_single_use(tmp_path: Path) -> None:
    bank = Bank()
    async with gov_kernel(tmp_path / "j.db", bank=bank) as kernel:
        await kernel.register(agent([transfer(700, confidence=0.2)]))
        [dfid] = await kernel.trigger("bank.invoice")
        await kernel.wait_flow(dfid)
        approval = kernel.projections.approvals[dfid]
        assert approval.status is ApprovalStatus.PENDING

        wrong = await kernel.decide(
            dfid, "approve", operator="ana", reason="ok", action_hash="0123456789"
        )
        assert wrong.outcome is Outcome.REFUSED
        assert wrong.reason_code is ReasonCode.ACTION_MISMATCH
        assert flow_of(kernel, dfid).status is FlowStatus.ESCALATED

        right = await kernel.decide(
            dfid, "approve", operator="ana", reason="ok", action_hash=approval.short_hash
        )
        assert right.outcome is Outcome.ACCEPTED
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        consumed = kernel.projections.approvals[dfid]
        assert (consumed.status, consumed.operator, consumed.reason) == (
            ApprovalStatus.CONSUMED,
            "ana",
            "ok",
        )

        again = await kernel.decide(
            dfid, "approve", operator="bob", reason="me too", action_hash=approval.short_hash
        )
        assert again.outcome is Outcome.REFUSED
        assert again.reason_code is ReasonCode.FLOW_NOT_ACTIVE
        assert len(bank.calls) == 1
        types = await flow_types(kernel, dfid)
        assert types.count("HumanDecided") == 1 and types.count("DecisionRefused") == 2


async def test_an_approval_expires_on_a_tick(tmp_path: Path) -> None:
    clock = ManualClock()
    policy = EscalationPolicy(approval_ttl_s=600)
    async with gov_kernel(tmp_path / "j.db", clock, escalation=policy) as kernel:
        await kernel.register(agent([transfer(confidence=0.2)]))
        [dfid] = await kernel.trigger("bank.invoice")
        await kernel.wait_flow(dfid)
        clock.advance(601)
        flow = await kernel.wait_flow(dfid, {FlowStatus.ABORTED})
        assert flow.reason_code is ReasonCode.EXPIRED
        assert kernel.projections.approvals[dfid].status is ApprovalStatus.EXPIRED
        assert "ApprovalExpired" in await flow_types(kernel, dfid)
        late = await kernel.decide(
            dfid,
            "approve",
            operator="ana",
            reason="sorry, lunch",
            action_hash=action_of(kernel, dfid),
        )
        assert late.outcome is Outcome.REFUSED


async def test_a_late_decision_finds_the_approval_expired(tmp_path: Path) -> None:
    clock = ManualClock()
    policy = EscalationPolicy(approval_ttl_s=600)
    bank = Bank()
    # No ticks at all: the late decision is how the manager notices.
    async with gov_kernel(
        tmp_path / "j.db", clock, bank=bank, escalation=policy, inbox_poll_s=None
    ) as kernel:
        await kernel.register(agent([transfer(confidence=0.2)]))
        [dfid] = await kernel.trigger("bank.invoice")
        await kernel.wait_flow(dfid)
        clock.advance(601)
        late = await kernel.decide(
            dfid, "approve", operator="ana", reason="finally", action_hash=action_of(kernel, dfid)
        )
        assert late.outcome is Outcome.REFUSED and late.reason_code is ReasonCode.EXPIRED
        assert flow_of(kernel, dfid).reason_code is ReasonCode.EXPIRED
        assert bank.calls == []


# --- the escalation budget ----------------------------------------------------


def test_the_bucket_refills_evenly_over_its_period() -> None:
    bucket = Budget(capacity=2, period_s=100)
    s = 1_000_000_000
    assert over_budget([("a", 0), ("b", 0), ("c", 0)], bucket) == {"c"}
    # One token comes back every 50 s.
    assert over_budget([("a", 0), ("b", 0), ("c", 50 * s)], bucket) == set()
    assert over_budget([("a", 0), ("b", 0), ("c", 49 * s)], bucket) == {"c"}


async def test_budget_exhaustion_demotes_aborts_and_an_operator_restores(tmp_path: Path) -> None:
    clock = ManualClock()
    policy = EscalationPolicy(budget=EscalationBudget(capacity=1, period_s=3600))
    async with gov_kernel(tmp_path / "j.db", clock, escalation=policy) as kernel:
        clerk = GatedAgent(steps=[transfer(confidence=0.2)])
        await kernel.register(clerk)
        a, b, c = [(await kernel.trigger("bank.invoice"))[0] for _ in range(3)]
        await clerk.wait_context(3)

        clerk.gates[0].set()
        assert (await kernel.wait_flow(a)).status is FlowStatus.ESCALATED
        clerk.gates[1].set()
        flow_b = await kernel.wait_flow(b, {FlowStatus.ABORTED})
        assert flow_b.reason_code is ReasonCode.ESCALATION_BUDGET_EXHAUSTED
        assert kernel.projections.agents["clerk"].status == "PASSIVE"
        [demoted] = await kernel.journal.read(types=["AgentStatusChanged"])
        assert payload_of(demoted, AgentStatusChanged).operator == "kernel"
        assert "ESCALATION_BUDGET_EXHAUSTED" in payload_of(demoted, AgentStatusChanged).reason

        # A PASSIVE agent's proposals are refused, and it is woken for nothing new.
        clerk.gates[2].set()
        for gate in clerk.gates[3:]:
            gate.set()
        flow_c = await kernel.wait_flow(c, {FlowStatus.ABORTED})
        [first, *_] = await kernel.journal.read(dfid=c, types=["ProposalRejected"])
        assert payload_of(first, ProposalRejected).feedback.reason_code is ReasonCode.AGENT_PASSIVE
        assert flow_c.status is FlowStatus.ABORTED
        assert await kernel.trigger("bank.invoice") == []
        # The first escalation still waits for its human.
        assert flow_of(kernel, a).status is FlowStatus.ESCALATED

        await kernel.set_agent_status("clerk", "ACTIVE", operator="ana", reason="tuned prompt")
        [d] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(d)).status is FlowStatus.ESCALATED
        assert kernel.projections.agents["clerk"].status == "ACTIVE"


async def test_the_budget_refills_with_time(tmp_path: Path) -> None:
    clock = ManualClock()
    policy = EscalationPolicy(budget=EscalationBudget(capacity=1, period_s=3600))
    async with gov_kernel(tmp_path / "j.db", clock, escalation=policy, inbox_poll_s=None) as kernel:
        await kernel.register(agent([transfer(confidence=0.2)]))
        [first] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(first)).status is FlowStatus.ESCALATED
        clock.advance(3600)
        [second] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(second)).status is FlowStatus.ESCALATED
        [third] = await kernel.trigger("bank.invoice")
        third_flow = await kernel.wait_flow(third, {FlowStatus.ABORTED})
        assert third_flow.reason_code is ReasonCode.ESCALATION_BUDGET_EXHAUSTED


# --- the computation budget ---------------------------------------------------


class Looping(ScriptedAgent):
    """Thinks forever, reporting what each thought costs."""

    cancelled = False

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        self.contexts.append(ctx)
        try:
            while True:
                ctx.report_usage(tokens=100)
                await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise


async def test_the_token_cap_cancels_a_looping_agent_mid_reasoning(tmp_path: Path) -> None:
    async with gov_kernel(tmp_path / "j.db", token_budget=1_000) as kernel:
        looping = Looping()
        await kernel.register(looping)
        [dfid] = await kernel.trigger("bank.invoice")
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.ABORTED
        assert flow.reason_code is ReasonCode.TOKEN_BUDGET_EXHAUSTED
        assert "1100 tokens" in flow.detail
        assert looping.cancelled


async def test_the_wall_time_cap_cancels_a_reasoning_step_on_the_kernels_clock(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    async with gov_kernel(tmp_path / "j.db", clock, reasoning_timeout_s=30) as kernel:
        stuck = GatedAgent(steps=[transfer()])
        await kernel.register(stuck)
        [dfid] = await kernel.trigger("bank.invoice")
        await stuck.wait_context()
        clock.advance(31)
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.ABORTED
        assert flow.reason_code is ReasonCode.REASONING_TIMEOUT


async def test_usage_within_the_cap_changes_nothing(tmp_path: Path) -> None:
    def frugal(ctx: WorkingContext) -> Proposal:
        ctx.report_usage(tokens=900)
        return transfer()(ctx)

    async with gov_kernel(tmp_path / "j.db", token_budget=1_000) as kernel:
        await kernel.register(agent([frugal]))
        [dfid] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED


# --- operational failure, and the span of the wait ------------------------------


class DownBank(Bank):
    """A bank that refuses every call before it reaches the ledger (nothing happened)."""

    async def execute(self, intent: Any) -> Any:
        raise AdapterError("ledger offline", transient=True, outcome_unknown=False)


async def test_an_operational_failure_escalates_without_spending_the_agents_budget(
    tmp_path: Path,
) -> None:
    policy = EscalationPolicy(budget=EscalationBudget(capacity=1, period_s=3600))
    once = RetryPolicy(max_attempts=1)
    async with gov_kernel(
        tmp_path / "j.db", bank=DownBank(), escalation=policy, retry=once
    ) as kernel:
        await kernel.register(agent([transfer()]))
        [failed] = await kernel.trigger("bank.invoice")
        flow = await kernel.wait_flow(failed)
        # The engine escalates its own failure, in the batch that records it.
        assert (flow.status, flow.reason_code) == (
            FlowStatus.ESCALATED,
            ReasonCode.EXECUTION_FAILED,
        )
        types = await flow_types(kernel, failed)
        assert types[-2:] == ["ExecutionFailed", "FlowEscalated"]
        assert kernel.projections.escalations.get("clerk") is None


async def test_the_escalation_span_shows_how_long_the_flow_waited(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    clock = ManualClock()
    telemetry = Telemetry(SimpleSpanProcessor(exporter))
    async with gov_kernel(
        tmp_path / "j.db", clock, telemetry=telemetry, inbox_poll_s=None
    ) as kernel:
        # Valid long enough that the approved intent may still execute after the wait.
        await kernel.register(agent([transfer(confidence=0.2, valid_for_s=600)]))
        [dfid] = await kernel.trigger("bank.invoice")
        await kernel.wait_flow(dfid)
        clock.advance(90)
        await kernel.decide(
            dfid, "approve", operator="ana", reason="ok", action_hash=action_of(kernel, dfid)
        )
        with anyio.fail_after(10):
            assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
    [span] = [s for s in exporter.get_finished_spans() if s.name.startswith("escalation ")]
    assert span.attributes is not None
    assert span.attributes["dir.wait_ms"] == 90_000
    assert span.attributes["dir.impact"] == "HIGH_IMPACT"
    assert span.attributes["dir.decision"] == "approve"


async def test_a_decision_recorded_just_before_a_crash_executes_once_after_restart(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    async with gov_kernel(path, inbox_poll_s=None) as kernel:
        await kernel.register(agent([transfer(confidence=0.2)]))
        [dfid] = await kernel.trigger("bank.invoice")
        flow = await kernel.wait_flow(dfid)
        approval = kernel.projections.approvals[dfid]
    # What the escalation manager commits for an approval, written as if the kernel
    # died right after that commit, before the engine got the flow.
    async with open_journal(path) as journal:
        decided, _ = await journal.append(
            [
                Draft(
                    payload=HumanDecided(
                        decision="approve",
                        operator="ana",
                        reason="ok",
                        action_hash=approval.action_hash,
                        inbox_id=1,
                    ),
                    dfid=dfid,
                    agent_id=flow.agent_id,
                ),
                Draft(
                    payload=ProposalAccepted(attempt=1, by_human=True),
                    dfid=dfid,
                    agent_id=flow.agent_id,
                    caused_by=-1,
                ),
            ]
        )
    bank = Bank()
    async with gov_kernel(path, bank=bank, inbox_poll_s=None) as kernel:
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        assert len(bank.calls) == 1
        assert kernel.projections.inbox_taken == {1: decided.seq}
        again = await kernel.decide(
            dfid, "approve", operator="ana", reason="ok", action_hash=action_of(kernel, dfid)
        )
        assert again.outcome is Outcome.REFUSED
    async with gov_kernel(path, bank=bank, inbox_poll_s=None) as kernel:
        assert len(bank.calls) == 1
        assert (await flow_types(kernel, dfid)).count("ExecutionStarted") == 1
