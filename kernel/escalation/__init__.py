"""The escalation manager actor: flows that need a human wait here for one."""

from kernel.escalation._manager import KERNEL_OPERATOR, EscalationManager, EscalationPolicy

__all__ = [
    "KERNEL_OPERATOR",
    "EscalationManager",
    "EscalationPolicy",
]
