"""`dirk show` tells votes, re-judged approvals, grant uses, prices and webhooks in words.

Each new event of issue 30 reads as a sentence (money formatted), not the JSON fallback.
"""

from __future__ import annotations

from pathlib import Path

from kernel.audit.narrative import _words_of, narrate
from kernel.core import events as ev
from kernel.core.reasons import ReasonCode
from kernel.testing import action_of
from tests.dim.test_superseded import CAPPED, escalated_order, open_desk
from tests.support.helpers import Bank


async def test_a_superseded_approval_reads_with_both_pack_versions(tmp_path: Path) -> None:
    async with open_desk(tmp_path / "j.db", Bank()) as kernel:
        dfid = await escalated_order(kernel)
        action = action_of(kernel, dfid)
        await kernel.load_pack(CAPPED, operator="risk", reason="cap orders at 50 lots")
        await kernel.decide(dfid, "approve", operator="ana", reason="ok", action_hash=action)
        [event] = await kernel.journal.read(dfid=dfid, types=["ApprovalSuperseded"])
    line = narrate(event)
    assert "approved under trading 0.3.0, refused under trading 0.3.1" in line
    assert "RISK_LIMIT_EXCEEDED" in line and not line.startswith("{")


def test_votes_grant_uses_prices_and_webhooks_read_as_words() -> None:
    vote = ev.ApprovalVoted(
        vote="approve", operator="dana", reason="risk ok", waiting="1 of 2, waiting for a desk-head"
    )
    assert _words_of(vote) == ("approve vote by dana: 'risk ok' (1 of 2, waiting for a desk-head)")
    met = ev.ApprovalVoted(vote="approve", operator="ed", met=True)
    assert _words_of(met) == "approve vote by ed: '' (quorum met)"
    used = ev.GrantUsed(
        grant="g-1",
        uses=2,
        amount=2_500_000,
        currency="USD",
        escalation=ReasonCode.APPROVAL_REQUIRED,
    )
    assert _words_of(used) == (
        "proceeds under grant g-1 (use 2, 25,000.00 USD) instead of APPROVAL_REQUIRED"
    )
    charged = ev.ReasoningCharged(
        tokens={"gpt-x": 1200, "mystery": 5}, amount=1, currency="USD", unpriced=["mystery"]
    )
    assert _words_of(charged) == (
        "reasoning 0.01 USD (1200 gpt-x, 5 mystery tokens); no price for mystery"
    )
    failed = ev.WebhookFailed(hook="desk", notice="request", about=7, error="HTTP 500", attempts=3)
    assert "desk did not take the request after 3 tries: HTTP 500" in str(_words_of(failed))
    held = ev.ResourceReserved(pool="money:USD:daily-notional@86400:desk", amount=2_500_000)
    assert _words_of(held) == ("holds 25,000.00 USD of money:USD:daily-notional@86400:desk")
    back = ev.ResourceReleased(pool="money:EUR:day:desk", amount=5, reason="ABORTED")
    assert _words_of(back) == "gives back 0.05 EUR of money:EUR:day:desk (ABORTED)"
    spent = ev.ResourceReleased(pool="money:EUR:day:desk", amount=5, reason="CLOSED")
    assert _words_of(spent) == "spends 0.05 EUR of money:EUR:day:desk"
    # Pools of other resources are not money: they keep the plain record.
    assert _words_of(ev.ResourceReserved(pool="cash:desk", amount=3)) == "reserved 3 of cash:desk"
    assert _words_of(ev.FlowClosed()) == "CLOSED"
