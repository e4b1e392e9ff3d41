"""Amounts in minor units, as reasons quote them, are shown with their currency.

``readable`` lives in kernel.audit.units (the console, ``dirk show`` and ``dirk mcp``
share it); the console's old home still names it.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kernel.audit import units
from kernel.audit.units import money, readable
from kernel.console import _money
from tests.support.hostile import hostile_text

CURRENCIES = st.one_of(
    st.sampled_from(["USD", "EUR", "GBP", "JPY", "CHF", "none", "NONE", ""]),
    hostile_text(max_size=5),
)
PHRASES = st.sampled_from(
    [
        "amount ",
        " is above ",
        "the limit of ",
        " cents",
        "reserved ",
        " of cash:desk",
        "within ",
        " s",
        " ms ago",
        "for ",
        "per ",
    ]
)


def test_the_reasons_the_packs_write_read_in_dollars() -> None:
    assert readable("trading.place_order: amount 2992640 is above 2500000", "USD") == (
        "trading.place_order: amount $29,926.40 is above $25,000.00"
    )
    assert readable("notional 20250000 cents is above the limit of 5000000", "USD") == (
        "notional $202,500.00 is above the limit of $50,000.00"
    )
    assert (
        readable("total 450000 cents is above 300000", "EUR")
        == "total €4,500.00 is above €3,000.00"
    )
    assert readable("amount 5 is above 3", "none") == "amount 5 is above 3"
    assert money(-1999, "CHF") == "-19.99 CHF"
    assert money(1500, "JPY") == "¥1,500"
    assert (_money.readable, _money.money) == (units.readable, units.money)


def test_the_durations_reasons_quote_read_in_the_largest_sensible_unit() -> None:
    assert readable("validity window ended 2964427 ms ago", "none") == (
        "validity window ended 49 min 24 s ago"
    )
    assert readable("no human decision within 7200 s", "USD") == "no human decision within 2 h"
    assert readable("agent a has not proposed for 600 s", "USD") == (
        "agent a has not proposed for 10 min"
    )
    assert readable("3 escalations per 86400 s", "USD") == "3 escalations per 1 d"
    # Already in the largest sensible unit: as recorded.
    assert readable("within 30 s; ended 500 ms ago", "USD") == "within 30 s; ended 500 ms ago"


@given(st.integers(min_value=-(10**15), max_value=10**15), st.integers(0, 10**15))
def test_any_quoted_amount_reads_in_major_units(amount: int, limit: int) -> None:
    text = f"x.y: amount {amount} is above {limit}"
    assert (
        readable(text, "EUR")
        == f"x.y: amount {money(amount, 'EUR')} is above {money(limit, 'EUR')}"
    )


@given(st.lists(st.one_of(hostile_text(max_size=12), PHRASES, st.integers().map(str))), CURRENCIES)
def test_readable_never_raises(parts: list[str], currency: str) -> None:
    assert isinstance(readable("".join(parts), currency), str)


@given(st.lists(st.one_of(hostile_text(), PHRASES)), CURRENCIES)
def test_a_text_that_quotes_no_amount_comes_back_as_it_is(parts: list[str], currency: str) -> None:
    text = "".join(parts)
    if not any(c.isdigit() for c in text):
        assert readable(text, currency) == text
