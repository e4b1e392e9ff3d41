"""Reservations: what each open flow holds of each pool (semantic locks), as a domain.

The DIM reserves what an accepted or escalated proposal consumes (ResourceReserved, in
the same append as its verdict) and its resource layer judges against what is held
(kernel.dim.verdict reads :attr:`Reservations.held`); whoever records the end of a flow
releases what it held in that same append (ResourceReleased, ``Outbox.emit``). Its
check lives in the gate's state layer, which needs the capacities facts set; it has
no executor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kernel.core.events import Event, Payload, ResourceReleased, ResourceReserved
from kernel.state.domain import Domain, Fold, Saved, State


class Reservations(Domain):
    """The reservations domain: ``holds`` per open flow and the ``held`` total per pool."""

    name = "reservations"

    def __init__(self, projections: State) -> None:
        self.holds: dict[str, dict[str, int]] = {}
        """What each open flow holds, by pool (saved as ``reservations``)."""
        self.held: dict[str, int] = {}
        """The total held of each pool (derived: not saved)."""

    def folds(self) -> Mapping[type[Payload], Fold]:
        return {ResourceReserved: self._reserve, ResourceReleased: self._reserve}

    def saved(self) -> Sequence[Saved]:
        return (
            Saved(
                name="reservations",
                type=dict[str, dict[str, int]],
                get=lambda: self.holds,
                load=self._load,
                copy=lambda holds: {dfid: dict(pools) for dfid, pools in holds.items()},
                default={},
            ),
        )

    def _load(self, holds: dict[str, dict[str, int]]) -> None:
        self.holds = holds
        self.held = {}
        for pools in holds.values():
            for pool, amount in pools.items():
                self.held[pool] = self.held.get(pool, 0) + amount

    def _reserve(self, event: Event) -> None:
        payload: ResourceReserved | ResourceReleased = event.payload  # type: ignore[assignment]
        dfid = event.dfid or ""
        holds = self.holds.setdefault(dfid, {})
        before = holds.pop(payload.pool, 0)
        after = payload.amount if isinstance(payload, ResourceReserved) else 0
        if after:
            holds[payload.pool] = after
        elif not holds:
            del self.holds[dfid]
        total = self.held.get(payload.pool, 0) - before + after
        if total:
            self.held[payload.pool] = total
        else:
            self.held.pop(payload.pool, None)
