"""The booking pack 0.1.0, exactly as it judged: kept so its journals re-judge.

0.2.0 (:mod:`policies.booking`) declares what a stay costs (for grants' money caps)
and reads its threshold in EUR; 0.1.0 is 0.2.0 without either, and hashes as 0.1.0
always did. Pass :data:`BOOKING_0_1` beside the current pack to re-judge a journal
recorded under it.
"""

from __future__ import annotations

from dataclasses import replace

from policies.booking import BOOKING

BOOKING_0_1 = replace(
    BOOKING,
    version="0.1.0",
    costs=(),
    # 0.1.0 told its threshold in cents, not EUR.
    thresholds=tuple(replace(t, currency="") for t in BOOKING.thresholds),
)
"""Booking 0.1.0."""
