"""The v0.1q scoring model: exact values, the fixed-precision boundaries, and its properties."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.beliefs import (
    HOUR_NS,
    SCALE,
    BeliefState,
    Evidence,
    Impact,
    Volatility,
    assess,
    benefit,
    confidence,
    diversity,
    freshness,
    group_weight,
    micro,
    promotable,
    scoring,
    show,
    staleness,
    suppressed,
    triggers,
    weight,
)

MEDIUM = Volatility.MEDIUM


def ev(group: str, at_h: float = 0, reliability: int = SCALE) -> Evidence:
    return Evidence(group=group, at_ns=int(at_h * HOUR_NS), reliability=reliability)


def state_at(
    support: Iterable[Evidence],
    against: Iterable[Evidence] = (),
    now_h: float = 0.0,
    *,
    failed_test: bool = False,
    held: bool = False,
) -> scoring.Assessment:
    return assess(
        list(support),
        list(against),
        volatility=MEDIUM,
        created_ns=0,
        now_ns=int(now_h * HOUR_NS),
        failed_test=failed_test,
        held=held,
    )


def test_the_seed_constants() -> None:
    assert scoring.HALF_LIFE_HOURS == {Volatility.LOW: 168, MEDIUM: 72, Volatility.HIGH: 24}
    assert [scoring.VOLATILITY_PERMILLE[v] for v in Volatility] == [500, 1000, 2000]
    assert scoring.SATURATION == (700_000, 200_000, 100_000)
    assert (scoring.CONSOLIDATE_EVERY, scoring.CARRY_OVER_CAP) == (25, 20)
    assert scoring.PROMOTE_FRESHNESS == 350_000


def test_same_group_saturates_at_the_cap() -> None:
    assert [group_weight([SCALE] * n) for n in range(1, 7)] == [
        700_000,
        900_000,
        1_000_000,
        1_000_000,
        1_000_000,
        1_000_000,
    ]
    assert group_weight([500_000]) == 350_000  # reliability weighs each contribution


def test_freshness_is_half_at_one_half_life_for_every_volatility() -> None:
    for volatility, hours in scoring.HALF_LIFE_HOURS.items():
        assert freshness(hours * HOUR_NS, volatility) == 500_000
        assert freshness(2 * hours * HOUR_NS, volatility) == 250_000
    assert freshness(0, MEDIUM) == SCALE
    assert freshness(-5, MEDIUM) == SCALE


def test_diversity_and_staleness() -> None:
    assert [diversity(g) for g in range(0, 6)] == [0, 0, 50_000, 100_000, 150_000, 150_000]
    assert staleness(500_000, MEDIUM) == 150_000
    assert staleness(500_000, Volatility.LOW) == 75_000
    assert staleness(0, Volatility.HIGH) == 300_000  # capped


def test_the_notes_reference_points() -> None:
    # One source repeated five times: 0.90 and provisional (one group only).
    one = state_at([ev("a")] * 5)
    assert (one.confidence, one.state) == (900_000, BeliefState.PROVISIONAL)
    # Two independent groups: 0.95, accepted.
    two = state_at([ev("a"), ev("b")])
    assert (two.confidence, two.state) == (950_000, BeliefState.ACCEPTED)
    # One for, one against: contested.
    assert state_at([ev("a")], [ev("b")]).state is BeliefState.CONTESTED
    # Two groups against, nothing for: rejected.
    against = state_at([], [ev("b"), ev("c")])
    assert (against.confidence, against.state) == (0, BeliefState.REJECTED)


def test_the_72_hour_boundary_is_exact() -> None:
    """Two groups exactly one half-life old: confidence 0.800000, accepted, on every replay."""
    at = state_at([ev("a"), ev("b")], now_h=72)
    assert (at.freshness, at.confidence, at.state) == (500_000, 800_000, BeliefState.ACCEPTED)
    assert show(at.confidence) == "0.800000"
    # 0.1 us later: the same micro-unit, the same state (floats would give 0.79999999998).
    later = assess(
        [ev("a"), ev("b")], [], volatility=MEDIUM, created_ns=0, now_ns=72 * HOUR_NS + 100
    )
    assert (later.confidence, later.state) == (800_000, BeliefState.ACCEPTED)
    # A second later the freshness has moved a micro-unit: provisional.
    second = assess(
        [ev("a"), ev("b")], [], volatility=MEDIUM, created_ns=0, now_ns=72 * HOUR_NS + 10**9
    )
    assert second.confidence < 800_000 and second.state is BeliefState.PROVISIONAL


def test_decay_to_deprecated_needs_a_prior_hold() -> None:
    support = [ev("a"), ev("b")]
    old = state_at(support, now_h=72 * 3, held=True)
    assert old.freshness < 200_000 and old.state is BeliefState.DEPRECATED
    assert state_at(support, now_h=72 * 3, held=False).state is BeliefState.PROVISIONAL


def test_a_failed_test_rejects() -> None:
    assert state_at([ev("a"), ev("b")], failed_test=True).state is BeliefState.REJECTED


def test_promotion_rule() -> None:
    assert promotable(state_at([ev("a"), ev("b")]))
    assert not promotable(state_at([ev("a")] * 5))


def test_triggers_and_suppression() -> None:
    target = state_at([ev("a")])  # 0.78, one group
    assert triggers(
        impact=Impact.HIGH,
        confidences=[780_000, 700_000],
        target=target,
        contested_updates=0,
        unresolved_contradictions=0,
    ) == ["top2_gap"]
    novel = state_at([ev("a", reliability=200_000)])  # 0.556
    assert "novelty" in triggers(
        impact=Impact.HIGH,
        confidences=[novel.confidence],
        target=novel,
        contested_updates=0,
        unresolved_contradictions=0,
    )
    assert (
        triggers(
            impact=Impact.LOW,
            confidences=[780_000, 700_000],
            target=target,
            contested_updates=1,
            unresolved_contradictions=1,
        )
        == []
    )
    assert benefit(500_000) == SCALE and benefit(SCALE) == 0
    assert suppressed(Impact.LOW, 600_000, 800_000)  # benefit 0.4 < cost 0.6
    assert not suppressed(Impact.HIGH, 600_000, 800_000)


def test_micro_parses_decimals_strictly() -> None:
    assert micro("0.8") == 800_000 and micro("1") == SCALE and micro("0.000001") == 1
    for bad in ("", "abc", "1.5", "-0.1", "0.0000001", "nan", "inf"):
        with pytest.raises(ValueError):
            micro(bad)


groups = st.sampled_from(["a", "b", "c", "d"])
hours = st.integers(min_value=0, max_value=400)
evidence = st.builds(
    lambda g, h, r: ev(g, h, r), groups, hours, st.integers(min_value=0, max_value=SCALE)
)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    st.lists(evidence, max_size=8),
    st.lists(evidence, max_size=6),
    st.sampled_from(["e", "f", "g"]),
    st.integers(min_value=0, max_value=SCALE),
    hours,
)
def test_more_independent_support_never_lowers_confidence(
    support: list[Evidence], against: list[Evidence], group: str, rel: int, extra: int
) -> None:
    """A new group's support (as fresh as the newest) never lowers confidence, nor the score."""
    now_h = max([e.at_ns // HOUR_NS for e in support + against] + [0]) + extra
    before = state_at(support, against, now_h=now_h)
    newest = max([e.at_ns for e in support] + [0])
    more = [*support, Evidence(group=group, at_ns=newest, reliability=rel)]
    after = state_at(more, against, now_h=now_h)
    assert after.confidence >= before.confidence
    assert after.support >= before.support


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(evidence, max_size=8), st.lists(evidence, max_size=6), hours, st.booleans())
def test_assessment_is_deterministic_and_bounded(
    support: list[Evidence], against: list[Evidence], now_h: int, held: bool
) -> None:
    a = state_at(support, against, now_h=now_h + 400, held=held)
    b = state_at(list(support), list(against), now_h=now_h + 400, held=held)
    assert a == b
    assert 0 <= a.confidence <= SCALE and 0 <= a.freshness <= SCALE
    assert weight(support)[0] <= SCALE
    assert a.state in BeliefState


@settings(max_examples=100, derandomize=True, deadline=None)
@given(st.integers(min_value=0, max_value=10**18), st.sampled_from(list(Volatility)))
def test_freshness_never_rises_with_age(age: int, volatility: Volatility) -> None:
    assert 0 <= freshness(age + HOUR_NS, volatility) <= freshness(age, volatility) <= SCALE


@settings(max_examples=100, derandomize=True, deadline=None)
@given(
    st.integers(min_value=0, max_value=SCALE),
    st.integers(min_value=0, max_value=SCALE),
    st.integers(min_value=0, max_value=6),
    st.integers(min_value=0, max_value=SCALE),
)
def test_time_alone_never_upgrades(support: int, against: int, groups: int, fresh: int) -> None:
    """Lower freshness (more time) never raises confidence."""
    for lower in (fresh // 2, 0):
        assert confidence(support, against, groups, lower, MEDIUM) <= confidence(
            support, against, groups, fresh, MEDIUM
        )
