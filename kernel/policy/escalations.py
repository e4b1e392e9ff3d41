"""How often an agent may ask a human before the kernel demotes it.

An escalation is a human's time. An agent that escalates more often than its
budget allows (a token bucket: ``capacity`` escalations, refilled evenly over
``period_s``) has the escalation over budget aborted (ESCALATION_BUDGET_EXHAUSTED)
and is demoted to PASSIVE: it may observe, and every later proposal is refused
AGENT_PASSIVE until an operator sets it ACTIVE again (``dirk agent-status``).

The kernel's default (``KernelConfig.escalation.budget``) is 3 an hour, so the
fourth escalation in an hour demotes; a pack may set its own for its kinds
(``PolicyPack.escalation_budget``), which enters the pack's hash only when set.
"""

from __future__ import annotations

import msgspec


class EscalationBudget(msgspec.Struct, frozen=True, kw_only=True):
    """An escalation budget: ``capacity`` escalations, refilled evenly over ``period_s``."""

    capacity: int = 3
    period_s: float = 3600.0

    def __post_init__(self) -> None:
        if not isinstance(self.capacity, int) or self.capacity < 1:
            raise ValueError(
                f"an escalation budget's capacity is at least 1, not {self.capacity!r}"
            )
        if not self.period_s > 0:
            raise ValueError(f"an escalation budget's period_s is above 0, not {self.period_s!r}")
