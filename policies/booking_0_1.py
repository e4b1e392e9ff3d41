"""The booking pack 0.1.0, verbatim: it judged the journals written before 0.2.0.

Re-judging picks a pack by the hash its verdicts record (tests/golden/booking.db was
judged by this one). The original docstring follows.

The booking pack: rooms for travel agents, within a budget and with the access guests need.

Money is integer minor units (cents). What it enforces on ``booking.reserve_room``:

- resources: a night of a room type is a unit of ``rooms:<hotel>`` (a
  ``capacity.rooms:<hotel>`` fact sets a hotel's inventory), and the cost holds
  the travel budget ``budget:travel`` while the flow is open;
- invariants: 1 to 30 nights, 1 to 4 guests, a known room type;
- rules: the total within the agent's ``max_booking`` (cents); when the traveller
  needs step-free access (``step_free`` in the request, or
  ``traveller.<id>.step_free`` in the state), the room must be accessible
  (CONSTRAINT_VIOLATION);
- escalation: a total above 2,000.00, or a confidence below 0.7, goes to a human.
"""

from __future__ import annotations

from typing import ClassVar

from kernel import ReasonCode
from kernel.policy import (
    ALLOW,
    Consume,
    LimitSpec,
    OneOf,
    PolicyKind,
    PolicyPack,
    Range,
    RuleVerdict,
    Threshold,
    View,
    deny,
    rule,
)

ROOM_TYPES = frozenset({"single", "double", "suite", "accessible"})


class ReserveRoom(PolicyKind, tag="booking.reserve_room"):
    """Reserve ``nights`` of a room of ``room_type`` at ``hotel`` for ``traveller``."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "hotel"

    traveller: str
    hotel: str
    room_type: str
    nights: int
    nightly_rate_cents: int
    guests: int = 1
    step_free: bool = False
    accessible: bool = False


class CancelBooking(PolicyKind, tag="booking.cancel"):
    """Cancel a confirmed booking by its reference."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "hotel"

    booking_ref: str
    reason: str = ""


def total_cents(room: ReserveRoom) -> int:
    """What the stay costs, in cents."""
    return room.nights * room.nightly_rate_cents


@rule(ReserveRoom, fields=("nights", "nightly_rate_cents"))
def within_budget(view: View) -> RuleVerdict:
    """A booking's total stays within the agent's ``max_booking``."""
    total = total_cents(view.params)
    limit = int(view.limits["max_booking"])
    if total > limit:
        return deny(
            f"total {total} cents is above {limit}", field="nightly_rate_cents", limit=limit
        )
    return ALLOW


@rule(ReserveRoom, fields=("traveller", "step_free", "accessible", "room_type"))
def accessibility(view: View) -> RuleVerdict:
    """A traveller who needs step-free access gets an accessible room, or no booking."""
    room = view.params
    needs = room.step_free or bool(view.state.get(f"traveller.{room.traveller}.step_free"))
    if needs and not (room.accessible or room.room_type == "accessible"):
        return deny(
            f"{room.traveller} needs step-free access; a {room.room_type} room is not accessible",
            code=ReasonCode.CONSTRAINT_VIOLATION,
            field="room_type",
            limit="accessible",
        )
    return ALLOW


BOOKING_0_1 = PolicyPack(
    name="booking",
    version="0.1.0",
    kinds=(ReserveRoom, CancelBooking),
    escalate_below_confidence=0.7,
    invariants=(
        Range(ReserveRoom, "nights", min=1, max=30),
        Range(ReserveRoom, "guests", min=1, max=4),
        Range(ReserveRoom, "nightly_rate_cents", min=0),
        OneOf(ReserveRoom, "room_type", ROOM_TYPES),
    ),
    rules=(within_budget, accessibility),
    consumes=(
        Consume(ReserveRoom, "rooms:{hotel}", "nights"),
        Consume(ReserveRoom, "budget:travel", total_cents),
    ),
    capacities={"rooms:*": 100, "budget:travel": 5_000_000},
    thresholds=(Threshold(ReserveRoom, amount=total_cents, above=200_000),),
    limits={"max_booking": LimitSpec(default=300_000, floor=0, ceiling=1_000_000)},
)
"""The booking pack as it was at 0.1.0."""
