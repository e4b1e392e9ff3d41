"""A subscription hands each event on once, a row and the event it stands for included.

A live batch may overlap what the subscription last read from the database; what it
already handed on is cut by seq. Rows and their derived events share a seq, so a cut by
position (one event per seq) handed events on twice or skipped them.
"""

from __future__ import annotations

from kernel.core.events import Event, ExecutionSucceeded, TriggerFired, with_derived
from kernel.journal._subscription import Subscription


class Events:
    """A journal as a subscription sees it (:class:`kernel.journal._subscription.Followed`)."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events

    @property
    def head_seq(self) -> int:
        return self.events[-1].seq if self.events else 0

    async def read(
        self, start: int = 1, stop: int | None = None, *, limit: int | None = None
    ) -> list[Event]:
        return [e for e in self.events if e.seq >= start and (stop is None or e.seq < stop)]


def _row(seq: int, closes: bool = False) -> Event:
    payload = ExecutionSucceeded(key="k", closes=True) if closes else TriggerFired(topic="t")
    return Event(seq=seq, ts=seq, payload=payload, dfid=f"f{seq}", hash=f"{seq:064x}")


async def test_a_live_batch_overlapping_the_last_read_is_cut_by_seq() -> None:
    journal = Events(with_derived([_row(1), _row(2, closes=True), _row(3)]))
    subscription = Subscription(journal, 1, 8, lambda _: None)
    try:
        first = await subscription.__anext__()
        assert [e.seq for e in first] == [1, 2, 2, 3]
        # A batch committed while the read ran overlaps it from seq 2 (a row and its
        # FlowClosed): only what follows seq 3 is handed on.
        later = with_derived([_row(4, closes=True)])
        subscription.offer(with_derived([_row(2, closes=True), _row(3)]) + later)
        assert await subscription.__anext__() == later
    finally:
        await subscription.aclose()
