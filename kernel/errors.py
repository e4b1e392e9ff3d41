"""What a caller of the kernel sees when it stops, or when an actor could not serve it."""

from __future__ import annotations


class KernelShutdown(Exception):
    """The kernel stopped (closed, restart intensity exceeded, or the journal failed)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class KernelFault(Exception):
    """A request the kernel could not carry out because an actor failed on it twice."""
