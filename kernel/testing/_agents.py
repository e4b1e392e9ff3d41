"""Scripted agents and small readers of a running kernel, for tests of flows end to end."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import anyio

from kernel.api.approving import action_hash
from kernel.core.events import Manifest
from kernel.policy.contracts import Proposal, WorkingContext

if TYPE_CHECKING:
    from kernel.api import Kernel

Step = Callable[[WorkingContext], Proposal | None]
"""One attempt of a scripted agent: the proposal it makes on the context it was given."""


class ScriptedAgent:
    """An agent that plays its steps in order, one per attempt, and remembers every context.

    Attempt n of a flow plays step n (the last step again once they run out), so a
    script such as ``[too_big, right_size]`` revises after a rejection. With
    ``hold`` set, each decision waits for the event first (a slow model).

    Args:
        agent_id: the manifest's agent id.
        steps: what the agent proposes at each attempt.
        capabilities: the policy kinds it may propose.
        subscriptions: the trigger topics that wake it.
        version: the DIR contract version it speaks.
        max_attempts: attempts per flow.
        hold: an event each decision waits for.
    """

    def __init__(
        self,
        agent_id: str,
        steps: Sequence[Step],
        *,
        capabilities: Sequence[str] = (),
        subscriptions: Sequence[str] = (),
        version: str = "1.0.0",
        max_attempts: int = 3,
        hold: anyio.Event | None = None,
    ) -> None:
        if not steps:
            raise ValueError("a scripted agent needs at least one step")
        self.manifest = Manifest(
            agent_id=agent_id,
            version=version,
            capabilities=list(capabilities),
            subscriptions=list(subscriptions),
            max_attempts=max_attempts,
        )
        self.steps = list(steps)
        self.contexts: list[WorkingContext] = []
        self.hold = hold
        self._arrived = anyio.Event()

    async def wait_context(self, count: int = 1) -> WorkingContext:
        """Wait until the agent has been handed ``count`` contexts; return the last."""
        while len(self.contexts) < count:
            await self._arrived.wait()
            self._arrived = anyio.Event()
        return self.contexts[count - 1]

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        """Record ``ctx``, wait for the hold if any, and play this attempt's step."""
        self.contexts.append(ctx)
        self._arrived.set()
        if self.hold is not None:
            await self.hold.wait()
        step = self.steps[min(ctx.attempt, len(self.steps)) - 1]
        return step(ctx)


def action_of(kernel: Kernel, dfid: str) -> str | None:
    """The hash of the action flow ``dfid`` waits on (what approving it takes), if it waits.

    The same as the public :func:`kernel.action_hash`, kept for the tests that use it.
    """
    return action_hash(kernel, dfid)


async def flow_types(kernel: Kernel, dfid: str) -> list[str]:
    """The event types of one flow, in the order the journal holds them."""
    return [event.type for event in await kernel.journal.flow_events(dfid)]
