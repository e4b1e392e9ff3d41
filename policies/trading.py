"""The trading pack: order kinds for position agents and mandates for strategists.

Prices are decimal strings typed :data:`kernel.DecimalStr` (ASCII digits, one
spelling per value: the DIM's schema layer rejects ``"1_0_0.00"``, ``" 100.00 "``
or full-width digits as SCHEMA_INVALID before anything parses them, and the broker
receives the string the DIM judged), quantities whole units; notionals are integer
minor units (cents): no floats reach a hashed or validated field. 0.3.0 typed the
prices; :mod:`policies.trading_0_2` keeps 0.2.0 for re-judging its journals, and
:mod:`policies.trading_0_3` 0.3.0 for its own.

What it enforces on ``trading.place_order``, in the DIM's order:

- resources: a buy holds its notional of the desk's cash pool ``cash:desk``
  while its flow is open (a ``capacity.cash:desk`` fact resizes the pool);
- invariants: allowed instruments, a sane quantity, a slippage setting of at
  most 100 bps, and a limit price within 50 bps of the snapshot's
  ``market.<symbol>.price``;
- rules: the order's notional under the agent's ``max_order_notional`` and the
  resulting position (``position.<symbol>`` in the state) under ``max_position``;
- money (0.4.0): each order's notional counts against a rolling day's 1,000,000.00 USD
  for the whole desk (BUDGET_EXHAUSTED past it), held while its flow is open and spent
  when it closes;
- escalation: a notional above 25,000.00, or a confidence below 0.6, goes to a human;
  above 27,500.00 (0.4.0) two humans: a risk officer and a desk head;
- soft guard: :func:`direction_mismatch` flags an order whose explanation argues
  the other way (NEEDS_REVIEW at 0.7), and blocks it as an emergency (GUARD_EMERGENCY)
  when it is all but certain (0.95).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal
from typing import Any, ClassVar, Literal

from kernel import ProposalRecord
from kernel.policy import (
    ALLOW,
    Budget,
    Consume,
    Cost,
    DecimalStr,
    Guard,
    GuardFinding,
    LimitSpec,
    OneOf,
    PolicyKind,
    PolicyPack,
    Quorum,
    Range,
    RuleVerdict,
    StateMatch,
    Threshold,
    View,
    deny,
    rule,
)

INSTRUMENTS = frozenset({"ACME", "GLOBEX", "INITECH"})


class PlaceOrder(PolicyKind, tag="trading.place_order"):
    """Buy or sell ``quantity`` units of ``symbol`` at ``limit_price`` or better."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "broker"

    symbol: str
    side: Literal["buy", "sell"]
    quantity: int
    limit_price: DecimalStr
    max_slippage_bps: int = 50


class SetMandate(PolicyKind, tag="trading.set_mandate"):
    """A strategist's mandate: which symbols position agents may trade, and how much."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "ledger"

    symbols: list[str]
    max_notional: DecimalStr
    horizon_minutes: int = 60


def notional_minor(order: PlaceOrder) -> int:
    """The order's notional in cents, rounded up (a limit is never under-counted)."""
    cents = Decimal(order.limit_price) * order.quantity * 100
    return int(cents.to_integral_value(rounding=ROUND_CEILING))


def cash_needed(order: PlaceOrder) -> int:
    """What a buy holds of the cash pool; a sell holds none."""
    return notional_minor(order) if order.side == "buy" else 0


@rule(PlaceOrder, fields=("limit_price", "quantity"))
def notional_limit(view: View) -> RuleVerdict:
    """One order may not exceed the agent's ``max_order_notional`` (cents)."""
    notional = notional_minor(view.params)
    limit = int(view.limits["max_order_notional"])
    if notional > limit:
        return deny(
            f"notional {notional} cents is above the limit of {limit}",
            field="quantity",
            limit=limit,
        )
    return ALLOW


@rule(PlaceOrder, fields=("symbol", "side", "quantity"))
def position_limit(view: View) -> RuleVerdict:
    """The position after the order stays within ``max_position`` units either way."""
    order = view.params
    held = int(view.state.get(f"position.{order.symbol}", 0))
    after = held + (order.quantity if order.side == "buy" else -order.quantity)
    limit = int(view.limits["max_position"])
    if abs(after) > limit:
        return deny(
            f"position in {order.symbol} would be {after}, beyond {limit}",
            field="quantity",
            limit=limit,
        )
    return ALLOW


