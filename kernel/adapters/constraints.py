"""Execution constraints: the bounds an intent must still meet at the moment of execution.

The DIM judged a proposal against the world as it was; by the time the engine
calls the adapter (after a human's approval, a backoff, a restart) the world
may have moved. The intent therefore carries bounds, taken from the accepted
parameters, and the engine checks them against the adapter's live
:class:`~kernel.adapters.contract.Quote` just before the first call of a key:

- ``limit_price``: a buy may not fill above it, a sell not below it;
- ``max_slippage_bps`` with ``reference_price``: the price may not have moved
  further than this from the price the decision was made on (against the
  ``side`` when one is given, either way otherwise);
- ``required_market_state``: e.g. ``"open"``;
- ``valid_until_ns``: the proposal's validity window, against the clock.

A policy kind may compute its bounds itself with ``execution_bounds(self)
-> dict``; otherwise the parameters of these names are used. Prices are
decimal strings, parsed strictly (:func:`kernel.policy.rules.decimal_of`): a bound is
never compared in floating point, and a quote's price that is not a decimal
string (a float, ``"NaN"``, ``" 101.5"``) is no price: the check fails closed. An adapter
without ``quote`` gets only the validity check; its bounds travel in the
intent for the system behind it to enforce (a limit order at the exchange).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import msgspec

from kernel.adapters.contract import Quote
from kernel.policy.rules import decimal_of

BOUND_NAMES = (
    "limit_price",
    "reference_price",
    "max_slippage_bps",
    "side",
    "required_market_state",
)


class Violation(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """The bound the world no longer meets, with what was observed."""

    bound: str
    detail: str
    observed: dict[str, Any] = {}


def bounds_of(policy: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Return the execution bounds of an accepted policy (empty when it has none)."""
    custom = getattr(policy, "execution_bounds", None)
    if callable(custom):
        return dict(custom())
    return {name: params[name] for name in BOUND_NAMES if params.get(name) is not None}


def check(
    bounds: dict[str, Any], valid_until_ns: int | None, quote: Quote | None, now_ns: int
) -> Violation | None:
    """Return the first bound the world violates now, or None when all hold.

    A bound that needs a quote fails closed when there is none to judge it by.
    """
    late = _expired(valid_until_ns, now_ns)
    if late is not None or not bounds:
        return late
    observed = msgspec.to_builtins(quote) if quote is not None else {}
    failed = _market_state(bounds, quote, observed) or _not_decimal(bounds, observed)
    if failed is not None or not any(bounds.get(n) is not None for n in _PRICED):
        return failed
    price = decimal_of(quote.price) if quote is not None and quote.price is not None else None
    if price is None:
        return Violation(bound="price", detail="no live price to check bounds", observed=observed)
    return _limit(bounds, price, observed) or _slippage(bounds, price, observed)


_PRICED = ("limit_price", "max_slippage_bps")
"""The bounds that need a live price."""


def _expired(valid_until_ns: int | None, now_ns: int) -> Violation | None:
    if valid_until_ns is None or now_ns <= valid_until_ns:
        return None
    late_ms = (now_ns - valid_until_ns) // 1_000_000
    return Violation(
        bound="valid_until_ns",
        detail=f"validity window ended {late_ms} ms before execution",
        observed={"now_ns": now_ns},
    )


def _market_state(
    bounds: dict[str, Any], quote: Quote | None, observed: dict[str, Any]
) -> Violation | None:
    state = bounds.get("required_market_state")
    if state is None or (quote is not None and quote.market_state == state):
        return None
    found = quote.market_state if quote else None
    return Violation(
        bound="required_market_state",
        detail=f"market is {found}, the intent requires {state}",
        observed=observed,
    )


def _not_decimal(bounds: dict[str, Any], observed: dict[str, Any]) -> Violation | None:
    for name in ("limit_price", "reference_price", "max_slippage_bps"):
        if bounds.get(name) is not None and decimal_of(bounds[name]) is None:
            return Violation(
                bound=name,
                detail=f"{name} {bounds[name]!r} is not a decimal string: it bounds nothing",
                observed=observed,
            )
    return None


def _limit(bounds: dict[str, Any], price: Decimal, observed: dict[str, Any]) -> Violation | None:
    side = bounds.get("side")
    limit = decimal_of(bounds.get("limit_price"))
    if limit is None:
        return None
    if (side == "sell" and price < limit) or (side != "sell" and price > limit):
        return Violation(
            bound="limit_price",
            detail=f"price {price} is beyond the limit {limit} ({side or 'buy'})",
            observed=observed,
        )
    return None


def _slippage(bounds: dict[str, Any], price: Decimal, observed: dict[str, Any]) -> Violation | None:
    max_bps = decimal_of(bounds.get("max_slippage_bps"))
    reference = decimal_of(bounds.get("reference_price"))
    if max_bps is None or reference is None or reference <= 0:
        return None
    move = (price - reference) / reference * 10_000
    adverse = {"buy": move, "sell": -move}.get(bounds.get("side") or "", abs(move))
    if adverse <= max_bps:
        return None
    return Violation(
        bound="max_slippage_bps",
        detail=(
            f"price moved from {reference} to {price}: {move:.1f} bps, the bound is {max_bps} bps"
        ),
        observed={**observed, "reference_price": str(reference)},
    )
