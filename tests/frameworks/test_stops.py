"""When a refusal ends a run, not a call: the gate's stops, and the demotion a pack budgets.

Framework-neutral (no framework installed is needed): each adapter ends its run on
what :func:`kernel.frameworks.stops` says (tests/frameworks/test_<framework>.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel import action_hash
from kernel.api.decisions import Decision, DecisionVerdict
from kernel.core.reasons import ReasonCode
from kernel.frameworks import STOPS, stops
from kernel.policy import EscalationBudget, PolicyPack
from policies.booking import BOOKING
from tests.frameworks.support import (
    CHEAP,
    OVER_LIMIT,
    REVISED,
    TOOL,
    Hotel,
    booking_kernel,
    proposals,
)

pytestmark = pytest.mark.anyio

ONE_AN_HOUR = dataclasses.replace(BOOKING, escalation_budget=EscalationBudget(capacity=1))


@given(st.sampled_from(list(DecisionVerdict)), st.sampled_from([*ReasonCode, None]))
def test_only_a_refusal_for_a_stopping_reason_stops(
    verdict: DecisionVerdict, code: ReasonCode | None
) -> None:
    decision = Decision(verdict=verdict, reason_code=code)
    assert stops(decision) == (verdict is DecisionVerdict.REFUSED and code in STOPS)


async def test_a_stopped_conversation_is_answered_by_the_gate_not_the_kernel(
    tmp_path: Path,
) -> None:
    async with booking_kernel(tmp_path / "j.db", Hotel(), max_attempts=2) as gate:
        codes = []
        for n in range(1, 6):
            decision = await gate.call(TOOL, OVER_LIMIT, conversation="c", tool_call_id=f"t{n}")
            codes.append(decision.reason_code)
        assert codes == [ReasonCode.RISK_LIMIT_EXCEEDED] + [ReasonCode.REASONING_EXHAUSTION] * 4
        assert gate.stop_of("c") is not None and gate.stop_of("other") is None
        assert await proposals(gate.kernel) == 2
        # Forgotten, the next call reaches the kernel, which keeps the stop on record.
        gate.forget("c")
        again = await gate.call(TOOL, CHEAP, conversation="c", tool_call_id="t6")
        assert again.reason_code is ReasonCode.REASONING_EXHAUSTION
        assert await proposals(gate.kernel) == 3


async def test_the_packs_escalation_budget_demotes_with_its_own_reason_code(
    tmp_path: Path,
) -> None:
    async with booking_kernel(tmp_path / "j.db", Hotel(), pack=ONE_AN_HOUR) as gate:
        first = await gate.call(TOOL, REVISED, conversation="a", tool_call_id="t1")
        assert first.verdict is DecisionVerdict.ESCALATED
        asked = await gate.call(TOOL, REVISED, conversation="b", tool_call_id="t1")
        # Asked as any escalation is; the desk then finds the budget spent and aborts it.
        second = await gate.kernel.await_decision(asked.dfid)
        assert second.verdict is DecisionVerdict.REFUSED
        assert second.reason_code is ReasonCode.ESCALATION_BUDGET_EXHAUSTED
        assert "escalated more than 1 times per 3600 s" in second.detail
        assert stops(second)
        # Later calls: refused AGENT_PASSIVE by the kernel, told the demotion's own code.
        later = await gate.call(TOOL, CHEAP, conversation="c", tool_call_id="t1")
        assert later.reason_code is ReasonCode.ESCALATION_BUDGET_EXHAUSTED and stops(later)
        assert later.detail.startswith("agent booker was demoted to PASSIVE")
        assert "--set ACTIVE" in later.detail
        assert str(gate.kernel.projections.agents["booker"].status) == "PASSIVE"


async def test_the_kernels_default_demotes_on_the_fourth_escalation(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db", Hotel()) as gate:
        asked = [
            await gate.call(TOOL, REVISED, conversation=f"c{n}", tool_call_id="t") for n in range(4)
        ]
        fourth = await gate.kernel.await_decision(asked[3].dfid)
        assert fourth.reason_code is ReasonCode.ESCALATION_BUDGET_EXHAUSTED
        still = [await gate.kernel.await_decision(d.dfid, 0) for d in asked[:3]]
        assert [d.verdict for d in still] == [DecisionVerdict.ESCALATED] * 3


def test_the_escalation_budget_enters_the_packs_hash_only_when_set() -> None:
    assert dataclasses.replace(BOOKING).hash == BOOKING.hash
    assert ONE_AN_HOUR.hash != BOOKING.hash
    other = dataclasses.replace(BOOKING, escalation_budget=EscalationBudget(capacity=2))
    assert other.hash not in (BOOKING.hash, ONE_AN_HOUR.hash)


@given(st.integers(max_value=0))
def test_an_escalation_budget_of_no_escalation_is_refused(capacity: int) -> None:
    with pytest.raises(ValueError, match="capacity"):
        EscalationBudget(capacity=capacity)


def test_a_pack_with_a_budget_is_a_pack() -> None:
    assert isinstance(ONE_AN_HOUR, PolicyPack)


async def test_an_operators_passive_stays_agent_passive(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db", Hotel()) as gate:
        await gate.kernel.set_agent_status("booker", "PASSIVE", operator="ana", reason="audit")
        said = await gate.call(TOOL, CHEAP, conversation="c", tool_call_id="t1")
        assert said.reason_code is ReasonCode.AGENT_PASSIVE and stops(said)


async def test_the_public_action_hash_approves_in_process(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db", Hotel()) as gate:
        asked = await gate.call(TOOL, REVISED, conversation="a", tool_call_id="t")
        cheap = await gate.call(TOOL, CHEAP, conversation="b", tool_call_id="t")
        assert action_hash(gate.kernel, cheap.dfid) is None  # executed: nothing waits
        bound = action_hash(gate.kernel, asked.dfid)
        assert bound is not None
        await gate.kernel.decide(
            asked.dfid, "approve", operator="ana", reason="ok", action_hash=bound
        )
        done = await gate.kernel.await_decision(asked.dfid)
        assert done.verdict is DecisionVerdict.EXECUTED
