"""Amounts as people read them: minor units quoted in reasons, shown with their currency.

Packs keep money in integer minor units (cents) so that no float reaches a hashed or
validated field, and their reasons quote those units: ``amount 2992640 is above
2500000``, ``notional 20250000 cents is above the limit of 5000000``. The record keeps
them so; the console shows them as ``$29,926.40 is above $25,000.00``. The journal
does not say which currency a pack counts in: the console is told (``--currency``,
USD by default, as the shipped packs count; ``none`` leaves the units as recorded), and
so is ``dirk show``. A resource pool's amounts (``reserved 1085364 of cash:desk``) are
shown so too; a ``money:`` pool's the narrative already shows in its own currency.
"""

from __future__ import annotations

import re
from decimal import Decimal

from kernel.policy.money import format_money

SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥"}
DIGITS = {"JPY": 0}
"""Minor-unit digits of the currencies that have other than two."""

_QUOTED = re.compile(
    r"\b(?P<what>amount|notional|total) (?P<amount>-?\d+)(?: cents)?"
    r" is above (?P<limit_word>the limit of )?(?P<limit>-?\d+)(?: cents)?"
)

_POOL = re.compile(
    r"\b(?P<verb>reserved|released) (?P<amount>\d+) of (?P<pool>(?!money:)[A-Za-z][\w.:@-]*)"
)


def money(minor: int, currency: str) -> str:
    """``minor`` units of ``currency`` as a person writes them (``$29,926.40``)."""
    digits = DIGITS.get(currency, 2)
    value = Decimal(minor).scaleb(-digits)
    text = f"{abs(value):,.{digits}f}"
    sign = "-" if value < 0 else ""
    symbol = SYMBOLS.get(currency)
    return f"{sign}{symbol}{text}" if symbol else f"{sign}{text} {currency}"


def readable(text: str, currency: str) -> str:
    """``text`` with the minor units its reasons quote shown in ``currency`` (unless none)."""
    if not currency or currency.lower() == "none":
        return text

    def shown(found: re.Match[str]) -> str:
        amount = money(int(found["amount"]), currency)
        limit = money(int(found["limit"]), currency)
        return f"{found['what']} {amount} is above {found['limit_word'] or ''}{limit}"

    def pooled(found: re.Match[str]) -> str:
        # As the narrative writes a money pool's, on the line beside it: "1,085.00 USD".
        amount = format_money(int(found["amount"]), currency.upper())
        return f"{found['verb']} {amount} of {found['pool']}"

    return _POOL.sub(pooled, _QUOTED.sub(shown, text))
