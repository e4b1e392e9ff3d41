"""The desk pack 0.1.0, exactly as it judged: kept so the desk's journals re-judge.

Verdicts record the content hash of the pack that judged them, so a journal
written under 0.1.0 (``tests/golden/trading.db``) is re-judged with
:data:`DESK_0_1` beside the current :data:`examples.desk.DESK`. Do not edit the
kind or the pack below: their source is the hash. 0.2.0 types the limits as
:data:`kernel.DecimalStr`; this version takes any string there, so do not run it.
"""

from __future__ import annotations

from typing import ClassVar

from kernel.adapters import SagaStep
from kernel.policy import OneOf, PolicyKind, PolicyPack, Range
from policies.trading import INSTRUMENTS


class Rebalance(PolicyKind, tag="desk.rebalance"):
    """Sell ``sell_quantity`` of one symbol to fund a buy of another: a two-step saga.

    If the buy fails after the sell took effect, the sell is undone (bought back).
    """

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "broker"

    sell_symbol: str
    sell_quantity: int
    sell_limit: str
    buy_symbol: str
    buy_quantity: int
    buy_limit: str

    def steps(self) -> list[SagaStep]:
        sell = {"symbol": self.sell_symbol, "quantity": self.sell_quantity}
        buy = {"symbol": self.buy_symbol, "quantity": self.buy_quantity}
        return [
            SagaStep(
                action="sell",
                params={**sell, "side": "sell", "limit_price": self.sell_limit},
                compensation={**sell, "side": "buy", "limit_price": self.sell_limit},
            ),
            SagaStep(
                action="buy",
                params={**buy, "side": "buy", "limit_price": self.buy_limit},
                compensation={**buy, "side": "sell", "limit_price": self.buy_limit},
            ),
        ]


DESK_0_1 = PolicyPack(
    name="desk",
    version="0.1.0",
    kinds=(Rebalance,),
    escalate_below_confidence=0.6,
    invariants=(
        OneOf(Rebalance, "sell_symbol", INSTRUMENTS),
        OneOf(Rebalance, "buy_symbol", INSTRUMENTS),
        Range(Rebalance, "sell_quantity", min=1, max=10_000),
        Range(Rebalance, "buy_quantity", min=1, max=10_000),
    ),
)
"""The desk pack 0.1.0, for re-judging journals it judged."""
