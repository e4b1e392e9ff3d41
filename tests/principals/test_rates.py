"""Per-user rate limits: a sliding 60 s window per (tenant, user, tier) on the kernel's clock."""

from __future__ import annotations

from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from kernel.core.events import Event, FlowCreated, OnBehalf, Principal, ProposalAccepted
from kernel.state.principals import WINDOW_NS, Principals, key_of
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


def _reference(calls: dict[str, list[int]], key: str, ts: int) -> None:
    """The rate window's fold as first written: a scan of every call, kept in order."""
    since = ts - WINDOW_NS
    calls[key] = [t for t in calls.get(key, ()) if t > since] + [ts]
    for other in [k for k, v in calls.items() if v and v[-1] <= since]:
        del calls[other]


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["ann", "bob"]),
            st.integers(min_value=-WINDOW_NS, max_value=WINDOW_NS // 2),
        ),
        min_size=1,
        max_size=60,
    ),
    reload_at=st.integers(min_value=0, max_value=60),
)
# A clock set back, then a call after the later time's window: a cut of the unsorted
# window would drop the later time a scan keeps; and the same across a snapshot's load.
@example(
    steps=[("ann", 0), ("ann", -WINDOW_NS // 2), ("ann", WINDOW_NS + WINDOW_NS // 4)], reload_at=9
)
@example(
    steps=[("ann", 0), ("ann", -WINDOW_NS // 2), ("ann", WINDOW_NS + WINDOW_NS // 4)], reload_at=2
)
def test_the_rate_window_cut_by_bisection_keeps_and_counts_what_a_scan_would(
    steps: list[tuple[str, int]], reload_at: int
) -> None:
    """Times mostly move forward and sometimes back (a clock set back); a snapshot loads
    midway: the windows' calls and counts are those of the plain scan at every step."""
    domain = Principals()
    expected: dict[str, list[int]] = {}
    now = 10 * WINDOW_NS
    for n, (user, step) in enumerate(steps):
        if n == reload_at:
            saved = domain.state
            domain = Principals()
            domain.saved()[0].load(saved)
        now += step  # mostly forward, and back now and then
        dfid = f"f{n}"
        behalf = OnBehalf(principal=Principal(tenant="acme", user=user))
        created = FlowCreated(root_dfid=dfid, on_behalf=behalf)
        domain.folds()[FlowCreated](Event(seq=2 * n + 1, ts=now, payload=created, dfid=dfid))
        accepted = ProposalAccepted(attempt=1)
        domain.folds()[ProposalAccepted](Event(seq=2 * n + 2, ts=now, payload=accepted, dfid=dfid))
        key = key_of("acme", user, behalf.tier)
        _reference(expected, key, now)
        assert domain.state.calls == expected
        for probe in (now, now + WINDOW_NS // 2, now - WINDOW_NS // 3):
            for who in ("ann", "bob"):
                k = key_of("acme", who, behalf.tier)
                scanned = sum(1 for t in expected.get(k, ()) if t > probe - WINDOW_NS)
                assert domain.count(k, probe) == scanned
