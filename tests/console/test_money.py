"""Amounts in minor units, as reasons quote them, are shown with their currency."""

from __future__ import annotations

from hypothesis import given

from kernel.console._money import money, readable
from tests.support.hostile import hostile_text


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


@given(hostile_text())
def test_any_other_text_passes_as_it_is(text: str) -> None:
    if " is above " not in text:
        assert readable(text, "USD") == text
