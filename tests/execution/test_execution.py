"""The execution engine: retries and budgets, exactly-once effects, constraints, sagas."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernel import FlowStatus, Kernel, Outcome, ReasonCode, Verdict
from kernel.adapters import AdapterError, Receipt, RetryPolicy
from kernel.audit import open_journal, payload_of
from kernel.core.events import (
    Draft,
    ExecutionRefused,
    ExecutionRetried,
    ExecutionSucceeded,
    FlowEscalated,
    ProposalAccepted,
    ProposalRejected,
)
from kernel.runtime.actors import Reply
from kernel.runtime.messages import Execute
from kernel.testing import action_of, flow_types
from tests.support.execution_domain import (
    After,
    Desk,
    LookupDesk,
    Order,
    Ping,
    Trip,
    Watch,
    agent,
    desk_kernel,
)
from tests.support.helpers import flow_of, manual_clock

STEADY = RetryPolicy(max_attempts=4, base_s=1.0, factor=2.0, jitter=0.0)


def pending_key(kernel: Kernel, dfid: str) -> str:
    """Return the idempotency key of the intent the flow is executing."""
    pending = flow_of(kernel, dfid).pending
    assert pending is not None, f"flow {dfid} has no intent in flight"
    return pending.key


def transient(n: int) -> list[Exception]:
    # Refused before the effect: the desk knows nothing happened.
    return [
        AdapterError("503 from upstream", transient=True, outcome_unknown=False) for _ in range(n)
    ]


async def test_transient_errors_are_retried_on_the_backoff_schedule(tmp_path: Path) -> None:
    desk = Desk({"desk.ping": transient(3)}, retry_policy=STEADY)
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        watch = Watch(kernel)
        await kernel.register(agent(Ping(text="hi")))
        [dfid] = await kernel.trigger("desk.go")
        for n, delay in enumerate([1, 2, 4], 1):
            [*_, last] = await watch.events(dfid, "ExecutionRetried", n)
            retried = payload_of(last, ExecutionRetried)
            assert (retried.attempt, retried.delay_ns) == (n, delay * 10**9)
            # Nothing happens until the clock reaches the recorded due time.
            assert len(desk.calls) == n
            manual_clock(kernel).advance(delay)
        flow = await kernel.wait_flow(dfid)

        assert flow.status is FlowStatus.CLOSED
        assert len(desk.calls) == 4 and len({c.key for c in desk.calls}) == 1
        assert len(desk.effects) == 1


def test_jitter_is_seeded_and_only_shortens_the_delay() -> None:
    policy = RetryPolicy(base_s=1.0, factor=2.0, max_s=5.0, jitter=0.5)
    first = [policy.delay_s(n, random.Random(3)) for n in range(1, 6)]
    again = [policy.delay_s(n, random.Random(3)) for n in range(1, 6)]
    assert first == again
    for n, delay in enumerate(first, 1):
        full = min(5.0, 2.0 ** (n - 1))
        assert full * 0.5 <= delay <= full


async def test_a_spent_budget_escalates_and_a_human_override_retries_the_same_key(
    tmp_path: Path,
) -> None:
    policy = RetryPolicy(max_attempts=2, base_s=1.0, jitter=0.0)
    desk = Desk({"desk.ping": transient(2)}, retry_policy=policy)
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        watch = Watch(kernel)
        await kernel.register(agent(Ping(text="hi")))
        [dfid] = await kernel.trigger("desk.go")
        await watch.events(dfid, "ExecutionRetried")
        manual_clock(kernel).advance(1)
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.ESCALATED
        assert flow.reason_code is ReasonCode.EXECUTION_FAILED
        assert "2 attempts failed" in flow.detail

        verdict = await kernel.decide(
            dfid,
            "override",
            operator="ana",
            reason="upstream is back",
            action_hash=action_of(kernel, dfid),
        )
        assert verdict.outcome is Outcome.ACCEPTED
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        assert len(desk.calls) == 3 and len({c.key for c in desk.calls}) == 1


async def test_a_spent_budget_aborts_when_the_policy_says_so(tmp_path: Path) -> None:
    policy = RetryPolicy(max_attempts=1, on_exhausted="abort")
    desk = Desk({"desk.ping": transient(1)})
    async with desk_kernel(tmp_path / "j.db", desk, retry=policy) as kernel:
        await kernel.register(agent(Ping(text="hi")))
        [dfid] = await kernel.trigger("desk.go")
        flow = await kernel.wait_flow(dfid)
        assert (flow.status, flow.reason_code) == (FlowStatus.ABORTED, ReasonCode.EXECUTION_FAILED)
        assert "ExecutionRetried" not in await flow_types(kernel, dfid)


async def test_a_terminal_error_fails_at_once(tmp_path: Path) -> None:
    desk = Desk({"desk.ping": [AdapterError("account closed")]}, retry_policy=STEADY)
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        await kernel.register(agent(Ping(text="hi")))
        [dfid] = await kernel.trigger("desk.go")
        flow = await kernel.wait_flow(dfid)

        assert (flow.status, flow.reason_code) == (FlowStatus.ABORTED, ReasonCode.EXECUTION_FAILED)
        assert flow.detail == "account closed"
        assert len(desk.calls) == 1
        types = await flow_types(kernel, dfid)
        assert types[-3:] == ["ExecutionStarted", "ExecutionFailed", "FlowAborted"]


@pytest.mark.parametrize("desk_type", [Desk, LookupDesk])
async def test_a_timeout_after_the_effect_does_not_double_it(
    tmp_path: Path, desk_type: type[Desk]
) -> None:
    lost = After(AdapterError("read timeout", transient=True))
    desk = desk_type({"desk.ping": [lost]}, retry_policy=STEADY)
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        watch = Watch(kernel)
        await kernel.register(agent(Ping(text="hi")))
        [dfid] = await kernel.trigger("desk.go")
        await watch.events(dfid, "ExecutionRetried")
        manual_clock(kernel).advance(1)
        flow = await kernel.wait_flow(dfid)

        assert flow.status is FlowStatus.CLOSED
        assert len(desk.effects) == 1
        [event] = await kernel.journal.read(dfid=dfid, types=["ExecutionSucceeded"])
        succeeded = payload_of(event, ExecutionSucceeded)
        if desk_type is LookupDesk:
            # The retry asked first and found the effect: execute ran once only.
            assert len(desk.calls) == 1 and succeeded.recovered
        else:
            assert len(desk.calls) == 2 and not succeeded.recovered


async def test_a_delivery_while_the_call_is_in_flight_never_calls_twice(tmp_path: Path) -> None:
    gate = anyio.Event()
    desk = Desk(gates={"desk.ping": gate})
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        await kernel.register(agent(Ping(text="hi")))
        [dfid] = await kernel.trigger("desk.go")
        await kernel.wait_flow(dfid, {FlowStatus.EXECUTING})
        for _ in range(3):
            reply: Reply[Verdict] = Reply()
            await kernel.actors.execution.send(Execute(dfid=dfid, reply=reply))
            assert (await reply.wait()).outcome is Outcome.ACCEPTED
        gate.set()
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        assert len(desk.calls) == 1
        assert (await flow_types(kernel, dfid)).count("DuplicateSuppressed") == 3


def order(**kw: Any) -> Order:
    fields: dict[str, Any] = dict(
        symbol="ACME", side="buy", quantity=10, reference_price="100.00", max_slippage_bps=50
    )
    return Order(**{**fields, **kw})


@pytest.mark.parametrize(
    ("price", "state", "policy", "bound"),
    [
        ("101.00", "open", order(), "max_slippage_bps"),
        ("99.00", "open", order(side="sell"), "max_slippage_bps"),
        ("100.30", "open", order(limit_price="100.20"), "limit_price"),
        ("100.00", "halted", order(required_market_state="open"), "required_market_state"),
    ],
)
async def test_the_world_moving_past_a_bound_refuses_execution(
    tmp_path: Path, price: str, state: str, policy: Order, bound: str
) -> None:
    desk = Desk(price=price, market_state=state)
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        await kernel.register(agent(policy))
        [dfid] = await kernel.trigger("desk.go")
        flow = await kernel.wait_flow(dfid)

        assert flow.status is FlowStatus.ABORTED
        assert flow.reason_code is ReasonCode.EXECUTION_CONSTRAINT_VIOLATED
        assert desk.calls == [] and desk.quotes == 1
        [event] = await kernel.journal.read(dfid=dfid, types=["ExecutionRefused"])
        refused = payload_of(event, ExecutionRefused)
        assert refused.bound == bound
        # Both prices are on the record: the one decided on and the one found.
        assert refused.bounds["reference_price"] == "100.00"
        assert refused.observed["price"] == price


async def test_a_price_within_the_bounds_executes(tmp_path: Path) -> None:
    desk = Desk(price="100.40")
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        await kernel.register(agent(order(limit_price="100.50")))
        [dfid] = await kernel.trigger("desk.go")
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        assert desk.calls[0].bounds["max_slippage_bps"] == 50


async def test_an_intent_past_its_validity_when_executed_is_refused(tmp_path: Path) -> None:
    desk = Desk()
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        await kernel.register(agent(Ping(text="hi"), confidence=0.2))
        [dfid] = await kernel.trigger("desk.go")
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.ESCALATED
        manual_clock(kernel).advance(120)  # the human answers after the 60 s window
        await kernel.decide(
            dfid, "override", operator="ana", reason="fine", action_hash=action_of(kernel, dfid)
        )
        flow = await kernel.wait_flow(dfid)

        assert flow.reason_code is ReasonCode.EXECUTION_CONSTRAINT_VIOLATED
        [event] = await kernel.journal.read(dfid=dfid, types=["ExecutionRefused"])
        assert payload_of(event, ExecutionRefused).bound == "valid_until_ns" and desk.calls == []


LEGS = ["flight", "hotel", "car"]


@pytest.mark.parametrize("failing", [1, 2, 3])
async def test_a_failed_saga_step_compensates_exactly_the_completed_steps_in_reverse(
    tmp_path: Path, failing: int
) -> None:
    leg = LEGS[failing - 1]
    desk = Desk({f"book_{leg}": [AdapterError(f"no {leg} available")]})
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        await kernel.register(agent(Trip(legs=LEGS)))
        [dfid] = await kernel.trigger("desk.go")
        flow = await kernel.wait_flow(dfid)

        booked = [f"book_{x}" for x in LEGS[:failing]]
        undone = [f"undo:book_{x}" for x in reversed(LEGS[: failing - 1])]
        assert desk.names() == booked + undone
        assert len({c.key for c in desk.calls}) == len(desk.calls)
        if failing == 1:
            # Nothing took effect: nothing to undo, the flow simply fails.
            assert (flow.status, flow.reason_code) == (
                FlowStatus.ABORTED,
                ReasonCode.EXECUTION_FAILED,
            )
            return
        assert (flow.status, flow.reason_code) == (FlowStatus.COMPENSATED, ReasonCode.COMPENSATED)
        assert (flow.done, flow.undone) == (failing - 1, failing - 1)
        types = await flow_types(kernel, dfid)
        assert types[types.index("FlowDirty") :] == [
            "FlowDirty",
            *["CompensationStarted", "CompensationSucceeded"] * (failing - 1),
            "FlowCompensated",
        ]


async def test_a_saga_that_succeeds_runs_every_step_once(tmp_path: Path) -> None:
    desk = Desk()
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        await kernel.register(agent(Trip(legs=LEGS)))
        [dfid] = await kernel.trigger("desk.go")
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.CLOSED and flow.done == 3
        assert desk.names() == ["book_flight", "book_hotel", "book_car"]
        assert [c.step for c in desk.calls] == [1, 2, 3]


async def test_a_failing_compensation_escalates_with_the_exact_partial_state(
    tmp_path: Path,
) -> None:
    desk = Desk(
        {
            "book_car": [AdapterError("no car")],
            "undo:book_flight": [AdapterError("non-refundable")],
        }
    )
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        await kernel.register(agent(Trip(legs=LEGS)))
        [dfid] = await kernel.trigger("desk.go")
        flow = await kernel.wait_flow(dfid)

        assert (flow.status, flow.reason_code) == (
            FlowStatus.ESCALATED,
            ReasonCode.EXECUTION_FAILED,
        )
        assert desk.names() == [
            "book_flight",
            "book_hotel",
            "book_car",
            "undo:book_hotel",
            "undo:book_flight",
        ]
        [event] = await kernel.journal.read(dfid=dfid, types=["FlowEscalated"])
        escalated = payload_of(event, FlowEscalated)
        assert escalated.partial == {
            "in_effect": [1],
            "undone": [2],
            "failed_step": 3,
            "failed_compensation": 1,
        }
        assert "non-refundable" in escalated.detail
        # A human closes it; executing it again is refused, not guessed.
        verdict = await kernel.decide(
            dfid, "override", operator="ana", reason="retry", action_hash=action_of(kernel, dfid)
        )
        assert verdict.outcome is Outcome.ACCEPTED
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.ABORTED and len(desk.calls) == 5


async def test_an_agent_with_a_dirty_flow_is_passive_until_it_converges(tmp_path: Path) -> None:
    gate = anyio.Event()
    desk = Desk({"book_hotel": [AdapterError("full")]}, gates={"undo:book_flight": gate})
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        clerk = agent(Trip(legs=["flight", "hotel"]), Ping(text="next"), max_attempts=1)
        await kernel.register(clerk)
        [first] = await kernel.trigger("desk.go")
        await kernel.wait_flow(first, {FlowStatus.DIRTY})
        assert kernel.projections.unsettled_flows("clerk") == [first]

        [second] = await kernel.trigger("desk.go")
        refused = await kernel.wait_flow(second)
        assert refused.status is FlowStatus.ABORTED
        [event] = await kernel.journal.read(dfid=second, types=["ProposalRejected"])
        feedback = payload_of(event, ProposalRejected).feedback
        assert feedback.reason_code is ReasonCode.AGENT_PASSIVE
        assert first in feedback.detail

        gate.set()
        assert (await kernel.wait_flow(first)).status is FlowStatus.COMPENSATED
        assert kernel.projections.unsettled_flows("clerk") == []
        [third] = await kernel.trigger("desk.go")
        assert (await kernel.wait_flow(third)).status is FlowStatus.CLOSED


async def test_an_intent_in_flight_at_shutdown_is_resumed_with_the_same_key(tmp_path: Path) -> None:
    gate = anyio.Event()
    first = Desk(gates={"desk.ping": gate})
    async with desk_kernel(tmp_path / "j.db", first) as kernel:
        await kernel.register(agent(Ping(text="hi")))
        [dfid] = await kernel.trigger("desk.go")
        await kernel.wait_flow(dfid, {FlowStatus.EXECUTING})
        # Started, and the effect happened; the answer never came back.
        key = pending_key(kernel, dfid)
        first.effects[key] = Receipt(external_id="desk.ping-1")

    again = LookupDesk()
    again.effects = dict(first.effects)
    async with desk_kernel(tmp_path / "j.db", again) as kernel:
        flow = await kernel.wait_flow(dfid)
        assert (flow.status, flow.external_id) == (FlowStatus.CLOSED, "desk.ping-1")
        assert again.lookups == [key] and again.calls == []
        [event] = await kernel.journal.read(dfid=dfid, types=["ExecutionSucceeded"])
        assert payload_of(event, ExecutionSucceeded).recovered

    # Without lookup the same key is simply called again (the system deduplicates).
    plain = Desk()
    async with desk_kernel(tmp_path / "k.db", Desk(gates={"desk.ping": anyio.Event()})) as kernel:
        await kernel.register(agent(Ping(text="hi")))
        [other] = await kernel.trigger("desk.go")
        await kernel.wait_flow(other, {FlowStatus.EXECUTING})
        key = pending_key(kernel, other)
    async with desk_kernel(tmp_path / "k.db", plain) as kernel:
        assert (await kernel.wait_flow(other)).status is FlowStatus.CLOSED
        assert [c.key for c in plain.calls] == [key]


async def test_a_flow_left_accepted_but_never_started_is_executed_on_start(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with desk_kernel(path, Desk()) as kernel:
        await kernel.register(agent(Ping(text="hi"), confidence=0.2))
        [dfid] = await kernel.trigger("desk.go")
        flow = await kernel.wait_flow(dfid)
    # A run that recorded the acceptance and died before the engine heard of it.
    async with open_journal(path) as journal:
        await journal.append(
            [
                Draft(
                    payload=ProposalAccepted(attempt=flow.attempts, by_human=True),
                    dfid=dfid,
                    agent_id=flow.agent_id,
                )
            ]
        )
    desk = Desk()
    async with desk_kernel(path, desk) as kernel:
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        assert len(desk.calls) == 1
