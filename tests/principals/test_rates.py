"""Per-user rate limits: a sliding 60 s window per (tenant, user, tier) on the kernel's clock."""

from __future__ import annotations

from pathlib import Path

from kernel.core.events import ProposalAccepted
from kernel.testing import ManualClock
from tests.principals.kit import ACME, ANN, BOB, call, codes, people

LIMITED = "RATE_LIMITED"


async def test_the_limit_is_allowed_and_one_more_is_refused(tmp_path: Path) -> None:
    clock = ManualClock()
    async with people(tmp_path / "j.db", clock=clock) as kernel:
        await kernel.declare_tenant(ACME)
        await kernel.change_tenant_policy("acme", rate_per_minute=3)
        got = [await call(kernel, "people.ping", ANN) for _ in range(4)]
        assert codes(got) == [None, None, None, LIMITED]
        assert "limit is 3 per minute" in got[-1].detail
        # Bob's window is his own; and Ann's other tier is another window.
        assert codes([await call(kernel, "people.ping", BOB)]) == [None]
        assert codes([await call(kernel, "people.ping", ANN, tier="api")]) == [None]


async def test_refusals_do_not_count_and_the_window_slides(tmp_path: Path) -> None:
    clock = ManualClock()
    async with people(tmp_path / "j.db", clock=clock) as kernel:
        await kernel.declare_tenant(ACME)
        await kernel.change_tenant_policy("acme", rate_per_minute=2)
        assert codes([await call(kernel, "people.ping", ANN) for _ in range(2)]) == [None, None]
        clock.advance(30)
        # Refused calls are not counted.
        refused = [await call(kernel, "people.ping", ANN) for _ in range(5)]
        assert codes(refused) == [LIMITED] * 5
        clock.advance(30.5)  # the first two are now older than 60 s
        assert codes([await call(kernel, "people.ping", ANN) for _ in range(3)]) == [
            None,
            None,
            LIMITED,
        ]
        accepted = await kernel.journal.read(types=["ProposalAccepted"])
        assert sum(isinstance(e.payload, ProposalAccepted) for e in accepted) == 4


async def test_a_limit_changed_mid_window_applies_at_once(tmp_path: Path) -> None:
    clock = ManualClock()
    async with people(tmp_path / "j.db", clock=clock) as kernel:
        await kernel.declare_tenant(ACME)
        await kernel.change_tenant_policy("acme", rate_per_minute=5)
        assert codes([await call(kernel, "people.ping", ANN) for _ in range(3)]) == [None] * 3
        clock.advance(10)
        await kernel.change_tenant_policy("acme", rate_per_minute=2, reason="tighten")
        assert codes([await call(kernel, "people.ping", ANN)]) == [LIMITED]
        await kernel.change_tenant_policy("acme", rate_per_minute=4, reason="loosen")
        assert codes([await call(kernel, "people.ping", ANN) for _ in range(2)]) == [None, LIMITED]


async def test_fan_out_across_agents_shares_one_users_window(tmp_path: Path) -> None:
    clock = ManualClock()
    async with people(tmp_path / "j.db", clock=clock) as kernel:
        await kernel.declare_tenant(ACME)
        await kernel.change_tenant_policy("acme", tier="subagent", rate_per_minute=3)
        for helper in ("helper", "worker", "other"):
            await kernel.delegate(ANN, from_agent="front", to_agent=helper, scopes=["read"])
        got = [
            await call(kernel, "people.ping", ANN, agent=agent, tier="subagent")
            for agent in ("helper", "worker", "other", "helper", "worker")
        ]
        assert codes(got) == [None, None, None, LIMITED, LIMITED]


async def test_the_most_specific_rate_wins(tmp_path: Path) -> None:
    clock = ManualClock()
    async with people(tmp_path / "j.db", clock=clock) as kernel:
        await kernel.declare_tenant(ACME)
        await kernel.change_tenant_policy("acme", rate_per_minute=1)
        await kernel.change_tenant_policy("acme", user="ann", rate_per_minute=3)
        assert codes([await call(kernel, "people.ping", BOB) for _ in range(2)]) == [None, LIMITED]
        assert codes([await call(kernel, "people.ping", ANN) for _ in range(4)]) == [
            None,
            None,
            None,
            LIMITED,
        ]
