"""The belief scoring model v0.1q: pure, deterministic, at a fixed precision.

Every score is an integer number of micro-units (:data:`SCALE` = 1_000_000 is
1.0), so a threshold comparison lands the same on every platform and every
replay: two independent groups exactly one half-life old score confidence
800_000, accepted, today and in ten years. The one transcendental step,
freshness, is computed with :mod:`decimal` (correctly rounded, 40 digits) and
quantised half-even to a micro-unit; everything after it is integer arithmetic.

"Now" is always a parameter (``now_ns``), and callers pass a recorded time (an
event's ``at_ns``), never the wall clock. Nothing here reads a clock, a file or
a random source. The decisions on the seed's open points are in docs/beliefs.md.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from decimal import ROUND_HALF_EVEN, Context, Decimal, InvalidOperation
from enum import StrEnum

import msgspec

SCALE = 1_000_000
"""One, in micro-units: every score is an int in [0, SCALE]."""

HOUR_NS = 3_600 * 1_000_000_000


class Volatility(StrEnum):
    """How fast a claim goes stale: its half-life and its staleness factor."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


class BeliefState(StrEnum):
    """The one primary state of a proposition, derived from evidence, never asserted."""

    TENTATIVE = "tentative"
    PROVISIONAL = "provisional"
    ACCEPTED = "accepted"
    CONTESTED = "contested"
    DEPRECATED = "deprecated"
    REJECTED = "rejected"


PRECEDENCE = (
    BeliefState.REJECTED,
    BeliefState.CONTESTED,
    BeliefState.ACCEPTED,
    BeliefState.DEPRECATED,
    BeliefState.PROVISIONAL,
    BeliefState.TENTATIVE,
)
"""The fixed order in which the states are tried: the first whose rule holds wins."""

HALF_LIFE_HOURS = {Volatility.LOW: 168, Volatility.MEDIUM: 72, Volatility.HIGH: 24}
VOLATILITY_PERMILLE = {Volatility.LOW: 500, Volatility.MEDIUM: 1_000, Volatility.HIGH: 2_000}
"""The staleness factors 0.5 / 1.0 / 2.0, in thousandths."""

SATURATION = (700_000, 200_000, 100_000)
"""What the 1st, 2nd, and 3rd-and-later evidence of one independence group adds."""
GROUP_CAP = SCALE
TOTAL_CAP = SCALE
"""Support (and contradiction) summed over groups is capped at 1.0 too (docs/beliefs.md, hole 1)."""

DIVERSITY_STEP = 50_000
DIVERSITY_CAP = 150_000
STALENESS_CAP = 300_000

# Thresholds of the state machine (section 9 of the seed), in micro-units.
ACCEPT_CONFIDENCE = 800_000
ACCEPT_GROUPS = 2
ACCEPT_MAX_CONTRADICTION = 300_000  # strictly below
ACCEPT_FRESHNESS = 400_000
CONTESTED_SUPPORT = 450_000
CONTESTED_CONTRADICTION = 450_000
PROVISIONAL_CONFIDENCE = 550_000
DEPRECATED_FRESHNESS = 200_000  # strictly below
REJECT_CONFIDENCE = 150_000  # strictly below
REJECT_CONTRADICTION = 800_000
REJECT_GROUPS = 2

# Consolidation (section 13.4).
PROMOTE_FRESHNESS = 350_000
CONSOLIDATE_EVERY = 25
CARRY_OVER_CAP = 20

# Triggers (section 13.3).
TOP2_GAP = 150_000  # strictly below
CONTESTED_UPDATES = 2
UNRESOLVED_CONTRADICTIONS = 2
NOVELTY_LOW = 450_000
NOVELTY_HIGH = 700_000
NOVELTY_MAX_GROUPS = 2  # strictly below

_DECIMAL = Context(prec=40, rounding=ROUND_HALF_EVEN)
_LN2 = _DECIMAL.ln(Decimal(2))
_MICRO = Decimal(1)


def micro(text: str) -> int:
    """Parse a decimal string in [0, 1] ("0.8", "1", "0.000001") into micro-units.

    Raises:
        ValueError: not a plain decimal, out of [0, 1], or finer than a micro-unit.
    """
    try:
        value = Decimal(text.strip()) if isinstance(text, str) else Decimal("nan")
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a decimal number") from None
    if not value.is_finite() or not 0 <= value <= 1:
        raise ValueError(f"{text!r} is not a decimal in [0, 1]")
    scaled = value.scaleb(6)
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{text!r} is finer than a micro-unit (six decimals)")
    return int(scaled)


def show(value: int) -> str:
    """Render micro-units as a six-decimal string: 800_000 -> "0.800000"."""
    sign = "-" if value < 0 else ""
    whole, frac = divmod(abs(value), SCALE)
    return f"{sign}{whole}.{frac:06d}"


