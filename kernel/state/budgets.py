"""Money spent: what each money budget's pools have consumed, as a domain.

A money budget (kernel.policy.money) holds a proposal's cost in a pool named
``money:<CUR>:<budget>[@<window_s>]:<scope>[:<key>]`` with the same reservation
machinery as resources (kernel.state.reservations): ResourceReserved when the DIM
accepts or escalates it, released when the flow ends. What this domain adds is
*consumption*: when a flow CLOSES, what it held of each money pool is spent (recorded
here, at the FlowClosed's time); a flow that aborts or is compensated spends nothing,
and its release gives the amount back. The price of reasoning (ReasoningCharged) is
spent at once in the pools it names.

A pool with a window (``@86400``: a rolling day) keeps each spend with its time and
forgets those older than the window as events arrive; :meth:`Budgets.spent` sums what
lies within the window at a given time. A pool without one keeps a total; a flow
tree's total goes when its root flow ends, a session's when its agent registers anew
(handshakes again).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kernel.core.events import (
    AgentRegistered,
    Event,
    FlowAborted,
    FlowClosed,
    FlowCompensated,
    Payload,
    ReasoningCharged,
)
from kernel.policy.money import POOL_PREFIX
from kernel.state.domain import OMIT, Domain, Fold, Saved, State
from kernel.state.reservations import Reservations

NS = 1_000_000_000


def window_of(pool: str) -> int | None:
    """Return a money pool's window in seconds (``@<s>`` after its budget), or None."""
    parts = pool.split(":", 3)
    if len(parts) < 4 or "@" not in parts[2]:
        return None
    try:
        return int(parts[2].rsplit("@", 1)[1])
    except ValueError:
        return None


class Budgets(Domain):
    """Money spent per pool (saved as ``spent``)."""

    name = "budgets"

    def __init__(self, projections: State) -> None:
        self._projections = projections
        # Registered before this domain: what a closing flow held is read there.
        self._reservations = projections.domain(Reservations)
        self.spent_in: dict[str, list[tuple[int, int]]] = {}
        """Per money pool, (ts, amount) of each spend still inside its window, oldest first;
        a pool without a window keeps one entry: (last ts, total)."""

    def folds(self) -> Mapping[type[Payload], Fold]:
        return {
            FlowClosed: self._closed,
            FlowAborted: self._ended,
            FlowCompensated: self._ended,
            ReasoningCharged: self._charged,
            AgentRegistered: self._registered,
        }

    def saved(self) -> Sequence[Saved]:
        return (
            Saved(
                name="spent",
                type=dict[str, list[tuple[int, int]]],
                get=lambda: self.spent_in,
                load=self._load,
                copy=lambda spent: {pool: list(entries) for pool, entries in spent.items()},
                canonical=_unless_empty,
                default={},
            ),
        )

    def _load(self, spent: dict[str, list[tuple[int, int]]]) -> None:
        self.spent_in = {pool: [tuple(e) for e in entries] for pool, entries in spent.items()}  # type: ignore[misc]

    # --- reading ----------------------------------------------------------------

    def spent(self, pool: str, now_ns: int) -> int:
        """Return what ``pool`` has spent within its window as of ``now_ns``."""
        entries = self.spent_in.get(pool)
        if not entries:
            return 0
        window = window_of(pool)
        if window is None:
            return sum(amount for _, amount in entries)
        since = now_ns - window * NS
        return sum(amount for ts, amount in entries if ts > since)

    # --- folding ----------------------------------------------------------------

    def _spend(self, pool: str, ts: int, amount: int) -> None:
        window = window_of(pool)
        entries = self.spent_in.setdefault(pool, [])
        if window is None:
            total = entries[0][1] if entries else 0
            entries[:] = [(ts, total + amount)]
            return
        since = ts - window * NS
        entries[:] = [e for e in entries if e[0] > since]
        entries.append((ts, amount))

    def _closed(self, event: Event) -> None:
        held = self._reservations.holds.get(event.dfid or "")
        if held:
            for pool, amount in sorted(held.items()):
                if pool.startswith(POOL_PREFIX) and amount:
                    self._spend(pool, event.ts, amount)
        self._ended(event)

    def _ended(self, event: Event) -> None:
        if not self.spent_in:
            return  # nothing spent, so no tree's total to forget (a flow of no budget pays nothing)
        dfid = event.dfid or ""
        flow = self._projections.current_flow(dfid)
        if flow is not None and flow.root_dfid == dfid:
            suffix = f":tree:{dfid}"
            for pool in [p for p in self.spent_in if p.endswith(suffix)]:
                del self.spent_in[pool]

    def _charged(self, event: Event) -> None:
        p: ReasoningCharged = event.payload  # type: ignore[assignment]
        for pool in p.pools:
            if p.amount:
                self._spend(pool, event.ts, p.amount)

    def _registered(self, event: Event) -> None:
        # A new handshake is a new session: the old session's totals go.
        p: AgentRegistered = event.payload  # type: ignore[assignment]
        agent = p.manifest.agent_id
        keep = f":session:{session_key(agent, p.session_hash)}"
        mine = f":session:{agent}:"
        for pool in [q for q in self.spent_in if mine in q and not q.endswith(keep)]:
            del self.spent_in[pool]


def session_key(agent_id: str, session_hash: str) -> str:
    """The key of an agent's session in pool names: the agent, then part of the session's hash."""
    return f"{agent_id}:{session_hash[:16]}"


def _unless_empty(spent: dict[str, list[tuple[int, int]]]) -> Any:
    if not spent:
        return OMIT
    return {pool: [list(e) for e in entries] for pool, entries in sorted(spent.items())}
