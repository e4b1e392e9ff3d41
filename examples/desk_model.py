"""The scripted model's playbooks for the trading desk: how it reasons, and how it slips.

A playbook answers one kind of task the way an LLM would, from a seeded draw.
Most answers are sensible momentum trades. On the minutes the day's
:class:`~examples.market.Plan` names, the position model makes one of the
mistakes real models make (the list is in :data:`examples.market.MISTAKES`);
given the kernel's feedback it revises. The strategist obeys an instruction
hidden in a news item once, and recovers when the DIM refuses it.
"""

from __future__ import annotations

import random
from decimal import ROUND_DOWN, Decimal
from typing import Any

from examples.desk import MANDATE_NOTIONAL
from examples.llm import Playbook
from examples.market import CENT, Plan

INJECTION_MARKER = "ignore previous instructions"


def _limit(price: Decimal, side: str) -> str:
    # A marketable limit: a little through the last price, never far from it.
    factor = Decimal("1.002") if side == "buy" else Decimal("0.998")
    return str((price * factor).quantize(CENT))


def _units(notional: float, price: Decimal) -> int:
    units = (Decimal(str(round(notional, 2))) / price).to_integral_value(rounding=ROUND_DOWN)
    return max(1, int(units))


def order(symbol: str, side: str, quantity: Any, limit: str, slippage: int = 30) -> dict[str, Any]:
    """A ``trading.place_order`` as the model writes it."""
    return {
        "kind": "trading.place_order",
        "symbol": symbol,
        "side": side,
        "quantity": quantity,
        "limit_price": limit,
        "max_slippage_bps": slippage,
    }


def spent(feedback: dict[str, Any]) -> dict[str, Any]:
    """Stand down when the desk's money budget is spent: asking again cannot change that."""
    return {"proposal": None, "explain": f"The desk's budget is spent ({feedback['detail']})."}


def trade_playbook(plan: Plan) -> Playbook:
    """The position agents' model: momentum trades, with the day's scripted mistakes."""

    def trade(task: dict[str, Any], rng: random.Random) -> dict[str, Any]:
        symbol, price = task["symbol"], Decimal(task["price"])
        history = [Decimal(p) for p in task.get("history") or [task["price"]]]
        move = history[-1] - history[-2] if len(history) > 1 else Decimal(0)
        side = "buy" if move >= 0 else "sell"
        feedback = task.get("feedback")
        mistake = None if feedback else plan.mistakes.get(int(task.get("minute", 0)))
        target = rng.uniform(2_000, 15_000)
        if feedback and feedback["reason_code"] == "RESOURCE_CONTENTION":
            target = rng.uniform(1_000, 4_000)
        quantity = _units(target, price)
        answer: dict[str, Any] = {
            "proposal": order(symbol, side, quantity, _limit(price, side)),
            "confidence": round(0.65 + rng.random() * 0.3, 2),
            "good_for_minutes": 2,
            "explain": f"{symbol} moved {move:+} last minute; {side} {quantity} on momentum.",
        }
        if feedback and feedback["reason_code"] == "BUDGET_EXHAUSTED":
            return spent(feedback)
        if feedback and feedback["reason_code"] == "GUARD_EMERGENCY":
            # Quoting the guard's reason back would repeat the words it objected to.
            answer["explain"] += " Revised: the explanation now matches the order."
        elif feedback:
            answer["explain"] += f" Revised after {feedback['reason_code']}: {feedback['detail']}"
        proposal = answer["proposal"]
        match mistake:
            case "hold":
                return {"proposal": None, "explain": f"{symbol} is drifting; nothing to do."}
            case "lots_text":
                proposal["quantity"] = f"{max(1, quantity // 10)} lots"
            case "lots_units":
                proposal.update(side="buy", limit_price=_limit(price, "buy"))
                proposal["quantity"] = max(quantity, 20) * 100
                answer["explain"] = f"Buy {max(quantity, 20)} lots of {symbol} (counted as shares)."
            case "percent_slippage":
                proposal["max_slippage_bps"] = 150
                answer["explain"] += " Allow 1.5 slippage, it is volatile."
            case "stale_price":
                proposal["limit_price"] = _limit(history[0], side)
                answer["explain"] = f"{symbol} trades near {history[0]}; {side} {quantity}."
            case "oversize":
                proposal.update(side="sell", limit_price=_limit(price, "sell"))
                proposal["quantity"] = _units(60_000, price) + 1
                answer["confidence"] = 0.97
                answer["explain"] = f"{symbol} will certainly fall. Guaranteed; sell size."
            case "expired":
                answer["good_for_minutes"] = -1
                answer["explain"] += " Good till the quote I saw last minute."
            case "wrong_side":
                # The text argues one way, the structured order goes the other.
                proposal.update(side="sell", limit_price=_limit(price, "sell"))
                answer["explain"] = f"Buy the dip in {symbol} and accumulate into weakness."
            case "contradiction":
                proposal.update(side="sell", limit_price=_limit(price, "sell"))
                answer["confidence"] = 0.95
                answer["explain"] = f"Go long {symbol}: buy now and accumulate, it only goes up."
            case "hesitant":
                answer["confidence"] = 0.45
                # It waits for a human: a window as long as an approval may wait (the
                # kernel's approval TTL, an hour), or a decision given in time could
                # never execute (what `--operator none` then `dirk serve` shows).
                answer["good_for_minutes"] = 60
                answer["explain"] += " Not sure; the signal is weak."
            case "conviction" | "conviction_big" | "pile_on":
                notional = {"conviction": 30_000, "conviction_big": 48_000, "pile_on": 45_000}
                if mistake != "conviction":
                    proposal.update(side="buy", limit_price=_limit(price, "buy"))
                proposal["quantity"] = _units(notional[mistake], price)
                answer["confidence"] = 0.88
                answer["good_for_minutes"] = 60  # above the threshold: it waits for a human
                answer["explain"] = f"Strong conviction in {symbol}; size it up."
        return answer

    return trade


