"""The hash of the action a waiting flow asks a human to approve: what ``decide`` takes.

An approval is bound to the hash of the exact action (kernel.state.approvals), so
an operator's ``approve`` names it: a decision made on what was shown never
approves anything else. Code that approves in process (``Kernel.decide``) reads
it here, as the console and ``dirk review`` show it.
"""

from __future__ import annotations

from kernel.api.facade import Kernel


def action_hash(kernel: Kernel, dfid: str) -> str | None:
    """Return the hash of the action flow ``dfid`` waits on, or None when it waits on none."""
    approval = kernel.projections.approvals.get(dfid)
    return approval.action_hash if approval is not None else None
