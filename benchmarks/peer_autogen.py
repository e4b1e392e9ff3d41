"""The autogen-core peer of P9 (see benchmarks.peers): a proposer asks a validator.

Kept apart, without postponed annotations: autogen-core reads the handlers'
type hints at registration to route messages, so they must be real classes.
"""

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from autogen_core import (
    AgentId,
    MessageContext,
    RoutedAgent,
    SingleThreadedAgentRuntime,
    message_handler,
)


@dataclass
class Propose:
    quantity: int


@dataclass
class Verdict:
    ok: bool


class Validator(RoutedAgent):
    """Judges a proposal with the shared rule."""

    def __init__(self, rule: Callable[[int], bool]) -> None:
        super().__init__("validates proposals")
        self._rule = rule

    @message_handler
    async def on_propose(self, message: Propose, ctx: MessageContext) -> Verdict:
        return Verdict(ok=self._rule(message.quantity))


class Proposer(RoutedAgent):
    """Forwards a proposal to the validator and returns its verdict."""

    def __init__(self) -> None:
        super().__init__("proposes and awaits the verdict")

    @message_handler
    async def on_propose(self, message: Propose, ctx: MessageContext) -> Verdict:
        verdict = await self.send_message(message, AgentId("validator", "default"))
        assert isinstance(verdict, Verdict)
        return verdict


async def run(n: int, in_flight: int, rule: Callable[[int], bool]) -> tuple[int, float]:
    """Return (accepted verdicts, seconds) for ``n`` requests, ``in_flight`` at a time."""
    runtime = SingleThreadedAgentRuntime()
    await Validator.register(runtime, "validator", lambda: Validator(rule))
    await Proposer.register(runtime, "proposer", Proposer)
    runtime.start()
    limit = asyncio.Semaphore(in_flight)
    accepted = 0

    async def one(i: int) -> None:
        nonlocal accepted
        async with limit:
            verdict = await runtime.send_message(
                Propose(quantity=1 + i % 100), AgentId("proposer", "default")
            )
            accepted += verdict.ok

    start = time.perf_counter()
    try:
        await asyncio.gather(*(one(i) for i in range(n)))
        seconds = time.perf_counter() - start
    finally:
        await runtime.stop_when_idle()
    return accepted, seconds
