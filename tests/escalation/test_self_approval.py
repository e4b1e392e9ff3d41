"""Four eyes: the proposer of a flow may not decide on it, unless its pack says so (recorded).

An operator and an agent of one name are one principal (kernel.escalation.same_principal):
an MCP principal that proposes as agent ``ide`` and decides as operator ``ide`` is refused
with SELF_APPROVAL_FORBIDDEN, recorded; a rejection by the proposer (a withdrawal) is not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel import FlowStatus, Kernel, Outcome, ReasonCode
from kernel.audit import payloads
from kernel.core.events import DecisionRefused, HumanDecided
from kernel.policy import PolicyPack
from kernel.testing import action_of
from tests.support.helpers import PACK, ScriptedAgent, flow_of, kernel_for, transfer
from tests.support.principals import LOCAL

LENIENT = PolicyPack(
    name=PACK.name,
    version=PACK.version,
    kinds=PACK.kinds,
    escalate_below_confidence=PACK.escalate_below_confidence,
    self_approval=True,
)


async def escalated_flow(kernel: Kernel) -> str:
    await kernel.register(ScriptedAgent(steps=[transfer(5_000, confidence=0.2)] * 3))
    [dfid] = await kernel.trigger("bank.invoice")
    assert (await kernel.wait_flow(dfid)).status is FlowStatus.ESCALATED
    return str(dfid)


@pytest.mark.parametrize("operator", ["clerk", "Clerk", "ｃｌｅｒｋ", " clerk "])  # noqa: RUF001
async def test_the_proposer_may_not_approve_its_own_flow(tmp_path: Path, operator: str) -> None:
    async with kernel_for(tmp_path / "j.db") as kernel:
        dfid = await escalated_flow(kernel)
        action = action_of(kernel, dfid)
        for decision in ("approve", "modify"):
            verdict = await kernel.decide(
                dfid,
                decision,
                operator=operator,
                reason="mine",
                action_hash=action,
                params={"account": "acc-1", "amount_cents": 1},
            )
            assert verdict.outcome is Outcome.REFUSED
            assert verdict.feedback is not None
            assert verdict.feedback.reason_code is ReasonCode.SELF_APPROVAL_FORBIDDEN
        assert flow_of(kernel, dfid).status is FlowStatus.ESCALATED
        refused = await kernel.journal.read(types=["DecisionRefused"])
        assert [p.reason_code for p in payloads(refused, DecisionRefused)] == [
            ReasonCode.SELF_APPROVAL_FORBIDDEN
        ] * 2
        assert all(
            isinstance(e.payload, DecisionRefused) and e.payload.via == "api" for e in refused
        )
        # Another operator approves; the proposer could have withdrawn it instead.
        verdict = await kernel.decide(
            dfid, "approve", operator="ana", reason="ok", action_hash=action
        )
        assert verdict.outcome is Outcome.ACCEPTED
        [decided] = await kernel.journal.read(types=["HumanDecided"])
        assert isinstance(decided.payload, HumanDecided)
        assert (decided.payload.via, decided.payload.signer, decided.payload.self_approved) == (
            "api",
            "",
            False,
        )


async def test_the_proposer_may_withdraw_its_own_flow(tmp_path: Path) -> None:
    async with kernel_for(tmp_path / "j.db") as kernel:
        dfid = await escalated_flow(kernel)
        verdict = await kernel.decide(
            dfid,
            "reject",
            operator="clerk",
            reason="changed my mind",
            action_hash=action_of(kernel, dfid),
        )
        assert verdict.outcome is Outcome.ABORTED


async def test_a_pack_may_allow_self_approval_and_the_record_says_so(tmp_path: Path) -> None:
    assert LENIENT.hash != PACK.hash  # the setting is part of what the pack's hash covers
    from kernel import open_kernel
    from kernel.config import KernelConfig, Ports
    from kernel.testing import ManualClock, SeededIds
    from tests.support.helpers import Bank

    async with open_kernel(
        tmp_path / "j.db",
        packs=[LENIENT],
        adapters={"bank": Bank()},
        allow=["clerk"],
        config=KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(), ids=SeededIds(7))),
    ) as kernel:
        dfid = await escalated_flow(kernel)
        verdict = await kernel.decide(
            dfid, "approve", operator="clerk", reason="mine", action_hash=action_of(kernel, dfid)
        )
        assert verdict.outcome is Outcome.ACCEPTED
        [decided] = await kernel.journal.read(types=["HumanDecided"])
        assert isinstance(decided.payload, HumanDecided) and decided.payload.self_approved