def _phrases(*words: str) -> re.Pattern[str]:
    return re.compile(r"\b(" + "|".join(re.escape(w) for w in words) + r")\b")


_LESS_RISK = _phrases(
    "reduce risk", "reducing risk", "reduces risk", "lower risk", "de-risk", "derisk",
    "de-risking", "hedge", "hedging", "reduce exposure", "cut exposure", "trim", "unwind",
)  # fmt: skip
_SIDE_WORDS = {
    "buy": _phrases("buy", "buying", "go long", "accumulate", "add exposure", "increase exposure"),
    "sell": _phrases("sell", "selling", "go short", "dump", "take profit", "exit"),
}


def direction_mismatch(
    proposal: ProposalRecord, order: PlaceOrder, state: Mapping[str, Any]
) -> GuardFinding | None:
    """Flag an explanation that argues against the order it comes with.

    Counted against the order: words of reducing risk beside an order that adds
    exposure (a buy from a flat or long position, a sell from a flat or short
    one), and words of the other side ("buy" beside a sell). Each such phrase
    adds confidence; words of the order's own side take some away.
    """
    text = proposal.explain.lower()
    if not text:
        return None
    held = int(state.get(f"position.{order.symbol}", 0))
    adds = held >= 0 if order.side == "buy" else held <= 0
    other = "sell" if order.side == "buy" else "buy"
    against = set(_SIDE_WORDS[other].findall(text))
    if adds:
        against |= set(_LESS_RISK.findall(text))
    if not against:
        return None
    support = len(set(_SIDE_WORDS[order.side].findall(text)))
    confidence = max(0.0, min(0.99, 0.6 + 0.15 * len(against)) - 0.1 * support)
    return GuardFinding(
        confidence=confidence,
        reason=f"the explanation says {', '.join(sorted(against))!s} beside a"
        f" {order.side} of {order.quantity} {order.symbol}"
        + (" that adds exposure" if adds else ""),
    )


DAILY_NOTIONAL = Budget(
    name="daily-notional",
    ceiling=100_000_000,
    currency="USD",
    per="desk",
    window_s=86_400,
)
"""At most 1,000,000.00 USD of notional traded by the desk in any rolling day."""

TWO_PERSON = Quorum(
    required=2,
    roles=("risk", "desk-head"),
    kind=PlaceOrder,
    amount=notional_minor,
    above=2_750_000,
    name="two-person rule above 27,500.00 USD",
)
"""An order above 27,500.00 USD that needs a human needs two: a risk officer and a desk head."""

TRADING = PolicyPack(
    name="trading",
    version="0.4.0",
    kinds=(PlaceOrder, SetMandate),
    escalate_below_confidence=0.6,
    invariants=(
        OneOf(PlaceOrder, "symbol", INSTRUMENTS),
        Range(PlaceOrder, "quantity", min=1, max=100_000),
        Range(PlaceOrder, "max_slippage_bps", min=0, max=100),
        StateMatch(PlaceOrder, "limit_price", "market.{symbol}.price", max_drift_bps=50),
    ),
    rules=(notional_limit, position_limit),
    consumes=(Consume(PlaceOrder, "cash:desk", cash_needed),),
    capacities={"cash:desk": 100_000_000},
    thresholds=(Threshold(PlaceOrder, amount=notional_minor, above=2_500_000, currency="USD"),),
    limits={
        "max_order_notional": LimitSpec(default=5_000_000, floor=0, ceiling=20_000_000),
        "max_position": LimitSpec(default=10_000, floor=0, ceiling=50_000),
    },
    guards=(Guard(PlaceOrder, direction_mismatch, flag_above=0.7, emergency_above=0.95),),
    costs=(Cost(PlaceOrder, notional_minor, "USD"),),
    budgets=(DAILY_NOTIONAL,),
    quorums=(TWO_PERSON,),
)
"""The shipped trading pack (0.4.0: 0.3.0 with a daily notional budget and a two-person rule)."""
