"""Money budgets: integer minor units and a currency, reserved before acceptance, never exceeded.

A pack's Budget holds each proposal's cost in a pool (the resource machinery), spent
when the flow closes and given back when it aborts or is compensated. Over a ceiling a
proposal is refused (BUDGET_EXHAUSTED) or escalated, as the budget says; windows roll
on the recorded clock. Whatever flows race, no prefix of the journal ever has a pool's
spending (within its window) plus what open flows hold above its ceiling.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel import FlowStatus, Kernel, PackError, ReasonCode
from kernel.audit import Projections, open_journal, payload_of, payloads
from kernel.core.events import Event, FlowEscalated, ProposalRejected, ReasoningCharged
from kernel.policy import Budget, ModelPrice, Threshold, format_money, parse_money
from kernel.policy.contracts import Proposal, WorkingContext
from kernel.policy.money import exponent
from kernel.policy.packs import PolicyCatalog
from kernel.state.budgets import Budgets
from kernel.testing import ManualClock, ScriptedAgent, action_of
from policies.trading import TRADING, PlaceOrder, notional_minor
from tests.dim.test_superseded import escalated_order, open_desk
from tests.support.approvals_domain import DAILY, Payments, Send, pack, pay_kernel, sender
from tests.support.helpers import Bank

DESK_POOL = DAILY.pool("")


@pytest.mark.parametrize(
    ("minor", "currency", "text"),
    [
        (2_500_000, "USD", "25,000.00 USD"),
        (5, "EUR", "0.05 EUR"),
        (-123_456, "EUR", "-1,234.56 EUR"),
        (1500, "JPY", "1,500 JPY"),
        (1_234_567, "KWD", "1,234.567 KWD"),
        (0, "USD", "0.00 USD"),
    ],
)
def test_money_reads_as_people_read_it(minor: int, currency: str, text: str) -> None:
    assert format_money(minor, currency) == text
    assert parse_money(text) == (minor, currency)


@given(
    minor=st.integers(-(10**15), 10**15),
    currency=st.sampled_from(["USD", "EUR", "JPY", "KWD", "GBP"]),
)
def test_formatted_money_parses_back_exactly(minor: int, currency: str) -> None:
    assert parse_money(format_money(minor, currency)) == (minor, currency)


@pytest.mark.parametrize("text", ["25000", "1.234 USD", "abc USD", "25,000.00 usd", "1e3 USD"])
def test_money_that_is_not_exact_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_money(text)
    assert exponent("USD") == 2


async def send(kernel: Kernel, cents: int) -> FlowStatus:
    [dfid] = await kernel.trigger(f"pay.{cents}")
    return (await kernel.wait_flow(dfid)).status


async def test_a_daily_budget_is_spent_on_success_and_rolls_with_the_recorded_clock(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    async with pay_kernel(tmp_path / "j.db", [pack(budgets=(DAILY,))], clock=clock) as kernel:
        await kernel.register(sender())
        for _ in range(5):
            assert await send(kernel, 90_000) is FlowStatus.CLOSED
        budgets = kernel.projections.domain(Budgets)
        assert budgets.spent(DESK_POOL, kernel.clock.now_ns()) == 450_000
        assert kernel.projections.held.get(DESK_POOL, 0) == 0  # spent, no longer held
        assert await send(kernel, 90_000) is FlowStatus.ABORTED
        [rejected] = await kernel.journal.read(types=["ProposalRejected"])
        assert isinstance(rejected.payload, ProposalRejected)
        feedback = rejected.payload.feedback
        assert (feedback.reason_code, feedback.layer) == (ReasonCode.BUDGET_EXHAUSTED, "budgets")
        assert "900.00 EUR wanted, 500.00 EUR of 5,000.00 EUR left" in feedback.detail
        assert await send(kernel, 50_000) is FlowStatus.CLOSED  # what is left fits
        clock.advance(86_400)
        assert budgets.spent(DESK_POOL, kernel.clock.now_ns()) == 0
        assert await send(kernel, 90_000) is FlowStatus.CLOSED


async def test_a_failed_or_refused_send_spends_nothing(tmp_path: Path) -> None:
    payments = Payments()
    payments.fail.add(400_000)
    budget = Budget(name="day", ceiling=500_000, currency="EUR", window_s=86_400)
    big = pack(budgets=(budget,), thresholds=())
    async with pay_kernel(tmp_path / "j.db", [big], payments=payments) as kernel:
        await kernel.register(sender())
        assert await send(kernel, 400_000) is FlowStatus.ABORTED  # the payee refused it
        budgets = kernel.projections.domain(Budgets)
        assert budgets.spent(budget.pool(""), kernel.clock.now_ns()) == 0
        assert kernel.projections.held.get(budget.pool(""), 0) == 0
        assert await send(kernel, 450_000) is FlowStatus.CLOSED


async def test_over_a_ceiling_that_escalates_a_human_may_approve_the_overspend(
    tmp_path: Path,
) -> None:
    soft = Budget(name="soft", ceiling=100_000, currency="EUR", over="escalate")
    async with pay_kernel(tmp_path / "j.db", [pack(budgets=(soft,))]) as kernel:
        await kernel.register(sender())
        assert await send(kernel, 80_000) is FlowStatus.CLOSED
        [dfid] = await kernel.trigger("pay.30000")
        flow = await kernel.wait_flow(dfid)
        assert (flow.status, flow.reason_code) == (
            FlowStatus.ESCALATED,
            ReasonCode.BUDGET_EXHAUSTED,
        )
        # Held while it waits, over the ceiling: the next one escalates too.
        assert kernel.projections.held[soft.pool("")] == 30_000
        assert await send(kernel, 10_000) is FlowStatus.ESCALATED
        await kernel.decide(
            dfid, "approve", operator="ana", reason="month end", action_hash=action_of(kernel, dfid)
        )
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        budgets = kernel.projections.domain(Budgets)
        assert budgets.spent(soft.pool(""), kernel.clock.now_ns()) == 110_000


async def test_a_grant_does_not_lift_a_money_ceiling(tmp_path: Path) -> None:
    soft = Budget(name="soft", ceiling=300_000, currency="EUR", over="escalate")
    async with pay_kernel(tmp_path / "j.db", [pack(budgets=(soft,))]) as kernel:
        await kernel.register(sender())
        await kernel.grant("pay.send", uses=5, valid_for_s=600, operator="ana", reason="r")
        assert await send(kernel, 250_000) is FlowStatus.CLOSED  # the grant's
        [dfid] = await kernel.trigger("pay.250000")
        flow = await kernel.wait_flow(dfid)
        assert flow.reason_code is ReasonCode.BUDGET_EXHAUSTED


@pytest.mark.parametrize("per", ["decision", "tree", "agent", "session"])
async def test_each_scope_counts_its_own(tmp_path: Path, per: str) -> None:
    budget = Budget(name="b", ceiling=150_000, currency="EUR", per=per)  # type: ignore[arg-type]
    async with pay_kernel(tmp_path / "j.db", [pack(budgets=(budget,), thresholds=())]) as kernel:
        await kernel.register(sender())
        await kernel.register(sender("other"))
        for dfid in await kernel.trigger("pay.200000"):  # over any scope's ceiling
            assert (await kernel.wait_flow(dfid)).status is FlowStatus.ABORTED
        # clerk and other both wake on pay.*: two flows, two trees, two decisions.
        for expected in (["CLOSED", "CLOSED"], None):
            dfids = await kernel.trigger("pay.100000")
            statuses = sorted([str((await kernel.wait_flow(d)).status) for d in dfids])
            again = {
                "decision": ["CLOSED", "CLOSED"],
                "tree": ["CLOSED", "CLOSED"],
                "agent": ["ABORTED", "ABORTED"],  # each agent spent 100,000 before
                "session": ["ABORTED", "ABORTED"],
            }[per]
            assert statuses == (expected or again)
        if per == "session":
            # A new handshake is a new session, with nothing spent.
            await kernel.register(sender())
            statuses = [
                str((await kernel.wait_flow(d)).status) for d in await kernel.trigger("pay.100000")
            ]
            assert sorted(statuses) == ["ABORTED", "CLOSED"]


def ceilings_held(projections: Projections, ts: int, budgets: list[Budget]) -> None:
    spent = projections.domain(Budgets)
    for budget in budgets:
        pool = budget.pool("")
        # A closed flow's hold is spent at its FlowClosed and released by the next events
        # of the same append: between the two it is counted once, as spent.
        held = sum(
            pools.get(pool, 0)
            for dfid, pools in projections.reservations.items()
            if projections.flows[dfid].status is not FlowStatus.CLOSED
        )
        assert spent.spent(pool, ts) + held <= budget.ceiling, pool


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    amounts=st.lists(st.integers(1, 60_000), min_size=1, max_size=14),
    failing=st.sets(st.integers(1, 60_000), max_size=3),
    ceiling=st.integers(50_000, 200_000),
)
async def test_no_money_ceiling_is_exceeded_by_concurrent_flows(
    tmp_path_factory: pytest.TempPathFactory,
    amounts: list[int],
    failing: set[int],
    ceiling: int,
) -> None:
    payments = Payments()
    payments.fail |= failing
    budgets = [
        Budget(name="day", ceiling=ceiling, currency="EUR", window_s=86_400),
        Budget(name="ever", ceiling=ceiling + 30_000, currency="EUR"),
    ]
    path = tmp_path_factory.mktemp("money") / "j.db"
    async with pay_kernel(path, [pack(budgets=tuple(budgets))], payments=payments) as kernel:
        await kernel.register(sender())
        async with anyio.create_task_group() as tg:
            for cents in amounts:
                tg.start_soon(send, kernel, cents)
        assert payments.sent() <= ceiling
    # Every prefix of the journal, as replay folds it: spent + held <= ceiling.
    projections = Projections()
    async with open_journal(path, readonly=True) as journal:
        async for batch in journal.scan():
            for event in batch:
                projections.apply([event])
                ceilings_held(projections, event.ts, budgets)
    escalated = [e for e in await _read(path) if isinstance(e.payload, FlowEscalated)]
    assert escalated == []  # every amount is below the approval threshold


async def _read(path: Path) -> list[Event]:
    async with open_journal(path, readonly=True) as journal:
        return await journal.read()


def thinker(tokens: int, model: str = "m-large") -> ScriptedAgent:
    """An agent whose reasoning reports ``tokens`` of ``model`` before it sends 50.00 EUR."""

    def step(ctx: WorkingContext) -> Proposal:
        ctx.report_usage(tokens=tokens, model=model)
        return ctx.propose(Send(payee="acme", amount_cents=5_000), explain="think, then pay")

    return ScriptedAgent(
        "clerk", [step], capabilities=["pay.send"], subscriptions=["pay"], max_attempts=1
    )


async def test_a_price_table_turns_reasoning_into_money_against_a_ceiling(tmp_path: Path) -> None:
    # A cent a token; the agent may think for at most 0.50 USD a day.
    prices = {"m-large": ModelPrice(currency="USD", per_million=1_000_000)}
    thought = Budget(
        name="thought", ceiling=50, currency="USD", per="agent", window_s=86_400, reasoning=True
    )
    async with pay_kernel(tmp_path / "j.db", [pack(budgets=(thought,))], prices=prices) as kernel:
        await kernel.register(thinker(30))
        assert await send(kernel, 1) is FlowStatus.CLOSED  # 0.30 USD thought, 50.00 EUR sent
        [charged] = await kernel.journal.read(types=["ReasoningCharged"])
        assert isinstance(charged.payload, ReasoningCharged)
        assert (charged.payload.tokens, charged.payload.amount, charged.payload.currency) == (
            {"m-large": 30},
            30,
            "USD",
        )
        assert charged.payload.pools == [thought.pool("clerk")]
        # The second thought takes the agent to 0.60 USD: what it led to is refused.
        assert await send(kernel, 1) is FlowStatus.ABORTED
        [rejected] = await kernel.journal.read(types=["ProposalRejected"])
        feedback = payload_of(rejected, ProposalRejected).feedback
        assert feedback.reason_code is ReasonCode.BUDGET_EXHAUSTED
        spent = kernel.projections.domain(Budgets).spent(
            thought.pool("clerk"), kernel.clock.now_ns()
        )
        assert spent == 60  # thought is spent, refused or not


async def test_usage_a_framework_reports_through_propose_is_charged_as_a_hosted_agents(
    tmp_path: Path,
) -> None:
    prices = {"m-large": ModelPrice(currency="USD", per_million=1_000_000)}
    thought = Budget(
        name="thought", ceiling=50, currency="USD", per="agent", window_s=86_400, reasoning=True
    )
    async with pay_kernel(tmp_path / "j.db", [pack(budgets=(thought,))], prices=prices) as kernel:
        await kernel.register(sender())

        async def pay(usage: object) -> ReasonCode | None:
            decision = await kernel.propose(
                "clerk",
                "pay.send",
                {"payee": "acme", "amount_cents": 100},
                explain="a framework's tool call",
                confidence=0.9,
                usage=usage,  # type: ignore[arg-type]  # what a caller may pass
            )
            return decision.reason_code

        assert await pay({"m-large": 30}) is None
        [charged] = payloads(
            await kernel.journal.read(types=["ReasoningCharged"]), ReasoningCharged
        )
        assert (charged.tokens, charged.amount, charged.pools) == (
            {"m-large": 30},
            30,
            [thought.pool("clerk")],
        )
        # Usage the wall does not admit counts as nothing; the call is judged as ever.
        assert await pay({"m-large": -5, 7: 3, "m-x": "lots"}) is None
        assert await pay({"m-large": 30}) is ReasonCode.BUDGET_EXHAUSTED


async def test_tokens_of_a_model_the_table_does_not_price_are_named_not_guessed(
    tmp_path: Path,
) -> None:
    prices = {"m-large": ModelPrice(currency="USD", per_million=1_000_000)}
    async with pay_kernel(tmp_path / "j.db", prices=prices) as kernel:
        await kernel.register(thinker(1_000, model="m-unknown"))
        assert await send(kernel, 1) is FlowStatus.CLOSED
        [charged] = payloads(
            await kernel.journal.read(types=["ReasoningCharged"]), ReasoningCharged
        )
        assert charged.unpriced == ["m-unknown"] and charged.amount == 0


async def test_an_escalation_over_a_money_threshold_reads_as_money(tmp_path: Path) -> None:
    """Trading 0.4.0's threshold is in USD: the person deciding reads dollars, not cents."""
    async with open_desk(tmp_path / "j.db", Bank(), packs=[TRADING]) as kernel:
        dfid = await escalated_order(kernel, quantity=300)
        [event] = await kernel.journal.read(dfid=dfid, types=["FlowEscalated"])
    assert isinstance(event.payload, FlowEscalated)
    assert event.payload.detail == ("trading.place_order: 30,000.00 USD is above 25,000.00 USD")


async def test_an_escalation_over_a_field_names_the_field_it_checked(tmp_path: Path) -> None:
    """A threshold on ``quantity`` says "quantity 300", never "amount 300" (issue 41)."""
    by_quantity = dataclasses.replace(
        TRADING, thresholds=(Threshold(PlaceOrder, amount="quantity", above=100),)
    )
    async with open_desk(tmp_path / "j.db", Bank(), packs=[by_quantity]) as kernel:
        dfid = await escalated_order(kernel, quantity=300)
        [event] = await kernel.journal.read(dfid=dfid, types=["FlowEscalated"])
    assert isinstance(event.payload, FlowEscalated)
    assert event.payload.detail == "trading.place_order: quantity 300 is above 100"
    assert "amount" not in event.payload.detail


@pytest.mark.parametrize("currency", ["usd", "US", "dollars"])
def test_a_threshold_in_no_currency_code_is_refused(currency: str) -> None:
    bad = dataclasses.replace(
        TRADING,
        thresholds=(Threshold(PlaceOrder, amount=notional_minor, above=1, currency=currency),),
    )
    with pytest.raises(PackError, match="no ISO 4217 code"):
        PolicyCatalog([bad])
