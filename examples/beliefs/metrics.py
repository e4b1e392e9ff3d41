"""The study's metrics (seed document section 17) and its pass rule (section 16.3).

Every metric is computed from the scenarios' ground truth and the outcomes a
system reported at each task boundary; docs/beliefs-study.md defines each one.
Counts are kept as exact fractions (numerator, denominator) and turned into a
rate only at the end, so a metric is the same on every platform and replay.

Policy metrics (the ones the pass rule counts):

- ``false_promotion``: of the propositions that should not be believed (label
  false, stale or unknown), the share the system holds accepted. Lower is better.
- ``false_rejection``: of the true propositions, the share it holds rejected.
  Lower is better.
- ``contested_precision``: of the propositions it holds contested, the share the
  ground truth marks disputed. Higher is better; undefined (``None``) when it holds
  none contested, and then it can never count as a gain.
- ``calibration``: the Brier score, mean of (confidence - [label is true])^2 over
  every proposition (an absent one has confidence 0). Lower is better.
- ``contradiction_recovery``: of the false claims later corrected in the stream,
  the share it no longer holds accepted at the end. Higher is better.
- ``stale_handling``: of the stale propositions, the share it no longer holds
  accepted. Higher is better.

Identity metrics: ``duplicate_entities`` (of the true entities, the share split
over more than one of the system's entities) and ``false_merges`` (of the
system's entities, the share that mix mentions of two true entities), both lower
is better. The task metric: ``task_success``, the share of questions answered
right (the expected value, or ``unknown`` where abstaining is right).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import msgspec

from examples.beliefs.scenarios import FALSE, STALE, TRUE, UNKNOWN, Scenario
from examples.beliefs.systems import Outcome

SCALE = 1_000_000

POLICY_METRICS = (
    "false_promotion",
    "false_rejection",
    "contested_precision",
    "calibration",
    "contradiction_recovery",
    "stale_handling",
)
IDENTITY_METRICS = ("duplicate_entities", "false_merges")
LOWER_IS_BETTER = {
    "false_promotion",
    "false_rejection",
    "calibration",
    "duplicate_entities",
    "false_merges",
}
ALL_METRICS = (*POLICY_METRICS, *IDENTITY_METRICS, "task_success")
MIN_GAIN = Fraction(1, 10)
"""At least 10% relative gain on a policy metric counts."""
MIN_METRICS = 3
MAX_TASK_LOSS = Fraction(3, 100)
"""At most 3 absolute percentage points of task success lost."""


class Ratio(msgspec.Struct, frozen=True):
    """An exact count: ``num`` of ``den`` (``den`` 0: the metric is undefined)."""

    num: Fraction
    den: int

    def value(self) -> Fraction | None:
        return None if self.den == 0 else self.num / self.den


def measure(scenarios: Sequence[Scenario], outcomes: Sequence[Outcome]) -> dict[str, Ratio]:
    """Compute every metric of one system over one seed's scenarios."""
    counts: dict[str, list[Fraction | int]] = {m: [Fraction(0), 0] for m in ALL_METRICS}

    def add(metric: str, hit: Fraction | bool) -> None:
        counts[metric][0] += Fraction(hit)
        counts[metric][1] += 1

    for sc, out in zip(scenarios, outcomes, strict=True):
        for truth, belief in zip(sc.truths, out.beliefs, strict=True):
            accepted = belief.state == "accepted"
            if truth.label in (FALSE, STALE, UNKNOWN):
                add("false_promotion", accepted)
            if truth.label == TRUE:
                add("false_rejection", belief.state == "rejected")
            if belief.state == "contested":
                add("contested_precision", truth.disputed)
            conf = Fraction(belief.confidence, SCALE)
            add("calibration", (conf - (1 if truth.label == TRUE else 0)) ** 2)
            if truth.label == FALSE and truth.corrected:
                add("contradiction_recovery", not accepted)
            if truth.label == STALE:
                add("stale_handling", not accepted)
        for q in sc.questions:
            add("task_success", out.answers.get(q.id) == q.expected)
        true_of: dict[str, set[str]] = {}
        sys_of: dict[str, set[str]] = {}
        for mention, entity in sc.entities.items():
            mine = out.entities.get(mention, f"unresolved:{mention}")
            true_of.setdefault(entity, set()).add(mine)
            sys_of.setdefault(mine, set()).add(entity)
        for mine_set in true_of.values():
            add("duplicate_entities", len(mine_set) > 1)
        for true_set in sys_of.values():
            add("false_merges", len(true_set) > 1)
    return {m: Ratio(Fraction(n), int(d)) for m, (n, d) in counts.items()}


def mean(values: Sequence[Fraction | None]) -> Fraction | None:
    """The mean over seeds of the defined values (None if none is defined)."""
    defined = [v for v in values if v is not None]
    return sum(defined, Fraction(0)) / len(defined) if defined else None


def gain(metric: str, system: Fraction | None, baseline: Fraction | None) -> Fraction | None:
    """Relative gain of ``system`` over ``baseline`` (positive is better); None if undefined.

    For a lower-is-better metric it is (baseline - system) / baseline; for a
    higher-is-better one (system - baseline) / baseline. A zero baseline gives no
    relative gain: None, unless both are equal (0).
    """
    if system is None or baseline is None:
        return None
    if baseline == 0:
        return Fraction(0) if system == 0 else None
    delta = baseline - system if metric in LOWER_IS_BETTER else system - baseline
    return delta / baseline


class PassRule(msgspec.Struct, frozen=True, kw_only=True):
    """The pass rule's verdict for one system against the raw-log baseline."""

    system: str
    baseline: str
    gains: dict[str, str | None]
    """Each policy metric's relative gain, as a decimal string (None: undefined)."""
    improved: list[str]
    """The policy metrics with a relative gain of at least 10%."""
    task_success_delta: str
    """System minus baseline task success, in absolute points (a decimal string)."""
    met: bool


def pass_rule(
    system: str,
    baseline: str,
    means: dict[str, dict[str, Fraction | None]],
) -> PassRule:
    """Apply section 16.3: >= 10% relative gain on >= 3 policy metrics, <= 3 points lost."""
    gains = {m: gain(m, means[system][m], means[baseline][m]) for m in POLICY_METRICS}
    improved = [m for m, g in gains.items() if g is not None and g >= MIN_GAIN]
    ts, tb = means[system]["task_success"], means[baseline]["task_success"]
    delta = (ts or Fraction(0)) - (tb or Fraction(0))
    met = len(improved) >= MIN_METRICS and delta >= -MAX_TASK_LOSS
    return PassRule(
        system=system,
        baseline=baseline,
        gains={m: None if g is None else decimal(g) for m, g in gains.items()},
        improved=improved,
        task_success_delta=decimal(delta * 100),
        met=met,
    )


def decimal(value: Fraction | None, places: int = 4) -> str:
    """Render a fraction as a fixed-point decimal string, rounded half-even."""
    if value is None:
        return "n/a"
    scaled = round(value * 10**places)
    sign = "-" if scaled < 0 else ""
    whole, frac = divmod(abs(scaled), 10**places)
    return f"{sign}{whole}.{frac:0{places}d}"
