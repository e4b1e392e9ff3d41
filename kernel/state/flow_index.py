"""The flows of a Projections and their index: open flows in the state, finished ones beside it.

A finished flow (CLOSED, ABORTED, COMPENSATED) leaves the canonical state the moment it ends:
its status is counted and its final state added to a rolling hash (``finished_hash``); the
flow itself stays readable in ``flows`` as an index, the most recent ``keep_finished`` of them
(:meth:`FlowIndex.recall` puts one read back from the journal there). What is derived from
the flows (``moving``, ``waiting``, ``unsettled``) follows each flow as it is set.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import msgspec

from kernel.core.events import DecisionRefused, DuplicateSuppressed, FlowFlagged, SubmissionRefused
from kernel.core.flow import TERMINAL, FlowState, FlowStatus
from kernel.state.approvals import Approval

MOVING = frozenset(
    {
        FlowStatus.CREATED,
        FlowStatus.ACTIVE,
        FlowStatus.VALIDATING,
        FlowStatus.ACCEPTED,
        FlowStatus.EXECUTING,
        FlowStatus.DIRTY,
    }
)
"""Statuses in which a flow moves on without a human."""

UNSETTLED = frozenset({FlowStatus.DIRTY, FlowStatus.ESCALATED})
# Flow events allowed in any status that never change it: the only ones a flow gets
# after it ended. On a finished flow they touch the index, never the canonical state.
NOTES = frozenset({DecisionRefused, DuplicateSuppressed, SubmissionRefused, FlowFlagged})
_MODULUS = 1 << 256
# Sorted keys: a live payload and the same payload decoded from the journal encode alike.
_flow_encoder = msgspec.msgpack.Encoder(order="sorted")


def flow_hash(state: FlowState) -> int:
    """Return what a finished flow adds to the rolling hash of finished flows.

    The rolling hash is a sum of these SHA-256 values modulo 2**256: the order in which
    flows of one batch end does not matter (the live kernel and a fold may see them in
    different orders), and each finished flow changes it.
    """
    return int.from_bytes(hashlib.sha256(_flow_encoder.encode(state)).digest())


class FlowIndex:
    """The flows part of :class:`kernel.state.projections.Projections`: it sets them."""

    keep_finished: int | None
    flows: dict[str, FlowState]
    ended: dict[str, None]
    finished: dict[str, int]
    _finished_sum: int | None
    _finished_hex: str | None
    moving: set[str]
    waiting: set[str]
    unsettled: dict[str, set[str]]
    approvals: dict[str, Approval]

    def _set_flow(self, state: FlowState) -> None:
        dfid = state.dfid
        status = state.status
        self.flows[dfid] = state
        if status in TERMINAL and dfid not in self.ended:
            self._finish(state)
        if status in MOVING:
            self.moving.add(dfid)
        else:
            self.moving.discard(dfid)
        if status is FlowStatus.ESCALATED:
            self.waiting.add(dfid)
        elif self.waiting:
            self.waiting.discard(dfid)
        if state.done:
            if status in UNSETTLED:
                self.unsettled.setdefault(state.agent_id, set()).add(dfid)
            elif state.agent_id in self.unsettled:
                self.unsettled[state.agent_id].discard(dfid)

    def _finish(self, state: FlowState) -> None:
        """Move a flow that just ended out of the canonical state, into the index."""
        self.finished[state.status] = self.finished.get(state.status, 0) + 1
        total = self._finished_sum
        if total is None:
            total = int(self._finished_hex, 16) if self._finished_hex else 0
        self._finished_sum = (total + flow_hash(state)) % _MODULUS
        self._finished_hex = None
        self._index(state.dfid)

    @property
    def finished_hash(self) -> str:
        """The rolling hash of every finished flow's final state (canonical; see
        :func:`flow_hash`), "" before any flow ended."""
        if self._finished_hex is None:
            self._finished_hex = f"{self._finished_sum:064x}"
        return self._finished_hex

    @finished_hash.setter
    def finished_hash(self, value: str) -> None:
        self._finished_sum, self._finished_hex = None, value

    def _index(self, dfid: str, at_least: int = 0) -> None:
        """Note ``dfid`` as a finished flow in ``flows``; forget the oldest past the limit."""
        self.ended[dfid] = None
        keep = self.keep_finished
        if keep is not None and len(self.ended) > max(keep, at_least):
            oldest = next(iter(self.ended))
            del self.ended[oldest]
            self.flows.pop(oldest, None)
            self.approvals.pop(oldest, None)

    def recall(self, state: FlowState, approval: Approval | None = None) -> None:
        """Put a finished flow read back from the journal into the index (not the digest).

        The kernel calls it before answering a request about a flow the index
        forgot (a repeated submission, a late decision), so the actors answer it
        from the record exactly as they did while the flow was kept.
        """
        if not state.terminal or state.dfid in self.flows:
            return
        self.flows[state.dfid] = state
        if approval is not None:
            self.approvals[state.dfid] = approval
        self._index(state.dfid, at_least=1)  # even keep_finished=0 holds it for the request

    def open_flows(self) -> dict[str, FlowState]:
        """Return the flows that have not ended, by DFID."""
        ended = self.ended
        return {dfid: state for dfid, state in self.flows.items() if dfid not in ended}

    def _open_approvals(self) -> dict[str, Approval]:
        ended = self.ended
        return {dfid: a for dfid, a in self.approvals.items() if dfid not in ended}

    def _load_flows(self, flows: dict[str, FlowState]) -> None:
        for state in flows.values():
            self._set_flow(state)  # also rebuilds what is derived from flows

    def unsettled_flows(self, agent_id: str) -> list[str]:
        """Return the agent's flows whose effects have not converged.

        Those are flows DIRTY (a saga unwinding) or escalated after a failed compensation.
        """
        return sorted(self.unsettled.get(agent_id, ()))

    def unsettled_with(self, agent_id: str, staged: Mapping[str, FlowState]) -> list[str]:
        """Return :meth:`unsettled_flows` as it will be once ``staged`` flows are folded."""
        flows = set(self.unsettled.get(agent_id, ()))
        for dfid, state in staged.items():
            if state.agent_id == agent_id and state.done:
                if state.status in UNSETTLED:
                    flows.add(dfid)
                else:
                    flows.discard(dfid)
        return sorted(flows)
