"""An approval judged again when its action is about to execute: the same Policy, Context and Time.

The issue's case with the shipped trading pack: a 300-lot order escalated under 0.3.0
(notional above 25,000.00), trading 0.3.1 caps the quantity at 50, and the human then
approves with the action's hash. The order is refused (APPROVAL_SUPERSEDED), both pack
versions on record, the broker never called; a pack that says so escalates it again
instead, and a modification to 50 lots then executes. A change that still passes
(a looser threshold) lets the approval stand; a new quorum asks for new votes.
"""

from __future__ import annotations

import dataclasses
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from agents_sdk import Agent, Manifest, Proposal
from kernel import FlowStatus, Kernel, Outcome, ReasonCode, open_kernel
from kernel.audit import payloads
from kernel.config import KernelConfig, Ports
from kernel.core.events import ApprovalSuperseded, FlowEscalated, ProposalAccepted
from kernel.policy import PolicyPack, Quorum, Range, Threshold
from kernel.policy.contracts import WorkingContext
from kernel.testing import ManualClock, SeededIds, action_of
from policies.trading import PlaceOrder, notional_minor
from policies.trading_0_3 import TRADING_0_3 as TRADING
from tests.support.helpers import Bank
from tests.support.principals import LOCAL

PRICES = {"market.ACME.price": "100.00"}

CAPPED = dataclasses.replace(
    TRADING,
    version="0.3.1",
    invariants=(*TRADING.invariants, Range(PlaceOrder, "quantity", min=1, max=50)),
)
"""Trading 0.3.1: no order above 50 lots."""


class Trader(Agent):
    """Buys ``quantity`` ACME at 100.00 in every flow."""

    def __init__(self, quantity: int) -> None:
        self.manifest = Manifest(
            agent_id="trader",
            version="1.0.0",
            capabilities=["trading.place_order"],
            subscriptions=["market"],
            max_attempts=1,
        )
        self.quantity = quantity

    async def decide(self, ctx: WorkingContext) -> Proposal:
        order = {"symbol": "ACME", "side": "buy", "quantity": self.quantity}
        return ctx.propose(
            {"kind": "trading.place_order", **order, "limit_price": "100.00"},
            explain=f"buy {self.quantity} ACME",
            confidence=0.9,
            valid_for_s=3600,
        )


async def escalated_order(kernel: Kernel, quantity: int = 300) -> str:
    await kernel.register(Trader(quantity))
    [dfid] = await kernel.trigger("market.ACME", PRICES)
    flow = await kernel.wait_flow(dfid)
    assert (flow.status, flow.reason_code) == (FlowStatus.ESCALATED, ReasonCode.APPROVAL_REQUIRED)
    return str(dfid)


def open_desk(
    path: Path, broker: Bank, packs: list[PolicyPack] | None = None
) -> AbstractAsyncContextManager[Kernel]:
    return open_kernel(
        path,
        packs=packs or [TRADING],
        adapters={"broker": broker, "ledger": Bank()},
        allow=["trader"],
        config=KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(), ids=SeededIds(5))),
    )


async def test_an_order_approved_under_0_3_0_is_refused_once_0_3_1_caps_it(tmp_path: Path) -> None:
    broker = Bank()
    async with open_desk(tmp_path / "j.db", broker) as kernel:
        dfid = await escalated_order(kernel)
        action = action_of(kernel, dfid)
        assert action is not None  # an escalated flow waits on its action's hash
        await kernel.load_pack(CAPPED, operator="risk", reason="cap orders at 50 lots")
        verdict = await kernel.decide(
            dfid, "approve", operator="ana", reason="looks fine", action_hash=action
        )
        assert verdict.outcome is Outcome.ABORTED
        assert verdict.reason_code is ReasonCode.APPROVAL_SUPERSEDED
        flow = await kernel.wait_flow(dfid)
        assert (flow.status, flow.reason_code) == (
            FlowStatus.ABORTED,
            ReasonCode.APPROVAL_SUPERSEDED,
        )
        assert "trading 0.3.0" in flow.detail and "trading 0.3.1" in flow.detail
        [event] = await kernel.journal.read(dfid=dfid, types=["ApprovalSuperseded"])
        superseded = event.payload
        assert isinstance(superseded, ApprovalSuperseded)
        assert superseded.approved == TRADING.ref
        assert superseded.current == CAPPED.ref
        assert superseded.action_hash.startswith(action)
        assert (superseded.reason_code, superseded.layer, superseded.outcome) == (
            ReasonCode.RISK_LIMIT_EXCEEDED,
            "rules",
            "refused",
        )
        assert broker.calls == []
        # What the order held of the desk's cash went back when it was refused.
        assert kernel.projections.reservations.get(dfid) is None
        assert kernel.projections.held.get("cash:desk", 0) == 0