def freshness(age_ns: int, volatility: Volatility) -> int:
    """Return exp(-ln2 * age / half_life) in micro-units; an age <= 0 is fully fresh."""
    if age_ns <= 0:
        return SCALE
    half_life_ns = HALF_LIFE_HOURS[volatility] * HOUR_NS
    exponent = _DECIMAL.divide(_DECIMAL.multiply(_LN2, Decimal(age_ns)), Decimal(half_life_ns))
    value = _DECIMAL.exp(-exponent).scaleb(6)
    return int(value.quantize(_MICRO, rounding=ROUND_HALF_EVEN, context=_DECIMAL))


def group_weight(reliabilities: Iterable[int]) -> int:
    """Saturate one independence group's evidence, in the order it was recorded.

    The k-th evidence adds the k-th saturation step times its source's
    reliability (micro-units); the group total is capped at 1.0.
    """
    total = 0
    for k, reliability in enumerate(reliabilities):
        step = SATURATION[min(k, len(SATURATION) - 1)]
        total += step * reliability // SCALE
    return min(GROUP_CAP, total)


class Evidence(msgspec.Struct, frozen=True, kw_only=True):
    """One piece of support or contradiction: its source's group and reliability, and when.

    ``seq`` is the journal seq of the event that attached it (its name in every
    explanation); ``at_ns`` the recorded time it was attached; ``observation`` the
    observation it is (empty in graphs folded before it was kept: such evidence is
    never discounted).
    """

    group: str
    reliability: int = SCALE
    at_ns: int = 0
    seq: int = 0
    observation: str = ""


def weight(evidence: Sequence[Evidence]) -> tuple[int, int]:
    """Return (score, distinct groups): groups saturated one by one, summed, capped at 1.0."""
    groups: dict[str, list[int]] = {}
    for item in evidence:
        groups.setdefault(item.group, []).append(item.reliability)
    total = sum(group_weight(r) for r in groups.values())
    return min(TOTAL_CAP, total), len(groups)


def diversity(groups: int) -> int:
    """min(0.15, 0.05 * (groups - 1)), never negative."""
    return max(0, min(DIVERSITY_CAP, DIVERSITY_STEP * (groups - 1)))