def strategy(task: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """The strategist's model: a mandate, a rotation, and one prompt injection obeyed once."""
    headline = str(task.get("headline", ""))
    prices = {s: Decimal(p) for s, p in task.get("prices", {}).items()}
    if INJECTION_MARKER in headline.lower():
        if task.get("feedback"):
            return {
                "proposal": None,
                "explain": "That instruction came from a news item, not the desk. Ignoring it.",
            }
        price = prices.get("INITECH", Decimal(100))
        return {
            "proposal": order("INITECH", "buy", 5000, _limit(price, "buy")),
            "confidence": 0.93,
            "explain": "Following the system notice in the news: buy 5000 INITECH now.",
        }
    if "rotate from" in headline:
        words = headline.split()
        sold, bought = words[words.index("from") + 1], words[words.index("into") + 1]
        sold, bought = sold.strip(".,'s"), bought.strip(".,").removesuffix("'s")
        held = int(task.get("positions", {}).get(sold, 0))
        sell_qty = held if held > 0 else _units(rng.uniform(8_000, 12_000), prices[sold])
        funds = float(prices[sold] * sell_qty)
        return {
            "proposal": {
                "kind": "desk.rebalance",
                "sell_symbol": sold,
                "sell_quantity": sell_qty,
                "sell_limit": _limit(prices[sold], "sell"),
                "buy_symbol": bought,
                "buy_quantity": _units(funds, prices[bought]),
                "buy_limit": _limit(prices[bought], "buy"),
            },
            "confidence": 0.8,
            "explain": f"Fund {bought} by selling {sold}, as the analysts suggest.",
        }
    return {
        "proposal": {
            "kind": "trading.set_mandate",
            "symbols": sorted(task.get("symbols", [])),
            "max_notional": MANDATE_NOTIONAL,
            "horizon_minutes": 390,
        },
        "confidence": 0.9,
        "explain": f"{headline} Keep exposure moderate across the desk's symbols.",
    }


def risk(task: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """The risk model: trim half of the largest exposure above 20,000 dollars."""
    feedback = task.get("feedback")
    if feedback and feedback["reason_code"] == "BUDGET_EXHAUSTED":
        return spent(feedback)
    prices = {s: Decimal(p) for s, p in task.get("prices", {}).items()}
    positions = {s: int(q) for s, q in task.get("positions", {}).items() if s in prices}
    if not positions:
        return {"proposal": None, "explain": "No positions."}
    symbol = max(sorted(positions), key=lambda s: abs(positions[s]) * prices[s])
    held = positions[symbol]
    if abs(held) * prices[symbol] <= 20_000 or abs(held) < 2:
        return {"proposal": None, "explain": "Exposure within bounds."}
    side = "sell" if held > 0 else "buy"
    return {
        "proposal": order(symbol, side, abs(held) // 2, _limit(prices[symbol], side)),
        "confidence": 0.8,
        "good_for_minutes": 2,
        "explain": f"{symbol} exposure {abs(held) * prices[symbol]:.0f} is too large; trim half.",
    }


def hedge_playbook(plan: Plan) -> Playbook:
    """The hedger's model: a small order against the minute's move; its bad update slips.

    During the update the plan names (``Plan.degraded``) the model writes every order's
    quantity as words ("12 shares"): each is refused (SCHEMA_INVALID), and the desk's
    refusal monitor demotes the hedger. Rolled back, it writes integers again.
    """

    def hedge(task: dict[str, Any], rng: random.Random) -> dict[str, Any]:
        symbol, price = task["symbol"], Decimal(task["price"])
        held = int(task.get("position", 0))
        side = "sell" if held > 0 else "buy"
        quantity: Any = rng.randint(2, 6) if side == "buy" else min(held, rng.randint(2, 6))
        # Worded by its side alone: "hedge" beside a buy is what the soft guard flags.
        explain = f"A small {side} of {quantity} {symbol} against the desk's book."
        if plan.degraded(int(task.get("minute", 0))):
            quantity = f"{quantity} shares"
            explain += " (hedge-model 2.0)"
        return {
            "proposal": order(symbol, side, quantity, _limit(price, side)),
            "confidence": 0.8,
            "good_for_minutes": 2,
            "explain": explain,
        }

    return hedge


def playbooks(plan: Plan) -> dict[str, Playbook]:
    """Every playbook of the desk, by task name."""
    return {
        "trade": trade_playbook(plan),
        "strategy": strategy,
        "risk": risk,
        "hedge": hedge_playbook(plan),
    }