async def test_a_pack_may_escalate_a_superseded_approval_again(tmp_path: Path) -> None:
    escalating = dataclasses.replace(CAPPED, on_superseded="escalate")
    broker = Bank()
    async with open_desk(tmp_path / "j.db", broker) as kernel:
        dfid = await escalated_order(kernel)
        first = action_of(kernel, dfid)
        await kernel.load_pack(escalating, operator="risk", reason="cap orders at 50 lots")
        verdict = await kernel.decide(
            dfid, "approve", operator="ana", reason="ok", action_hash=first
        )
        assert verdict.outcome is Outcome.ESCALATED
        assert verdict.reason_code is ReasonCode.APPROVAL_SUPERSEDED
        flow = kernel.flow(dfid)
        assert flow is not None and flow.status is FlowStatus.ESCALATED
        escalations = await kernel.journal.read(dfid=dfid, types=["FlowEscalated"])
        last = escalations[-1].payload
        assert isinstance(last, FlowEscalated)
        assert last.reason_code is ReasonCode.APPROVAL_SUPERSEDED and last.version == "0.3.1"
        # A new approval is bound to the action under the new pack: the old hash names nothing.
        assert action_of(kernel, dfid) != first
        stale = await kernel.decide(dfid, "approve", operator="ana", reason="ok", action_hash=first)
        assert stale.reason_code is ReasonCode.ACTION_MISMATCH
        modified = await kernel.decide(
            dfid,
            "modify",
            operator="ana",
            reason="50 lots, as the cap says",
            action_hash=action_of(kernel, dfid),
            params={"symbol": "ACME", "side": "buy", "quantity": 50, "limit_price": "100.00"},
        )
        assert modified.outcome is Outcome.ACCEPTED
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        assert [c.params["quantity"] for c in broker.calls] == [50]


async def test_an_approval_still_good_under_a_looser_pack_executes(tmp_path: Path) -> None:
    looser = dataclasses.replace(
        TRADING,
        version="0.3.1",
        thresholds=(Threshold(PlaceOrder, amount=notional_minor, above=2_000_000),),
    )
    broker = Bank()
    async with open_desk(tmp_path / "j.db", broker) as kernel:
        dfid = await escalated_order(kernel)
        await kernel.load_pack(looser, operator="risk", reason="lower the threshold")
        verdict = await kernel.decide(
            dfid, "approve", operator="ana", reason="ok", action_hash=action_of(kernel, dfid)
        )
        assert verdict.outcome is Outcome.ACCEPTED
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        assert len(broker.calls) == 1
        [accepted] = payloads(
            await kernel.journal.read(dfid=dfid, types=["ProposalAccepted"]), ProposalAccepted
        )
        assert accepted.rechecked and accepted.pack == looser.hash


async def test_a_quorum_added_later_asks_for_new_votes(tmp_path: Path) -> None:
    stricter = dataclasses.replace(
        TRADING,
        version="0.3.1",
        quorums=(Quorum(required=2, kind=PlaceOrder, name="four eyes"),),
    )
    broker = Bank()
    async with open_desk(tmp_path / "j.db", broker) as kernel:
        dfid = await escalated_order(kernel)
        await kernel.load_pack(stricter, operator="risk", reason="four eyes on large orders")
        verdict = await kernel.decide(
            dfid, "approve", operator="ana", reason="ok", action_hash=action_of(kernel, dfid)
        )
        assert verdict.outcome is Outcome.ABORTED  # 0.3.1 refuses what one operator approved
        assert broker.calls == []
    escalating = dataclasses.replace(stricter, on_superseded="escalate")
    async with open_desk(tmp_path / "k.db", broker) as kernel:
        dfid = await escalated_order(kernel)
        await kernel.load_pack(escalating, operator="risk", reason="four eyes")
        verdict = await kernel.decide(
            dfid, "approve", operator="ana", reason="ok", action_hash=action_of(kernel, dfid)
        )
        assert verdict.outcome is Outcome.ESCALATED
        [_, again] = payloads(
            await kernel.journal.read(dfid=dfid, types=["FlowEscalated"]), FlowEscalated
        )
        assert again.quorum is not None and again.quorum.required == 2
        assert again.reason_code is ReasonCode.APPROVAL_REQUIRED
        for who in ("ana", "bo"):
            await kernel.decide(
                dfid, "approve", operator=who, reason="ok", action_hash=action_of(kernel, dfid)
            )
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        assert len(broker.calls) == 1
