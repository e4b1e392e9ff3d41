"""Standing grants: approvals given before the proposals, scoped, counted, expiring, revocable.

A proposal that would escalate for approval and lies within a live grant proceeds,
consuming one use, and its record names the grant (ProposalAccepted.grant, GrantUsed).
Uses, money and the window are exact however many proposals race for them: the DIM
judges one at a time and counts what its batch staged.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel import FlowStatus, InputInvalid, Kernel, ReasonCode
from kernel.core.events import GrantUsed, InputRefused, ProposalAccepted
from kernel.policy import Quorum
from kernel.testing import ManualClock
from tests.support.approvals_domain import Payments, Send, pack, pay_kernel, sender

ANA_ACME = {"payee": {"eq": "acme"}, "amount_cents": {"max": "300000"}}


async def send(kernel: Kernel, cents: int) -> FlowStatus:
    [dfid] = await kernel.trigger(f"pay.{cents}")
    return (await kernel.wait_flow(dfid, until={FlowStatus.ESCALATED, *TERMINAL})).status


TERMINAL = {FlowStatus.CLOSED, FlowStatus.ABORTED, FlowStatus.COMPENSATED}


async def test_a_grant_lets_matching_proposals_through_and_counts_its_uses(tmp_path: Path) -> None:
    payments = Payments()
    async with pay_kernel(tmp_path / "j.db", payments=payments) as kernel:
        await kernel.register(sender())
        issued = await kernel.grant(
            "pay.send",
            agent="clerk",
            bounds=ANA_ACME,
            uses=2,
            valid_for_s=3600,
            operator="ana",
            reason="quarter-end invoices",
        )
        grant = issued.payload.grant  # type: ignore[union-attr]
        assert await send(kernel, 250_000) is FlowStatus.CLOSED
        assert await send(kernel, 400_000) is FlowStatus.ESCALATED  # above the bound
        assert await send(kernel, 300_000) is FlowStatus.CLOSED
        assert await send(kernel, 200_000) is FlowStatus.ESCALATED  # no use left
        used = [e.payload for e in await kernel.journal.read(types=["GrantUsed"])]
        assert [(u.grant, u.uses) for u in used if isinstance(u, GrantUsed)] == [
            (grant, 1),
            (grant, 2),
        ]
        accepted = [
            e.payload
            for e in await kernel.journal.read(types=["ProposalAccepted"])
            if isinstance(e.payload, ProposalAccepted) and e.payload.grant
        ]
        assert [a.grant for a in accepted] == [grant, grant]
        assert [c.params["amount_cents"] for c in payments.calls] == [250_000, 300_000]
        # Below the threshold nothing needs a grant, and none is used.
        assert await send(kernel, 50_000) is FlowStatus.CLOSED


async def test_another_agent_or_payee_is_not_covered(tmp_path: Path) -> None:
    async with pay_kernel(tmp_path / "j.db") as kernel:
        await kernel.register(sender("other", payee="acme"))
        await kernel.grant(
            "pay.send",
            agent="clerk",
            bounds=ANA_ACME,
            uses=5,
            valid_for_s=3600,
            operator="ana",
            reason="clerk only",
        )
        assert await send(kernel, 250_000) is FlowStatus.ESCALATED


async def test_a_grant_lives_only_in_its_window_on_the_recorded_clock(tmp_path: Path) -> None:
    clock = ManualClock()
    async with pay_kernel(tmp_path / "j.db", clock=clock) as kernel:
        await kernel.register(sender())
        now = kernel.clock.now_ns()
        await kernel.grant(
            "pay.send",
            bounds=ANA_ACME,
            uses=10,
            valid_from_ns=now + 60 * 10**9,
            valid_until_ns=now + 120 * 10**9,
            operator="ana",
            reason="a window",
        )
        assert await send(kernel, 250_000) is FlowStatus.ESCALATED  # not yet
        clock.advance(61)
        assert await send(kernel, 250_000) is FlowStatus.CLOSED
        clock.advance(60)
        assert await send(kernel, 250_000) is FlowStatus.ESCALATED  # over


async def test_a_revoked_grant_covers_nothing_and_is_not_revoked_twice(tmp_path: Path) -> None:
    async with pay_kernel(tmp_path / "j.db") as kernel:
        await kernel.register(sender())
        issued = await kernel.grant(
            "pay.send", bounds=ANA_ACME, uses=10, valid_for_s=3600, operator="ana", reason="r"
        )
        grant = issued.payload.grant  # type: ignore[union-attr]
        await kernel.revoke_grant(grant, operator="bo", reason="no longer needed")
        assert await send(kernel, 250_000) is FlowStatus.ESCALATED
        with pytest.raises(InputInvalid) as refused:
            await kernel.revoke_grant(grant, operator="bo", reason="again")
        assert refused.value.reason_code is ReasonCode.GRANT_NOT_LIVE
        [recorded] = await kernel.journal.read(types=["InputRefused"])
        assert isinstance(recorded.payload, InputRefused)
        assert (recorded.payload.entry, recorded.payload.reason_code) == (
            "grant",
            ReasonCode.GRANT_NOT_LIVE,
        )


async def test_a_money_cap_ends_a_grant_before_its_uses_do(tmp_path: Path) -> None:
    async with pay_kernel(tmp_path / "j.db") as kernel:
        await kernel.register(sender())
        await kernel.grant(
            "pay.send",
            bounds=ANA_ACME,
            uses=10,
            valid_for_s=3600,
            cap="5,000.00 EUR",
            operator="ana",
            reason="up to five thousand",
        )
        assert await send(kernel, 250_000) is FlowStatus.CLOSED
        assert await send(kernel, 250_000) is FlowStatus.CLOSED
        assert await send(kernel, 150_000) is FlowStatus.ESCALATED
        used = [e.payload for e in await kernel.journal.read(types=["GrantUsed"])]
        assert [(u.amount, u.currency) for u in used] == [(250_000, "EUR")] * 2  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"kind": "pay.nothing"}, "kind"),
        ({"bounds": {"ghost": {"eq": 1}}}, "bounds.ghost"),
        ({"bounds": {"amount_cents": {"max": "a lot"}}}, "bounds.amount_cents"),
        ({"cap": "10.00 USD"}, "cap"),
    ],
)
async def test_a_grant_that_could_not_be_judged_is_refused_on_record(
    tmp_path: Path, changes: dict[str, object], field: str
) -> None:
    async with pay_kernel(tmp_path / "j.db") as kernel:
        kw: dict[str, object] = {
            "kind": "pay.send",
            "uses": 1,
            "valid_for_s": 60.0,
            "operator": "ana",
            "reason": "r",
            **changes,
        }
        with pytest.raises(InputInvalid) as refused:
            await kernel.grant(**kw)  # type: ignore[arg-type]
        assert refused.value.field == field
        [recorded] = await kernel.journal.read(types=["InputRefused"])
        assert recorded.payload.field == field  # type: ignore[union-attr]


async def test_a_grant_may_itself_need_a_quorum(tmp_path: Path) -> None:
    guarded = pack(grant_quorum=Quorum(required=2, roles=("risk", "desk-head"), kind=Send))
    async with pay_kernel(tmp_path / "j.db", [guarded]) as kernel:
        await kernel.register(sender())
        with pytest.raises(InputInvalid) as refused:
            await kernel.grant(
                "pay.send", uses=5, valid_for_s=3600, operator="eve", reason="r", roles=[]
            )
        assert refused.value.reason_code is ReasonCode.UNAUTHORIZED
        issued = await kernel.grant(
            "pay.send",
            bounds=ANA_ACME,
            uses=5,
            valid_for_s=3600,
            operator="ana",
            reason="invoices",
            roles=["risk"],
        )
        grant = issued.payload.grant  # type: ignore[union-attr]
        assert await send(kernel, 250_000) is FlowStatus.ESCALATED  # pending: 1 of 2
        with pytest.raises(InputInvalid) as twice:
            await kernel.vote_grant(grant, "approve", operator="ana", reason="me", roles=["risk"])
        assert twice.value.reason_code is ReasonCode.DUPLICATE_VOTE
        voted = await kernel.vote_grant(
            grant, "approve", operator="cy", reason="ok", roles=["desk-head"]
        )
        assert voted.payload.met  # type: ignore[union-attr]
        assert await send(kernel, 250_000) is FlowStatus.CLOSED


async def test_a_grant_does_not_cover_an_escalation_needing_more_eyes_than_granted(
    tmp_path: Path,
) -> None:
    strict = pack(quorums=(Quorum(required=2, kind=Send),))
    async with pay_kernel(tmp_path / "j.db", [strict]) as kernel:
        await kernel.register(sender())
        await kernel.grant(
            "pay.send", bounds=ANA_ACME, uses=5, valid_for_s=3600, operator="ana", reason="r"
        )
        assert await send(kernel, 250_000) is FlowStatus.ESCALATED


async def race(kernel: Kernel, amounts: list[int]) -> None:
    """Trigger one flow per amount, all at once, and wait for each verdict."""
    async with anyio.create_task_group() as tg:
        for cents in amounts:
            tg.start_soon(send, kernel, cents)


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(uses=st.integers(1, 4), flows=st.integers(1, 10), cap=st.none() | st.integers(1, 8))
async def test_uses_and_money_are_exact_under_concurrent_proposals(
    tmp_path_factory: pytest.TempPathFactory, uses: int, flows: int, cap: int | None
) -> None:
    payments = Payments()
    path = tmp_path_factory.mktemp("race") / "j.db"
    async with pay_kernel(path, payments=payments) as kernel:
        await kernel.register(sender())
        await kernel.grant(
            "pay.send",
            bounds=ANA_ACME,
            uses=uses,
            valid_for_s=3600,
            cap=f"{cap * 2000}.00 EUR" if cap is not None else None,
            operator="ana",
            reason="race",
        )
        await race(kernel, [200_000] * flows)
        used = await kernel.journal.read(types=["GrantUsed"])
        allowed = min(uses, cap if cap is not None else uses, flows)
        assert len(used) == allowed
        assert sorted(u.payload.uses for u in used) == list(range(1, allowed + 1))  # type: ignore[union-attr]
        escalated = [f for f in kernel.flows() if f.status is FlowStatus.ESCALATED]
        assert len(escalated) == flows - allowed
        assert len(payments.calls) == allowed
