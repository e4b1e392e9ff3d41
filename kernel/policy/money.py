"""Money: what a proposal costs, the ceilings a pack puts on spending, and how money reads.

Money is a whole number of minor units (cents) of an ISO 4217 currency, everywhere:
in parameters, reservations, events and limits. Never a float. What people read is
formatted: :func:`format_money` turns ``2500000, "USD"`` into ``"25,000.00 USD"``, and
:func:`parse_money` reads ``"25,000.00 USD"`` (or ``"25000 USD"``) back, exactly.

A pack declares what a kind costs (:class:`Cost`) and the ceilings spending must stay
under (:class:`Budget`): per decision, per flow tree (a conversation: a root flow and
its children), and per agent, per session or for the whole desk, each optionally a
rolling window on the recorded clock. The DIM reserves a proposal's cost with the same
reservation machinery as resources (pools named ``money:<CUR>:<budget>:<scope>``),
so concurrent flows can never commit more than a ceiling; the reservation is spent
when the flow closes and released when it aborts or is compensated
(kernel.state.budgets). A price table (:class:`ModelPrice`, ``KernelConfig.prices``)
turns the tokens an agent's reasoning reports into money too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

import msgspec

CURRENCY = re.compile(r"^[A-Z]{3}$")
"""An ISO 4217 alphabetic code."""

_EXPONENTS = {
    # ISO 4217 minor units where they are not 2 (the few that matter to people paying).
    **dict.fromkeys(("BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG"), 0),
    **dict.fromkeys(("RWF", "UGX", "UYI", "VND", "VUV", "XAF", "XOF", "XPF"), 0),
    **dict.fromkeys(("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"), 3),
}

Scope = Literal["decision", "tree", "agent", "session", "desk"]
SCOPES: tuple[Scope, ...] = ("decision", "tree", "agent", "session", "desk")
POOL_PREFIX = "money:"
"""Pools of money budgets are named ``money:<CUR>:<budget>:<scope>[:<key>]``."""

Amount = str | Callable[[Any], int | Decimal | str]
"""A field of the kind, or a pure function of the typed parameters returning minor units."""


def exponent(currency: str) -> int:
    """Return how many decimal places a currency's minor unit has (2 for most)."""
    return _EXPONENTS.get(currency, 2)


def format_money(amount: int, currency: str) -> str:
    """Return ``amount`` minor units of ``currency`` as people read it: ``"25,000.00 USD"``."""
    places = exponent(currency)
    sign = "-" if amount < 0 else ""
    whole, part = divmod(abs(int(amount)), 10**places)
    text = f"{whole:,}" + (f".{part:0{places}d}" if places else "")
    return f"{sign}{text} {currency}".strip()


_MONEY = re.compile(r"^\s*(-?[0-9][0-9,]*)(?:\.([0-9]+))?\s*([A-Z]{3})\s*$")


def parse_money(text: str, currency: str | None = None) -> tuple[int, str]:
    """Read ``"25,000.00 USD"`` (or ``"25000 USD"``) as (minor units, currency), exactly.

    Args:
        text: an amount and its currency code; commas group thousands.
        currency: the currency expected (refused if another is given).

    Raises:
        ValueError: not an amount with a currency code, more decimals than the currency
            has, or another currency than ``currency``.
    """
    found = _MONEY.match(text)
    if found is None:
        raise ValueError(f"{text[:40]!r} is not an amount and a currency, e.g. '25,000.00 USD'")
    whole, part, code = found.group(1), found.group(2) or "", found.group(3)
    if currency is not None and code != currency:
        raise ValueError(f"{text[:40]!r} is in {code}, not {currency}")
    places = exponent(code)
    digits = whole.replace(",", "")
    if len(part) > places or not digits.lstrip("-"):
        raise ValueError(f"{text[:40]!r}: {code} has {places} decimal place(s)")
    minor = int(digits.lstrip("-") or "0") * 10**places + int(part.ljust(places, "0") or "0")
    return (-minor if digits.startswith("-") else minor), code


@dataclass(frozen=True)
class Cost:
    """What a proposal of ``kind`` costs: ``amount`` minor units of ``currency``.

    Budgets of that currency count it, and a standing grant's money cap does too.
    """

    kind: Any
    amount: Amount
    currency: str


@dataclass(frozen=True)
class Budget:
    """A ceiling on spending, checked (and reserved) before a proposal is accepted.

    Args:
        name: the budget's name (an id: it names its pools).
        ceiling: the most that may be spent, in minor units of ``currency``.
        currency: ISO 4217; the costs of kinds in another currency do not count.
        per: ``decision`` (one proposal), ``tree`` (a flow and its children: a
            conversation), ``agent``, ``session`` (an agent's current handshake) or
            ``desk`` (everything the kernel does).
        window_s: a rolling window on the recorded clock (e.g. 86400 for a day): only
            spending within it counts. None: spending counts for the scope's life.
        over: ``refuse`` (BUDGET_EXHAUSTED) or ``escalate`` (a human may approve the
            overspend, which is then held like any other reservation).
        kinds: the kinds it covers (empty: every kind with a Cost in ``currency``).
        reasoning: the price of reasoning tokens counts against it too (``ReasoningCharged``).
    """

    name: str
    ceiling: int
    currency: str
    per: Scope = "desk"
    window_s: int | None = None
    over: Literal["refuse", "escalate"] = "refuse"
    kinds: tuple[Any, ...] = ()
    reasoning: bool = False

    def pool(self, key: str) -> str:
        """Return the name of this budget's pool for scope ``key`` (empty for the desk).

        ``money:<CUR>:<name>[@<window_s>]:<per>[:<key>]``: the name says the currency and the
        window, so what is spent can be folded (and shown) without the pack.
        """
        name = f"{self.name}@{self.window_s}" if self.window_s else self.name
        scope = self.per if not key else f"{self.per}:{key}"
        return f"{POOL_PREFIX}{self.currency}:{name}:{scope}"


def pool_currency(pool: str) -> str | None:
    """Return the currency of a money pool's name, or None for another pool."""
    if not pool.startswith(POOL_PREFIX):
        return None
    code = pool[len(POOL_PREFIX) : len(POOL_PREFIX) + 3]
    return code if CURRENCY.match(code) else None


def shown(pool: str, amount: int) -> str:
    """Return a held amount of ``pool`` as people read it (money formatted, units as is)."""
    currency = pool_currency(pool)
    return format_money(amount, currency) if currency else str(amount)


class ModelPrice(msgspec.Struct, frozen=True, kw_only=True):
    """What a million tokens of one model cost, in minor units of ``currency``.

    ``KernelConfig.prices`` maps model names to these; an agent reports its tokens by
    model (``ctx.report_usage(tokens=..., model=...)``) and the DIM records their price
    (``ReasoningCharged``), rounded up to a whole minor unit.
    """

    currency: str
    per_million: int

    def cost(self, tokens: int) -> int:
        """Return what ``tokens`` cost, rounded up to a whole minor unit."""
        return -(-tokens * self.per_million // 1_000_000)


__all__ = [
    "CURRENCY",
    "POOL_PREFIX",
    "SCOPES",
    "Budget",
    "Cost",
    "ModelPrice",
    "exponent",
    "format_money",
    "parse_money",
    "pool_currency",
    "shown",
]
