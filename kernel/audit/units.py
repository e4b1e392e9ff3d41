"""Durations, amounts and packs as a person reads them, on every surface that shows a flow.

The journal keeps nanoseconds; a person reads ``49 min 24 s``, not ``+2964427.293 ms``.
:func:`duration` picks the largest sensible unit and keeps one smaller where it still
says something (``2 h 05 min``), and the sub-second ones with the precision they need
(``12.3 ms``, ``1.52 s``): ``dirk show`` and the console's flow page both use it.

Packs keep money in integer minor units (cents) so that no float reaches a hashed or
validated field, and their reasons quote those units: ``amount 2992640 is above
2500000``, ``notional 20250000 cents is above the limit of 5000000``. The record keeps
them so; :func:`readable` shows them as ``amount $29,926.40 is above $25,000.00``, and
the durations reasons quote (``validity window ended 2964427 ms ago``, ``no human
decision within 7200 s``) in the largest sensible unit (``49 min 24 s ago``, ``within
2 h``). The journal does not say which currency a pack counts in: the surface is told
(``--currency``, USD by default, as the shipped packs count; ``none`` leaves amounts as
recorded): the console, ``dirk show`` and ``dirk mcp``. A resource pool's amounts
(``reserved 1085364 of cash:desk``) are shown so too; a ``money:`` pool's the narrative
already shows in its own currency. Only a surface rewords: a recorded detail is never
changed (reverify compares them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal

from kernel.core import events as ev
from kernel.core.events import Event
from kernel.policy.money import format_money

_US = 1_000
_MS = 1_000_000
_S = 1_000_000_000
_MIN = 60 * _S
_H = 60 * _MIN
_D = 24 * _H


def duration(ns: int) -> str:
    """``ns`` nanoseconds in the largest sensible unit: ``850 µs``, ``12.3 ms``, ``49 min 24 s``."""
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    return sign + _positive(ns)


def _positive(ns: int) -> str:
    if ns == 0:
        return "0 s"
    if ns < _MS:
        return f"{ns // _US} µs" if ns >= _US else f"{ns} ns"
    if ns < _S:
        return f"{ns / _MS:.1f} ms"
    if ns < _MIN:
        return f"{ns / _S:.2f} s"
    if ns < _H:
        minutes, rest = divmod(ns // _S, 60)
        return f"{minutes} min {rest:02d} s"
    if ns < _D:
        hours, rest = divmod(ns // _MIN, 60)
        return f"{hours} h {rest:02d} min"
    days, rest = divmod(ns // _H, 24)
    return f"{days} d {rest} h"


def offset(ns: int) -> str:
    """An event's time after its flow's first, as a narrative's column shows it (``+1.52 s``)."""
    return f"+{duration(ns)}"


def judged_by(events: Iterable[Event], packs: Iterable[ev.PackRef]) -> str:
    """The pack (name and version) whose verdict a flow's latest judgement names, or ""."""
    by_hash = {pack.hash: pack for pack in packs}
    found = ""
    for event in events:
        payload = event.payload
        if isinstance(payload, ev.ProposalAccepted | ev.ProposalRejected | ev.FlowEscalated):
            pack = by_hash.get(payload.pack)
            version = getattr(payload, "version", "") or (pack.version if pack else "")
            name = pack.name if pack else ""
            found = f"{name} {version}".strip() if name or version else found
    return found


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

# The durations reasons quote: "within 7200 s", "for 600 s", "per 86400 s", "ended 2964427
# ms ago". Only whole numbers in s or ms after these words, so nothing else is read as one.
_WAITED = re.compile(r"\b(?P<before>within|for|per|after) (?P<n>\d{1,15}) (?P<unit>ms|s)\b")
_AGO = re.compile(r"(?<![\w.])(?P<n>\d{1,15}) (?P<unit>ms|s) ago\b")
_UNIT_NS = {"ms": _MS, "s": _S}


def money(minor: int, currency: str) -> str:
    """``minor`` units of ``currency`` as a person writes them (``$29,926.40``)."""
    digits = DIGITS.get(currency, 2)
    value = Decimal(minor).scaleb(-digits)
    text = f"{abs(value):,.{digits}f}"
    sign = "-" if value < 0 else ""
    symbol = SYMBOLS.get(currency)
    return f"{sign}{symbol}{text}" if symbol else f"{sign}{text} {currency}"


def readable(text: str, currency: str) -> str:
    """``text`` with the amounts its reasons quote in ``currency`` (unless none), durations
    in the largest sensible unit; a text that quotes neither comes back as it is."""
    text = _AGO.sub(_ago, _WAITED.sub(_waited, text))
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


def _spoken(n: str, unit: str) -> str | None:
    """``n`` ``unit`` in the largest sensible unit, or None where the unit recorded is it."""
    ns = int(n) * _UNIT_NS[unit]
    if (unit == "ms" and ns < _S) or (unit == "s" and ns < _MIN):
        return None
    shown = duration(ns)
    # A whole number of minutes, hours or days reads so ("within 2 h"), not "2 h 00 min".
    return re.sub(r" 0+ (?:s|min|h)$", "", shown)


def _waited(found: re.Match[str]) -> str:
    shown = _spoken(found["n"], found["unit"])
    return found[0] if shown is None else f"{found['before']} {shown}"


def _ago(found: re.Match[str]) -> str:
    shown = _spoken(found["n"], found["unit"])
    return found[0] if shown is None else f"{shown} ago"