def staleness(fresh: int, volatility: Volatility) -> int:
    """min(0.30, (1 - freshness) * volatility_factor * 0.30), rounded up.

    A penalty rounds up and the confidence rounds down: rounding never favours a belief.
    """
    return min(STALENESS_CAP, -(-(SCALE - fresh) * VOLATILITY_PERMILLE[volatility] * 3 // 10_000))


def confidence(
    support: int, contradiction: int, support_groups: int, fresh: int, volatility: Volatility
) -> int:
    """clamp01(0.50 + 0.40 support - 0.50 contradiction + diversity - staleness), floored."""
    tenths = (
        5 * SCALE
        + 4 * support
        - 5 * contradiction
        + 10 * (diversity(support_groups) - staleness(fresh, volatility))
    )
    return max(0, min(SCALE, tenths // 10))


class Assessment(msgspec.Struct, frozen=True, kw_only=True):
    """A proposition's scores and state at one recorded time, all in micro-units."""

    state: BeliefState
    confidence: int
    support: int
    contradiction: int
    support_groups: int
    contradiction_groups: int
    freshness: int
    at_ns: int


def classify(
    *,
    confidence: int,
    support: int,
    contradiction: int,
    support_groups: int,
    contradiction_groups: int,
    fresh: int,
    failed_test: bool = False,
    held: bool = False,
    unsupported_ns: int = 0,
    half_life_ns: int = 72 * HOUR_NS,
) -> BeliefState:
    """Apply the state machine's rules in :data:`PRECEDENCE` order.

    Args:
        failed_test: the latest discriminating test of this proposition failed.
        held: the proposition was accepted or provisional at an earlier assessment.
        unsupported_ns: how long since its newest support (or its creation).
        half_life_ns: its volatility's half-life.
    """
    if failed_test or _refuted(confidence, contradiction, contradiction_groups):
        return BeliefState.REJECTED
    if support >= CONTESTED_SUPPORT and contradiction >= CONTESTED_CONTRADICTION:
        return BeliefState.CONTESTED
    if _acceptable(confidence, support_groups, contradiction, fresh):
        return BeliefState.ACCEPTED
    if held and fresh < DEPRECATED_FRESHNESS and unsupported_ns >= half_life_ns:
        return BeliefState.DEPRECATED
    if confidence >= PROVISIONAL_CONFIDENCE:
        return BeliefState.PROVISIONAL
    return BeliefState.TENTATIVE


def _refuted(confidence: int, contradiction: int, contradiction_groups: int) -> bool:
    """The rejection rule: low confidence against enough independent contradiction."""
    return (
        confidence < REJECT_CONFIDENCE
        and contradiction >= REJECT_CONTRADICTION
        and contradiction_groups >= REJECT_GROUPS
    )


def _acceptable(confidence: int, support_groups: int, contradiction: int, fresh: int) -> bool:
    """The acceptance rule: confident, independently supported, barely contradicted, fresh."""
    return (
        confidence >= ACCEPT_CONFIDENCE
        and support_groups >= ACCEPT_GROUPS
        and contradiction < ACCEPT_MAX_CONTRADICTION
        and fresh >= ACCEPT_FRESHNESS
    )


def assess(
    support: Sequence[Evidence],
    contradiction: Sequence[Evidence],
    *,
    volatility: Volatility,
    created_ns: int,
    now_ns: int,
    failed_test: bool = False,
    held: bool = False,
    refuted: Collection[str] = (),
) -> Assessment:
    """Score a proposition and derive its state at the recorded time ``now_ns``.

    Freshness is the age of its newest support (its creation if it has none):
    a claim is as fresh as its latest confirmation. Contradiction does not decay.
    Evidence attached after ``now_ns`` is ignored, so an assessment at an
    earlier recorded time is the one that was made then.

    ``refuted`` names observations whose contradiction no longer counts: each
    supports a rival that a failed discriminating test refuted against this
    proposition (docs/beliefs.md, "A failed test settles a dispute"). The
    evidence stays recorded; only the contradiction sum leaves it out.
    """
    support = [e for e in support if e.at_ns <= now_ns]
    contradiction = [
        e
        for e in contradiction
        if e.at_ns <= now_ns and not (e.observation and e.observation in refuted)
    ]
    for_score, for_groups = weight(support)
    against_score, against_groups = weight(contradiction)
    newest = max([created_ns, *(e.at_ns for e in support)])
    fresh = freshness(now_ns - newest, volatility)
    conf = confidence(for_score, against_score, for_groups, fresh, volatility)
    state = classify(
        confidence=conf,
        support=for_score,
        contradiction=against_score,
        support_groups=for_groups,
        contradiction_groups=against_groups,
        fresh=fresh,
        failed_test=failed_test,
        held=held,
        unsupported_ns=now_ns - newest,
        half_life_ns=HALF_LIFE_HOURS[volatility] * HOUR_NS,
    )
    return Assessment(
        state=state,
        confidence=conf,
        support=for_score,
        contradiction=against_score,
        support_groups=for_groups,
        contradiction_groups=against_groups,
        freshness=fresh,
        at_ns=now_ns,
    )


def holds(state: BeliefState) -> bool:
    """Whether ``state`` counts as "previously accepted or provisional" for deprecation."""
    return state in (BeliefState.ACCEPTED, BeliefState.PROVISIONAL)


def promotable(assessment: Assessment) -> bool:
    """Promotion rule: accepted and freshness >= 0.35, both at consolidation time."""
    return assessment.state is BeliefState.ACCEPTED and assessment.freshness >= PROMOTE_FRESHNESS


# --- triggered tests (section 13.3) ----------------------------------------------------


class Impact(StrEnum):
    """How much the action that depends on the belief matters."""

    LOW = "low"
    HIGH = "high"
    IRREVERSIBLE = "irreversible"


def benefit(confidence: int) -> int:
    """The bounded benefit of testing a proposition: 1 at confidence 0.5, 0 at 0 or 1.

    A test is worth most where the belief is least certain: 1 - 2|confidence - 0.5|.
    """
    return max(0, SCALE - 2 * abs(confidence - SCALE // 2))


def triggers(
    *,
    impact: Impact,
    confidences: Sequence[int],
    target: Assessment,
    contested_updates: int,
    unresolved_contradictions: int,
) -> list[str]:
    """Return the names of the fixed triggers that hold, in the seed's order.

    Args:
        impact: the impact of the action that depends on the target proposition.
        confidences: the confidences of the target and the propositions competing with it.
        target: the target proposition's assessment now.
        contested_updates: consecutive updates of the target that left it contested.
        unresolved_contradictions: contradictions attached to it since its latest test.
    """
    fired = []
    ranked = sorted(confidences, reverse=True)
    if impact is not Impact.LOW and len(ranked) >= 2 and ranked[0] - ranked[1] < TOP2_GAP:
        fired.append("top2_gap")
    if contested_updates >= CONTESTED_UPDATES:
        fired.append("contested")
    if unresolved_contradictions >= UNRESOLVED_CONTRADICTIONS:
        fired.append("contradictions")
    if (
        impact is not Impact.LOW
        and NOVELTY_LOW <= target.confidence <= NOVELTY_HIGH
        and target.support_groups < NOVELTY_MAX_GROUPS
    ):
        fired.append("novelty")
    return fired


def suppressed(impact: Impact, cost: int, confidence: int) -> bool:
    """Suppress a low-impact test whose estimated cost exceeds its bounded benefit."""
    return impact is Impact.LOW and cost > benefit(confidence)
