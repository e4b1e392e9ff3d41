"""The trading pack 0.3.0, exactly as it judged: kept so its journals re-judge.

0.4.0 (:mod:`policies.trading`) added a daily notional budget and a two-person rule
above 27,500.00 USD, and reads its threshold in USD; everything else is the same kinds
and rules, so 0.3.0 is 0.4.0 without them, and hashes as 0.3.0 always did (the hash
covers what decides, never where it was written). Pass :data:`TRADING_0_3` beside the
current pack to re-judge a journal recorded under it.
"""

from __future__ import annotations

from dataclasses import replace

from policies.trading import TRADING

TRADING_0_3 = replace(
    TRADING,
    version="0.3.0",
    costs=(),
    budgets=(),
    quorums=(),
    # 0.3.0 told its threshold in cents, not USD.
    thresholds=tuple(replace(t, currency="") for t in TRADING.thresholds),
)
"""Trading 0.3.0."""
