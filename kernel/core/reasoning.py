"""The computation budget of a DecisionFlow: tokens spent reasoning, and a wall-time cap.

Agents report what their reasoning costs (``ctx.report_usage(tokens=...)``);
the kernel adds it up per DFID, across attempts. When a flow goes over its cap
the kernel cancels the agent's reasoning for that flow at its next await (the
"SIGKILL of the thought") and the flow aborts with TOKEN_BUDGET_EXHAUSTED; a
reasoning step that outlasts the wall-time cap (read on the kernel's clock)
is cancelled the same way and the flow aborts with REASONING_TIMEOUT.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from functools import partial
from typing import TypeVar

import anyio

from kernel.core.ports import Clock
from kernel.core.reasons import ReasonCode
from kernel.core.wall import InputInvalid, UsageSpec, admit

T = TypeVar("T")


class UsageMeter:
    """What one flow's reasoning has spent, and the scope to cancel when it is too much.

    Args:
        dfid: the flow.
        cap_tokens: the most tokens the flow may spend in all; None for no cap.
        spent: what earlier attempts of the flow already spent.
    """

    def __init__(self, dfid: str, cap_tokens: int | None, spent: int = 0) -> None:
        self.dfid = dfid
        self.cap_tokens = cap_tokens
        self.tokens = spent
        self.models: dict[str, int] = {}
        """This attempt's tokens by model (what the price table turns into money)."""
        self.stopped: tuple[ReasonCode, str] | None = None
        self.scope: anyio.CancelScope | None = None

    def add(self, tokens: int, model: str = "") -> None:
        """Count ``tokens`` more (of ``model``, if named); past the cap, stop the reasoning.

        Raises:
            InputInvalid: ``tokens`` is not a whole number of tokens within 64 bits
                (a ``nan`` would silently switch the budget off); the reasoning is
                stopped too, failing closed, and the flow ends SCHEMA_INVALID.
        """
        try:
            checked = admit({"tokens": tokens, "model": model}, UsageSpec)
        except InputInvalid as exc:
            self.stop(ReasonCode.SCHEMA_INVALID, f"a usage report: {exc.detail}"[:500])
            raise
        tokens = checked.tokens
        self.models[checked.model] = self.models.get(checked.model, 0) + tokens
        self.tokens += tokens
        if self.cap_tokens is not None and self.tokens > self.cap_tokens:
            detail = f"reasoning spent {self.tokens} tokens, over the cap of {self.cap_tokens}"
            self.stop(ReasonCode.TOKEN_BUDGET_EXHAUSTED, detail)

    def stop(self, code: ReasonCode, detail: str) -> None:
        """Cancel the reasoning, remembering why (the first reason wins)."""
        if self.stopped is None:
            self.stopped = (code, detail)
        if self.scope is not None:
            self.scope.cancel()


current_meter: ContextVar[UsageMeter | None] = ContextVar("dir_usage_meter", default=None)
"""The meter of the reasoning step running in this task (tasks it starts inherit it)."""


def report_usage(dfid: str, tokens: int, model: str = "") -> None:
    """Count ``tokens`` (of ``model``) against flow ``dfid``, if the kernel meters it here."""
    meter = current_meter.get()
    if meter is not None and meter.dfid == dfid:
        meter.add(tokens, model)


async def metered(
    step: Callable[[], Awaitable[T]],
    meter: UsageMeter,
    clock: Clock,
    timeout_s: float | None,
    spawn: Callable[[Callable[[], Awaitable[None]]], None],
) -> T | None:
    """Run one reasoning step under ``meter``; return its result, or None if it was stopped.

    ``spawn`` starts the deadline beside the step (in the kernel's task group),
    so the step's own exceptions reach the caller as they are, not in a group.
    """
    # Only a capped step has a timer: cancelling a scope formats the current task's repr.
    timer = None if timeout_s is None else anyio.CancelScope()
    token = current_meter.set(meter)
    result: T | None = None
    try:
        with anyio.CancelScope() as scope:
            meter.scope = scope
            if meter.stopped is not None:
                scope.cancel()
            if timer is not None and timeout_s is not None:
                # The cap counts from now, not from whenever the timer task first runs.
                due_ns = clock.now_ns() + int(timeout_s * 1e9)
                spawn(partial(_deadline, timer, meter, clock, timeout_s, due_ns))
            result = await step()
    finally:
        if timer is not None:
            timer.cancel()
        meter.scope = None
        current_meter.reset(token)
    return None if meter.stopped is not None else result


async def _deadline(
    timer: anyio.CancelScope, meter: UsageMeter, clock: Clock, cap_s: float, due_ns: int
) -> None:
    """Stop the reasoning ``meter`` meters at ``due_ns`` unless ``timer`` is cancelled first."""
    with timer:
        await clock.sleep(max(0.0, (due_ns - clock.now_ns()) / 1e9))
        detail = f"one reasoning step took longer than the cap of {cap_s:g} s"
        meter.stop(ReasonCode.REASONING_TIMEOUT, detail)
