"""Soft guards: probabilistic checks that flag a flow NEEDS_REVIEW, off the blocking path.

A pack declares :class:`Guard` entries on its kinds. After the DIM has recorded
a verdict that lets a proposal through (accepted or escalated), it hands the
proposal to the :class:`GuardRunner` actor; each guard's finding at or above
``flag_above`` (and each guard that fails to judge) becomes a FlowFlagged
event. The verdict is never delayed or changed by that.

The one exception is an explicit emergency rule: a guard whose check is a
plain, pure function (deterministic, so replay reproduces it) may declare
``emergency_above``; the DIM runs it inline at the end of the rules layer and
rejects with GUARD_EMERGENCY when its confidence reaches that threshold. A
:class:`SoftGuard` (an async port, e.g. an LLM judging whether the explanation
agrees with the action) can only flag. The actor lives in kernel.guards._runner.
The DIM flags a rule that overran its time budget the same way, under the guard
name ``"rule budget"`` (kernel.dim._actor): a finding, never a different verdict.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import msgspec

from kernel.core.events import Feedback, ProposalRecord
from kernel.core.reasons import ReasonCode


class GuardFinding(msgspec.Struct, frozen=True, kw_only=True):
    """What a guard thinks is wrong with a proposal, and how sure it is (0 to 1)."""

    confidence: float
    reason: str


class SoftGuard(Protocol):
    """The port of a probabilistic guard: an async callable returning a finding or None."""

    async def __call__(
        self, proposal: ProposalRecord, params: Any, state: Mapping[str, Any]
    ) -> GuardFinding | None:
        """Judge the proposal (``params`` typed, ``state`` as the DIM saw it); None: all well."""
        ...


GuardFn = Callable[[ProposalRecord, Any, Mapping[str, Any]], GuardFinding | None]
"""A deterministic guard: a pure function of the proposal, its typed parameters and the state."""


@dataclass(frozen=True)
class Guard:
    """A soft guard on one policy kind.

    Args:
        kind: the policy kind it screens.
        check: a pure function (:data:`GuardFn`) or an async :class:`SoftGuard`.
        flag_above: findings at or above this confidence flag the flow NEEDS_REVIEW.
        emergency_above: only for a pure function: at or above this confidence the
            DIM rejects the proposal (GUARD_EMERGENCY). None: the guard only flags.
    """

    kind: type[Any]
    check: GuardFn | SoftGuard
    flag_above: float = 0.5
    emergency_above: float | None = None

    @property
    def name(self) -> str:
        """The guard's name as events report it."""
        return str(getattr(self.check, "__name__", type(self.check).__name__))

    @property
    def deterministic(self) -> bool:
        """Whether the check is a plain function (an emergency rule may only be one)."""
        return inspect.isfunction(self.check) and not inspect.iscoroutinefunction(self.check)


def confidence_text(confidence: float) -> str:
    """The confidence as recorded: a short decimal string, never a float in an event."""
    return f"{confidence:.4g}"


def well_formed(finding: Any) -> bool:
    """Whether a guard's answer is a finding with a confidence in [0, 1] (NaN is not)."""
    return isinstance(finding, GuardFinding) and 0.0 <= finding.confidence <= 1.0


def emergency(
    proposal: ProposalRecord, params: Any, state: Mapping[str, Any], guards: Sequence[Guard]
) -> Feedback | None:
    """Run the emergency rules of a kind (inline in the DIM's rules layer); return a rejection.

    A rule that raises or answers nonsense rejects with KERNEL_FAULT, like any rule.
    """
    for guard in guards:
        threshold = guard.emergency_above
        if threshold is None:
            continue
        where = f"guard {guard.name}"
        check = cast(GuardFn, guard.check)
        try:
            finding = check(proposal, params, state)
        except Exception as exc:
            detail = f"{where}: {type(exc).__name__}: {exc}"[:300]
            return Feedback(
                reason_code=ReasonCode.KERNEL_FAULT, detail=detail, layer="rules", rule=where
            )
        if finding is None:
            continue
        if not well_formed(finding):
            detail = f"{where} returned {finding!r}, not a finding with a confidence in [0, 1]"
            return Feedback(
                reason_code=ReasonCode.KERNEL_FAULT, detail=detail[:300], layer="rules", rule=where
            )
        if finding.confidence >= threshold:
            return Feedback(
                reason_code=ReasonCode.GUARD_EMERGENCY,
                detail=f"{finding.reason} (confidence {confidence_text(finding.confidence)},"
                f" emergency threshold {confidence_text(threshold)})"[:500],
                layer="rules",
                field="explain",
                rule=where,
                limit=confidence_text(threshold),
            )
    return None
