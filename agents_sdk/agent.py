"""The Agent base class."""

from __future__ import annotations

from typing import ClassVar

from kernel import Manifest, Proposal, WorkingContext


class Agent:
    """Base of an agent: a manifest and one ``decide``.

    The kernel calls :meth:`decide` once per attempt of each DecisionFlow the
    agent is woken for. After a rejection it calls it again with
    ``ctx.feedback`` set (reason code, detail, field), so the agent can revise
    within the same DFID until its attempts are spent.

    Example::

        class Trader(Agent):
            manifest = Manifest(agent_id="trader", version="1.0",
                                capabilities=["trading.place_order"],
                                subscriptions=["market"])

            async def decide(self, ctx):
                price = ctx.state["market.ACME.price"]
                return ctx.propose(PlaceOrder(symbol="ACME", side="buy", quantity=10,
                                              limit_price=price),
                                   explain="momentum", confidence=0.8)
    """

    manifest: Manifest
    synchronous: ClassVar[bool] = False
    """True when :meth:`decide` never waits (no ``await`` that suspends: rules, arithmetic,
    a local model called inline). The kernel then runs it to completion where its context
    is delivered, without a task or a mailbox between them, which is most of what hosting
    costs an instant agent. A ``decide`` that waits after all is closed at that wait and
    run again from the start by the agent's own tasks, which take its contexts from then
    on: say True only of a ``decide`` that never waits."""

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        """Return a proposal for this flow, or None to decline to act."""
        raise NotImplementedError
