"""The desk pack 0.2.0, exactly as it judged: kept so the desk's journals re-judge.

Verdicts record the content hash of the pack that judged them, so a journal written
under 0.2.0 is re-judged with :data:`DESK_0_2` beside the current
:data:`examples.desk.DESK` (0.3.0 adds the drift monitor, which enters the hash). The
kind is the current one, unchanged since 0.2.0: edit it and this pack's hash changes too.
"""

from __future__ import annotations

from examples.desk import Rebalance
from kernel.policy import OneOf, PolicyPack, Range
from policies.trading import INSTRUMENTS

DESK_0_2 = PolicyPack(
    name="desk",
    version="0.2.0",
    kinds=(Rebalance,),
    escalate_below_confidence=0.6,
    invariants=(
        OneOf(Rebalance, "sell_symbol", INSTRUMENTS),
        OneOf(Rebalance, "buy_symbol", INSTRUMENTS),
        Range(Rebalance, "sell_quantity", min=1, max=10_000),
        Range(Rebalance, "buy_quantity", min=1, max=10_000),
    ),
)
