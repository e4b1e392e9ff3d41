"""The trading pack's next version, 0.5.0: a candidate the desk runs as a shadow first.

Tighter than 0.4.0 (:mod:`policies.trading`) in two places a risk committee asked for:
an order's notional above 10,000.00 USD goes to a human (0.4.0: 25,000.00), and an
agent's ``max_order_notional`` defaults to 30,000.00 USD (0.4.0: 50,000.00). Everything
else is 0.4.0. ``examples.trading`` loads it as a shadow of 0.4.0 for part of the day
and prints the shadow report (docs/policy-lifecycle.md): the verdicts 0.5.0 would have
changed, by reason, agent and principal, and the money they touch, before it decides
anything.
"""

from __future__ import annotations

from dataclasses import replace

from kernel.policy import LimitSpec
from policies.trading import TRADING

TRADING_0_5 = replace(
    TRADING,
    version="0.5.0",
    thresholds=tuple(replace(t, above=1_000_000) for t in TRADING.thresholds),
    limits={
        **TRADING.limits,
        "max_order_notional": LimitSpec(default=3_000_000, floor=0, ceiling=20_000_000),
    },
)
"""Trading 0.5.0 (a candidate: shadowed by the example, not enforced)."""
