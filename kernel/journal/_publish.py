"""What a journal tells of each commit, once it is durable: its listeners and subscriptions.

Listeners run synchronously in the writer task, before any appender wakes; subscriptions are
offered the batch and fall back to reading when full (kernel.journal._subscription). The
journal fails if a listener raises (the projections it feeds are no longer reliable).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kernel.core.events import Event
from kernel.journal._subscription import Followed, Subscription

Listener = Callable[[Sequence[Event]], None]


class Publisher:
    """A journal's listeners and live subscriptions, told of each committed batch in order."""

    def __init__(self) -> None:
        self.listeners: list[Listener] = []
        self.subscriptions: set[Subscription] = set()

    def subscribe(
        self, journal: Followed, from_seq: int, buffer: int, *, closed: bool
    ) -> Subscription:
        """Return a subscription to ``journal`` from ``from_seq`` (ended at once if closed)."""
        subscription = Subscription(journal, from_seq, buffer, self.subscriptions.discard)
        if closed:
            subscription.end()
        else:
            self.subscriptions.add(subscription)
        return subscription

    def publish(self, published: list[Event]) -> Exception | None:
        """Tell every listener, then offer every subscription; return what a listener raised."""
        failure = None
        try:
            for listener in self.listeners:
                listener(published)
        except Exception as exc:
            failure = exc
        for subscription in tuple(self.subscriptions):
            subscription.offer(published)
        return failure

    def end(self) -> None:
        """End every subscription: the journal closed."""
        for subscription in self.subscriptions:
            subscription.end()
        self.subscriptions.clear()
