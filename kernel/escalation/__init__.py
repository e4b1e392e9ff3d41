"""The escalation desk actor: flows that need a human wait here for one."""

from kernel.escalation._checks import same_principal
from kernel.escalation._manager import (
    KERNEL_OPERATOR,
    EscalationDesk,
    EscalationPolicy,
)

__all__ = [
    "KERNEL_OPERATOR",
    "EscalationDesk",
    "EscalationPolicy",
    "same_principal",
]
