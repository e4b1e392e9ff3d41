"""Governed beliefs as a domain: the belief graph, the beliefs layer of the DIM, the executors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from kernel.core.events import (
    BELIEF_PAYLOADS,
    Applied,
    Event,
    ExecutionStarted,
    ExecutionSucceeded,
    Feedback,
    Payload,
    ProposalRecord,
)
from kernel.core.flow import FlowState
from kernel.core.reasons import ReasonCode
from kernel.policy.rules import View
from kernel.state.beliefs import BELIEFS_ADAPTER, TEST_ADAPTER, gate
from kernel.state.beliefs.effects import PREFIX, PROPOSE_TEST
from kernel.state.beliefs.graph import BeliefGraph
from kernel.state.domain import OMIT, Domain, ExecutorFactory, Fold, Saved, State
from kernel.state.principals import memory_tenant, tenant_of

_EVENTS: frozenset[type[Payload]] = frozenset(BELIEF_PAYLOADS)


class Beliefs(Domain):
    """The belief graph (saved as ``beliefs``), judged and transformed by the beliefs layer.

    Its executors: the beliefs executor (its events are the effect, recorded by the
    engine) and a ``belief_test`` adapter that refuses every test, for a kernel given
    none (a test is an action in the world: yours to provide).
    """

    name = "beliefs"

    def __init__(self, projections: State) -> None:
        self._projections = projections
        self.graph = BeliefGraph()

    def folds(self) -> Mapping[type[Payload], Fold]:
        folds: dict[type[Payload], Fold] = dict.fromkeys(_EVENTS, self._belief)
        folds[ExecutionStarted] = self._test_started
        folds[ExecutionSucceeded] = self._test_done
        return folds

    def saved(self) -> Sequence[Saved]:
        def load(graph: BeliefGraph) -> None:
            self.graph = graph

        return (
            Saved(
                name="beliefs",
                type=BeliefGraph,
                get=lambda: self.graph,
                load=load,
                copy=BeliefGraph.copy,
                canonical=_canonical,
                default=msgspec.field(default_factory=BeliefGraph),
            ),
        )

    def check(self, proposal: ProposalRecord, view: View, flow: FlowState) -> Feedback | None:
        if proposal.kind.startswith(PREFIX):
            refused = self._task_of_another(proposal, flow)
            if refused is not None:
                return refused
        # A flow reads the graph its tenant sees: another tenant's ids are unrecorded to it.
        graph = self.graph.seen_by(view.tenant)
        # Scored at the graph's latest recorded time, not the DIM's clock: "now" is recorded.
        return gate.check(graph, proposal.kind, proposal.params, flow.root_dfid, graph.latest_ns)

    def judges(self, kind: str) -> bool:
        # Its gate judges and transforms only its own kinds (kernel.state.beliefs.gate).
        return kind.startswith(PREFIX)

    def transform(self, proposal: ProposalRecord, flow: FlowState) -> Applied | None:
        # A duplicate is one of the tenant's own (or shared): never another tenant's.
        graph = self.graph.seen_by(tenant_of(self._projections, flow.dfid))
        return gate.transform(graph, proposal.kind, proposal.params)

    def _task_of_another(self, proposal: ProposalRecord, flow: FlowState) -> Feedback | None:
        """Refuse a write into a task another tenant owns (CROSS_TENANT).

        A task belongs to the tenant whose flows first recorded in it, or, before any did,
        to the tenant its open root flow acts for; shared memory's writers own none.
        """
        named = proposal.params.get("task")
        task = named if isinstance(named, str) and named else flow.root_dfid
        writer = memory_tenant(self._projections, flow.dfid)
        owner = self.graph.tenants.get(task) or memory_tenant(self._projections, task)
        if not owner or owner == writer:
            return None
        return Feedback(
            reason_code=ReasonCode.CROSS_TENANT,
            detail=f"task {task!r} is another tenant's",
            layer=gate.LAYER,
            field="params.task",
        )

    def executors(self) -> Mapping[str, ExecutorFactory | str]:
        return {
            BELIEFS_ADAPTER: "kernel.beliefs._pack:executor",
            TEST_ADAPTER: "kernel.beliefs._pack:no_tests",
        }

    def records(self) -> Mapping[str, frozenset[type[Payload]]]:
        return {BELIEFS_ADAPTER: _EVENTS}

    def _belief(self, event: Event) -> None:
        task = getattr(event.payload, "task", "")
        tenant = memory_tenant(self._projections, event.dfid) if event.dfid else ""
        if task and tenant:
            self.graph.tenants.setdefault(task, tenant)
        self.graph.apply(event)

    def _test_started(self, event: Event) -> None:
        """Note a propose_test intent started: the test exists, its adapter runs it."""
        intent = event.payload.intent  # type: ignore[union-attr]  # ExecutionStarted
        if intent.kind == PROPOSE_TEST and intent.adapter not in self._projections.recording:
            self.graph.test_started(intent.key, intent.params, intent.adapter, event.seq)

    def _test_done(self, event: Event) -> None:
        succeeded: ExecutionSucceeded = event.payload  # type: ignore[assignment]
        if succeeded.key in self.graph.test_keys:
            self.graph.test_done(succeeded.key, succeeded.detail)


def _canonical(graph: BeliefGraph) -> Any:
    # Journals that never recorded a belief hashed the state without the graph, and
    # those whose beliefs were no tenant's without its tenants.
    if graph.empty():
        return OMIT
    shown = msgspec.to_builtins(graph)
    if not graph.tenants:
        del shown["tenants"]
    return shown
