"""Units a person reads: durations in the largest sensible unit, pools' money with its currency."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from kernel.audit.units import duration, judged_by, offset, readable
from kernel.core import events as ev
from kernel.core.events import Event
from kernel.core.reasons import ReasonCode

S = 1_000_000_000
SHAPE = re.compile(
    r"-?(0 s|\d+ ns|\d+ µs|\d+\.\d ms|\d+\.\d\d s|\d+ min \d\d s|\d+ h \d\d min|\d+ d \d+ h)"
)
UNIT = {"ns": 1, "µs": 1_000, "ms": 10**6, "s": S, "min": 60 * S, "h": 3600 * S, "d": 86400 * S}


def test_the_issues_gap_reads_in_minutes() -> None:
    assert offset(2_964_427_293_000) == "+49 min 24 s"
    assert [duration(n) for n in (0, 850_000, 12_345_678, 1_520_000_000)] == [
        "0 s",
        "850 µs",
        "12.3 ms",
        "1.52 s",
    ]
    assert duration(2 * 3600 * S + 5 * 60 * S) == "2 h 05 min"
    assert duration(3 * 86400 * S + 4 * 3600 * S) == "3 d 4 h"


@given(st.integers(min_value=-(10**18), max_value=10**18))
def test_every_duration_is_one_shape_and_says_about_as_much(ns: int) -> None:
    text = duration(ns)
    assert SHAPE.fullmatch(text), text
    # Read back, it is within the smaller unit shown (or 1% below a minute).
    words = text.lstrip("-").split()
    back = sum(float(n) * UNIT[u] for n, u in zip(words[::2], words[1::2], strict=True))
    smallest = UNIT[words[-1]]
    assert abs(back - abs(ns)) <= max(smallest, abs(ns) / 100), text


def test_a_pools_minor_units_are_shown_in_the_currency() -> None:
    line = "reserved 1085364 of cash:desk; released 5 of cash:desk (ABORTED)"
    assert readable(line, "USD") == (
        "reserved 10,853.64 USD of cash:desk; released 0.05 USD of cash:desk (ABORTED)"
    )
    assert readable(line, "none") == line
    money_pool = "holds 29,989.20 USD of money:USD:daily-notional@86400:desk"
    assert readable(money_pool, "USD") == money_pool
    assert readable("reserved 300 of money:EUR:x", "USD") == "reserved 300 of money:EUR:x"


def test_the_pack_that_judged_names_its_version() -> None:
    pack = ev.PackRef(name="trading", version="0.4.0", hash="h1")
    payload = ev.FlowEscalated(reason_code=ReasonCode.APPROVAL_REQUIRED, pack="h1")
    escalated = Event(seq=1, ts=0, payload=payload)
    assert judged_by([escalated], [pack]) == "trading 0.4.0"
    assert judged_by([], [pack]) == ""
