"""The trading pack: order kinds for position agents and mandates for strategists.

Prices are decimal strings and quantities whole units: no floats reach a
hashed or validated field.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from kernel import PolicyKind, PolicyPack


class PlaceOrder(PolicyKind, tag="trading.place_order"):
    """Buy or sell ``quantity`` units of ``symbol`` at ``limit_price`` or better."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "broker"

    symbol: str
    side: Literal["buy", "sell"]
    quantity: int
    limit_price: str
    max_slippage_bps: int = 50


class SetMandate(PolicyKind, tag="trading.set_mandate"):
    """A strategist's mandate: which symbols position agents may trade, and how much."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "ledger"

    symbols: list[str]
    max_notional: str
    horizon_minutes: int = 60


TRADING = PolicyPack(
    name="trading",
    version="0.1.0",
    kinds=(PlaceOrder, SetMandate),
    escalate_below_confidence=0.6,
)
