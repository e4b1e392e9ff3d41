"""The roadmap as a domain: coding agents' tasks, claims, patches and checks, folded from events.

It plugs in as every domain does (kernel.state.domain): its fold reads the
ExecutionSucceeded of accepted ``esaa.*`` proposals (kernel.state.roadmap.effects),
its DIM layer judges them against the contract and the task graph
(kernel.state.roadmap.gate), it applies a check run in the form the contract gives
it (the command), and it provides the executor of the kinds whose effect is the
record itself (claims, completions, issue reports). Patches, check runs and the
opening go to the adapter of the repository under work (``git``:
``policies.esaa.GitWorkTree``), which is yours to give the kernel.

It folds no event type of its own: every fact it holds is the recorded outcome of a
proposal the DIM accepted, so replay rebuilds it from the journal alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from kernel.adapters.contract import Adapter, AdapterError, Receipt
from kernel.core.events import (
    Applied,
    Event,
    ExecutionIntent,
    ExecutionSucceeded,
    Feedback,
    Payload,
    ProposalRecord,
)
from kernel.core.flow import FlowState
from kernel.policy.rules import View
from kernel.state.domain import OMIT, Domain, ExecutorFactory, ExecutorPorts, Fold, Saved, State
from kernel.state.roadmap import effects, gate
from kernel.state.roadmap.model import (
    CLAIM,
    COMPLETE,
    KINDS,
    REPORT,
    ROADMAP_ADAPTER,
    RoadmapState,
)

RECORDED = frozenset({CLAIM, COMPLETE, REPORT})
"""The kinds the roadmap's own executor carries out: their effect is their record."""


class Roadmap(Domain):
    """The roadmap (saved as ``roadmap``), judged by the roadmap layer of the DIM."""

    name = "roadmap"

    def __init__(self, projections: State) -> None:
        self._projections = projections
        self.state = RoadmapState()

    def folds(self) -> Mapping[type[Payload], Fold]:
        return {ExecutionSucceeded: self._succeeded}

    def saved(self) -> Sequence[Saved]:
        def load(state: RoadmapState) -> None:
            self.state = state

        return (
            Saved(
                name="roadmap",
                type=RoadmapState,
                get=lambda: self.state,
                load=load,
                copy=RoadmapState.copy,
                canonical=_canonical,
                default=msgspec.field(default_factory=RoadmapState),
            ),
        )

    def check(self, proposal: ProposalRecord, view: View, flow: FlowState) -> Feedback | None:
        return gate.check(self.state, proposal.kind, proposal.params, view.agent_id)

    def judges(self, kind: str) -> bool:
        # Its gate judges and transforms only its own kinds (kernel.state.roadmap.gate).
        return kind in KINDS

    def transform(self, proposal: ProposalRecord, flow: FlowState) -> Applied | None:
        return gate.transform(self.state, proposal.kind, proposal.params)

    def executors(self) -> Mapping[str, ExecutorFactory | str]:
        return {ROADMAP_ADAPTER: executor}

    def _succeeded(self, event: Event) -> None:
        """Fold what an accepted ``esaa.*`` proposal did, now that it is recorded."""
        flow = self._projections.current_flow(event.dfid or "")
        proposal = flow.proposal if flow is not None else None
        if flow is None or proposal is None or proposal.kind not in KINDS:
            return
        receipt: ExecutionSucceeded = event.payload  # type: ignore[assignment]
        done = effects.Done(
            params=proposal.params, receipt=receipt, seq=event.seq, agent=flow.agent_id
        )
        effects.apply(self.state, proposal.kind, done)


def _canonical(state: RoadmapState) -> Any:
    # Journals without a roadmap hashed the state without it.
    return msgspec.to_builtins(state) if state.open else OMIT


class RoadmapExecutor:
    """Carries out claims, completions and issue reports: the record is the whole effect.

    It honours keys trivially (nothing outside the journal changes, and a repeated
    call answers the same receipt); the roadmap folds the effect from the recorded
    ExecutionSucceeded, exactly once.
    """

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        """Return the receipt of a bookkeeping intent; refuse any other kind."""
        if intent.kind not in RECORDED:
            raise AdapterError(
                f"the roadmap executor carries out {', '.join(sorted(RECORDED))}, not {intent.kind}"
            )
        return Receipt(external_id=f"roadmap:{intent.key}")


def executor(ports: ExecutorPorts) -> Adapter:
    """Build the roadmap's executor for one kernel."""
    return RoadmapExecutor()
