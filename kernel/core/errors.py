"""What a caller of the kernel sees when it stops, or when an actor could not serve it."""

from __future__ import annotations

from kernel.core.reasons import StopReason


class KernelShutdown(Exception):
    """The kernel stopped; ``reason`` (a ``StopReason``) says why, ``detail`` says more."""

    def __init__(self, reason: StopReason, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class KernelFault(Exception):
    """A request the kernel could not carry out because an actor failed on it twice."""
