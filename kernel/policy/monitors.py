"""Drift monitors: what a pack watches in the aggregate, and what it does on a breach.

A single verdict is judged by the DIM; a *trend* is not: an agent whose refusals climb
from 2% to 40% in an hour passes every check one proposal at a time. A :class:`Monitor`
declared in a pack (``PolicyPack(monitors=(...))``) names a metric over a rolling window
on the kernel's clock, per agent or per principal, a bound (fixed, or a multiple of a
baseline window just before it), and the action the kernel takes on a breach: ``notify``
(the event and a webhook notice only), ``demote`` (the agent to PASSIVE) or ``suspend``.

The spec is data, so it enters the pack's hash (only when a pack declares one: older
packs keep their hashes) and evaluation (kernel.state.drift) is a pure function of the
recorded events and the recorded time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from kernel.core.reasons import ReasonCode
from kernel.policy._checks import PackError

Metric = Literal[
    "refusal_rate",
    "escalation_rate",
    "exhaustion_rate",
    "mean_confidence",
    "spend",
    "spend_per_minute",
    "effects_per_minute",
]
"""What a monitor measures over its window (kernel.state.drift says how each is counted)."""

Action = Literal["notify", "demote", "suspend"]
By = Literal["agent", "principal"]

METRICS: frozenset[str] = frozenset(get_args(Metric))
ACTIONS: frozenset[str] = frozenset(get_args(Action))

REASONS: frozenset[str] = frozenset(str(code) for code in ReasonCode)

LOW_IS_BAD: frozenset[str] = frozenset({"mean_confidence"})
"""Metrics that breach by falling under their bound rather than rising above it."""


@dataclass(frozen=True)
class Monitor:
    """One drift monitor of a pack.

    Args:
        name: unique within the pack; recorded with every breach.
        metric: what is measured (:data:`Metric`).
        window_s: the rolling window, in seconds of the kernel's clock, ending now.
        bound: a fixed bound: a breach is a value strictly above it (strictly below it
            for ``mean_confidence``); exactly at the bound is not a breach.
        baseline_s: a baseline window of this many seconds just before the current one;
            the bound is then ``factor`` times its value, and ``bound``, if given, a
            floor under it (a ceiling over it for ``mean_confidence``): a morning with no
            refusal does not make one refusal a breach.
        factor: the multiple of the baseline that breaches (a fraction of it for
            ``mean_confidence``).
        min_samples: the fewest observations in the window that let a rate breach (a
            single refusal is not a 100% refusal rate worth acting on).
        action: ``notify``, ``demote`` (PASSIVE) or ``suspend`` (SUSPENDED).
        by: ``agent``, or ``principal`` (the flow's ``FlowCreated.on_behalf``).
        reasons: for ``refusal_rate`` and ``escalation_rate``, count only the verdicts
            of these reason codes over all verdicts (a model that starts writing
            malformed proposals: ``("SCHEMA_INVALID",)``); empty: every refusal or
            escalation counts. Refusals an agent does not cause (contention for a pool
            others hold) then do not demote it.
    """

    name: str
    metric: Metric
    window_s: int
    bound: float | None = None
    baseline_s: int | None = None
    factor: float = 2.0
    min_samples: int = 1
    action: Action = "notify"
    by: By = "agent"
    reasons: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        problem = self._kind_problem() or self._bound_problem()
        if problem:
            raise PackError(f"monitor {self.name}: {problem}")

    def _kind_problem(self) -> str:
        """What is wrong with the metric, the action or the grouping ("" for nothing)."""
        if self.metric not in METRICS:
            return f"unknown metric {self.metric!r}"
        if self.action not in ACTIONS:
            return f"unknown action {self.action!r}"
        if self.by not in ("agent", "principal"):
            return "by is 'agent' or 'principal'"
        if self.reasons and self.metric not in ("refusal_rate", "escalation_rate"):
            return "reasons are for refusal_rate and escalation_rate"
        unknown = [r for r in self.reasons if r not in REASONS]
        if unknown:
            return f"unknown reason code {unknown[0]!r}"
        return ""

    def _bound_problem(self) -> str:
        """What is wrong with the window, the bound or the baseline ("" for nothing)."""
        if self.window_s <= 0 or self.min_samples < 1:
            return "window_s and min_samples must be positive"
        if self.bound is None and self.baseline_s is None:
            return "give a bound, a baseline_s or both"
        if self.baseline_s is not None and (self.baseline_s <= 0 or self.factor <= 0):
            return "baseline_s and factor must be positive"
        return ""

    def hashed(self) -> list[object]:
        """The monitor as the pack's hash sees it."""
        hashed: list[object] = [
            self.name, self.metric, self.window_s, repr(self.bound), self.baseline_s,
            repr(self.factor), self.min_samples, self.action, self.by,
        ]  # fmt: skip
        if self.reasons:  # only when given: a monitor without keeps its hash
            hashed.append(list(self.reasons))
        return hashed
