"""Quorum approvals: M of a set of roles, distinct operators, the proposer and modifiers excluded.

Each vote is recorded (ApprovalVoted) bound to the action hash, the flow waits ("1 of 2,
waiting for a desk-head") until the vote that meets the quorum, and only then is the
action judged again and executed. A second vote by the same operator, a vote by the
proposer or a modifier, and a vote by an operator without a role the quorum names are
refused on record, and the kernel goes on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel import FlowStatus, Kernel, Outcome, ReasonCode
from kernel.core.events import ApprovalVoted, DecisionRefused, HumanDecided
from kernel.policy import Quorum
from kernel.testing import ManualClock, action_of
from tests.support.approvals_domain import TWO_ROLES, Payments, Send, pack, pay_kernel, sender

RISK, HEAD = ["risk"], ["desk-head"]


async def escalated(kernel: Kernel, cents: int = 250_000) -> str:
    """A send above the threshold, escalated; its DFID."""
    [dfid] = await kernel.trigger(f"pay.{cents}")
    assert (await kernel.wait_flow(dfid)).status is FlowStatus.ESCALATED
    return str(dfid)


async def vote(
    kernel: Kernel, dfid: str, who: str, roles: list[str], decision: str = "approve"
) -> Outcome:
    verdict = await kernel.decide(
        dfid,
        decision,
        operator=who,
        reason=f"{who} looked",
        action_hash=action_of(kernel, dfid),
        roles=roles,
    )
    return verdict.outcome


async def test_two_roles_two_people_and_each_vote_on_record(tmp_path: Path) -> None:
    payments = Payments()
    async with pay_kernel(
        tmp_path / "j.db", [pack(quorums=(TWO_ROLES,))], payments=payments
    ) as kernel:
        await kernel.register(sender())
        dfid = await escalated(kernel)
        [opened] = await kernel.journal.read(dfid=dfid, types=["FlowEscalated"])
        assert opened.payload.quorum is not None  # type: ignore[union-attr]
        assert opened.payload.quorum.roles == ["risk", "desk-head"]  # type: ignore[union-attr]

        first = await kernel.decide(
            dfid,
            "approve",
            operator="ana",
            reason="fine by risk",
            action_hash=action_of(kernel, dfid),
            roles=RISK,
        )
        assert first.outcome is Outcome.ESCALATED
        assert first.feedback is not None
        assert first.feedback.detail == "1 of 2, waiting for a desk-head"
        # Another risk officer does not make a desk head.
        assert await vote(kernel, dfid, "bo", RISK) is Outcome.ESCALATED
        assert kernel.flow(dfid).status is FlowStatus.ESCALATED  # type: ignore[union-attr]
        assert payments.calls == []
        assert await vote(kernel, dfid, "cy", HEAD) is Outcome.ACCEPTED
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.CLOSED
        assert len(payments.calls) == 1

        votes = [e.payload for e in await kernel.journal.read(dfid=dfid, types=["ApprovalVoted"])]
        assert all(isinstance(v, ApprovalVoted) for v in votes)
        assert [(v.operator, v.counted, v.met) for v in votes] == [  # type: ignore[union-attr]
            ("ana", ["ana"], False),
            ("bo", ["ana"], False),
            ("cy", ["ana", "cy"], True),
        ]
        action = opened.payload.action_hash  # type: ignore[union-attr]
        assert all(v.action_hash == action for v in votes)  # type: ignore[union-attr]
        [decided] = await kernel.journal.read(dfid=dfid, types=["HumanDecided"])
        assert isinstance(decided.payload, HumanDecided) and decided.payload.operator == "cy"


@pytest.mark.parametrize(
    ("who", "roles", "code"),
    [
        ("ana", RISK, ReasonCode.DUPLICATE_VOTE),  # ana voted first, below
        ("clerk", HEAD, ReasonCode.SELF_APPROVAL_FORBIDDEN),  # the proposer
        ("Clerk", HEAD, ReasonCode.SELF_APPROVAL_FORBIDDEN),  # the proposer, as a reader sees it
        ("dana", [], ReasonCode.UNAUTHORIZED),  # no role the quorum names
        ("eve", ["audit"], ReasonCode.UNAUTHORIZED),
    ],
)
async def test_a_quorum_is_never_met_by_one_operator_twice_nor_by_the_proposer(
    tmp_path: Path, who: str, roles: list[str], code: ReasonCode
) -> None:
    async with pay_kernel(tmp_path / "j.db", [pack(quorums=(TWO_ROLES,))]) as kernel:
        await kernel.register(sender())
        dfid = await escalated(kernel)
        assert await vote(kernel, dfid, "ana", RISK + HEAD) is Outcome.ESCALATED
        verdict = await kernel.decide(
            dfid,
            "approve",
            operator=who,
            reason="again",
            action_hash=action_of(kernel, dfid),
            roles=roles,
        )
        assert verdict.outcome is Outcome.REFUSED
        assert verdict.reason_code is code
        [refused] = await kernel.journal.read(dfid=dfid, types=["DecisionRefused"])
        assert isinstance(refused.payload, DecisionRefused)
        assert refused.payload.reason_code is code
        assert "1 of 2" in refused.payload.detail or code is ReasonCode.UNAUTHORIZED
        # Still waiting, and still able to be met by someone else.
        assert kernel.flow(dfid).status is FlowStatus.ESCALATED  # type: ignore[union-attr]
        assert await vote(kernel, dfid, "cy", HEAD) is Outcome.ACCEPTED
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED


async def test_an_operator_holding_both_roles_is_placed_where_the_others_leave_room(
    tmp_path: Path,
) -> None:
    async with pay_kernel(tmp_path / "j.db", [pack(quorums=(TWO_ROLES,))]) as kernel:
        await kernel.register(sender())
        dfid = await escalated(kernel)
        assert await vote(kernel, dfid, "ana", RISK + HEAD) is Outcome.ESCALATED
        # bo holds risk only: ana is counted as the desk head.
        assert await vote(kernel, dfid, "bo", RISK) is Outcome.ACCEPTED
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED


async def test_whoever_modified_the_action_may_not_vote_on_it(tmp_path: Path) -> None:
    payments = Payments()
    async with pay_kernel(
        tmp_path / "j.db", [pack(quorums=(TWO_ROLES,))], payments=payments
    ) as kernel:
        await kernel.register(sender())
        dfid = await escalated(kernel)
        modified = await kernel.decide(
            dfid,
            "modify",
            operator="ana",
            reason="pay part of it",
            action_hash=action_of(kernel, dfid),
            params={"payee": "acme", "amount_cents": 150_000},
            roles=RISK,
        )
        # Still above the threshold: the modified action needs its own quorum, without ana.
        assert modified.outcome is Outcome.ESCALATED
        assert kernel.flow(dfid).proposal.params["amount_cents"] == 150_000  # type: ignore[union-attr]
        verdict = await kernel.decide(
            dfid,
            "approve",
            operator="ana",
            reason="mine",
            action_hash=action_of(kernel, dfid),
            roles=RISK,
        )
        assert verdict.reason_code is ReasonCode.SELF_APPROVAL_FORBIDDEN
        assert "modified" in (verdict.feedback.detail if verdict.feedback else "")
        assert await vote(kernel, dfid, "bo", RISK) is Outcome.ESCALATED
        assert await vote(kernel, dfid, "cy", HEAD) is Outcome.ACCEPTED
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        assert [c.params["amount_cents"] for c in payments.calls] == [150_000]


async def test_the_proposer_may_still_withdraw_its_own_flow(tmp_path: Path) -> None:
    async with pay_kernel(tmp_path / "j.db", [pack(quorums=(TWO_ROLES,))]) as kernel:
        await kernel.register(sender())
        dfid = await escalated(kernel)
        assert await vote(kernel, dfid, "clerk", [], "reject") is Outcome.ABORTED
        flow = await kernel.wait_flow(dfid)
        assert flow.reason_code is ReasonCode.HUMAN_REJECTED


async def test_a_rejection_ends_it_or_counts_as_a_vote_as_the_pack_says(tmp_path: Path) -> None:
    counting = Quorum(required=2, on_reject="vote", kind=Send)
    async with pay_kernel(tmp_path / "j.db", [pack(quorums=(counting,))]) as kernel:
        await kernel.register(sender())
        dfid = await escalated(kernel)
        assert await vote(kernel, dfid, "ana", [], "reject") is Outcome.ESCALATED
        assert await vote(kernel, dfid, "bo", [], "approve") is Outcome.ESCALATED
        assert await vote(kernel, dfid, "cy", [], "reject") is Outcome.ABORTED
        flow = await kernel.wait_flow(dfid)
        assert flow.reason_code is ReasonCode.HUMAN_REJECTED
        votes = await kernel.journal.read(dfid=dfid, types=["ApprovalVoted"])
        assert [v.payload.vote for v in votes] == ["reject", "approve", "reject"]  # type: ignore[union-attr]
    ending = Quorum(required=2, kind=Send)
    async with pay_kernel(tmp_path / "k.db", [pack(quorums=(ending,))]) as kernel:
        await kernel.register(sender())
        dfid = await escalated(kernel)
        assert await vote(kernel, dfid, "ana", [], "approve") is Outcome.ESCALATED
        assert await vote(kernel, dfid, "bo", [], "reject") is Outcome.ABORTED


async def test_each_vote_expires_on_its_own_on_the_recorded_clock(tmp_path: Path) -> None:
    clock = ManualClock()
    fleeting = Quorum(required=2, vote_ttl_s=600, kind=Send)
    async with pay_kernel(tmp_path / "j.db", [pack(quorums=(fleeting,))], clock=clock) as kernel:
        await kernel.register(sender())
        dfid = await escalated(kernel)
        assert await vote(kernel, dfid, "ana", []) is Outcome.ESCALATED
        clock.advance(601)
        # ana's vote is too old to count: bo's makes one of two.
        verdict = await kernel.decide(
            dfid, "approve", operator="bo", reason="ok", action_hash=action_of(kernel, dfid)
        )
        assert verdict.outcome is Outcome.ESCALATED
        assert verdict.feedback is not None and verdict.feedback.detail.startswith("1 of 2")
        # An expired vote may be given again; now two stand.
        assert await vote(kernel, dfid, "ana", []) is Outcome.ACCEPTED
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED


async def test_a_quorum_above_a_size_only(tmp_path: Path) -> None:
    big = Quorum(required=2, kind=Send, amount="amount_cents", above=1_000_000)
    async with pay_kernel(tmp_path / "j.db", [pack(quorums=(big,))]) as kernel:
        await kernel.register(sender())
        small = await escalated(kernel, 200_000)
        assert await vote(kernel, small, "ana", []) is Outcome.ACCEPTED
        large = await escalated(kernel, 2_000_000)
        assert await vote(kernel, large, "ana", []) is Outcome.ESCALATED
        assert await vote(kernel, large, "bo", []) is Outcome.ACCEPTED
