"""The Agent base class."""

from __future__ import annotations

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

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        """Return a proposal for this flow, or None to decline to act."""
        raise NotImplementedError
