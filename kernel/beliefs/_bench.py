"""A kernel-free workbench: the governance pack's judgement and effects on an in-memory graph.

The same functions the kernel runs (the schema of the pack's kinds, the beliefs
layer, the transform, the effects, the fold), without a journal, an agent or a
clock: for studies, baselines and ablations that replay thousands of tool calls.
What it decides is what the kernel's DIM and beliefs executor decide for the same
graph, call and time; only the other layers (authority, time windows, memory
constraints) are left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from kernel.beliefs._pack import GOVERNANCE_PACK
from kernel.core.events import Applied, Event, Feedback, Payload
from kernel.core.reasons import ReasonCode
from kernel.policy.kinds import kind_name
from kernel.state.beliefs import TEST_ADAPTER
from kernel.state.beliefs.effects import PROPOSE_TEST, effects
from kernel.state.beliefs.gate import check, transform
from kernel.state.beliefs.graph import BeliefGraph

_KINDS = {kind_name(k): k for k in GOVERNANCE_PACK.kinds}


class Call(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call's outcome: ``accepted``, ``transformed`` or ``rejected``.

    ``feedback`` says why a call was rejected; ``applied`` the form a transformed
    call was applied in; ``events`` what it recorded (with the seqs they got).
    """

    outcome: str
    feedback: Feedback | None = None
    applied: Applied | None = None
    events: list[Event] = []


class Workbench:
    """A belief graph and the pack's rules, driven one tool call at a time.

    Args:
        graph: the graph to start from (default: empty).
    """

    def __init__(self, graph: BeliefGraph | None = None) -> None:
        self.graph = graph if graph is not None else BeliefGraph()
        self.seq = 0
        self._keys = 0

    def propose(self, kind: str, params: Mapping[str, Any], *, task: str, now_ns: int) -> Call:
        """Judge ``kind`` with ``params`` in ``task`` at the recorded time ``now_ns``; apply it.

        Never raises on a bad call: an unknown kind or ill-typed parameters are
        rejected with SCHEMA_INVALID, as the kernel's schema layer does.
        """
        cls = _KINDS.get(kind)
        if cls is None:
            return _rejected(ReasonCode.SCHEMA_INVALID, f"unknown policy kind {kind!r}", "kind")
        try:
            policy = msgspec.convert({"kind": kind, **params}, cls)
        except (msgspec.ValidationError, TypeError) as exc:
            return _rejected(ReasonCode.SCHEMA_INVALID, str(exc), "params")
        converted: dict[str, Any] = msgspec.to_builtins(policy)
        converted.pop("kind", None)
        converted["task"] = task
        refused = check(self.graph, kind, converted, task, now_ns)
        if refused is not None:
            return Call(outcome="rejected", feedback=refused)
        applied = transform(self.graph, kind, converted)
        run_kind, run_params = (
            (applied.kind, applied.params) if applied is not None else (kind, converted)
        )
        self._keys += 1
        key = f"bench-{self._keys}"
        if kind == PROPOSE_TEST:
            # Executed by a test adapter, not by the beliefs executor: noted as started.
            self.seq += 1
            self.graph.test_started(key, converted, TEST_ADAPTER, self.seq)
            return Call(outcome="accepted")
        recorded = [
            self._record(payload, now_ns)
            for payload in effects(
                self.graph, run_kind, run_params, task=task, key=key, now_ns=now_ns
            )
        ]
        outcome = "transformed" if applied is not None else "accepted"
        return Call(outcome=outcome, applied=applied, events=recorded)

    def record_test(self, test: str, outcome: str) -> None:
        """Record a proposed test's result, as the kernel does from its adapter's receipt."""
        record = self.graph.tests.get(test)
        if record is not None:
            self.graph.test_done(record.key, {"outcome": outcome})

    def _record(self, payload: Payload, now_ns: int) -> Event:
        self.seq += 1
        event = Event(seq=self.seq, ts=now_ns, payload=payload)  # type: ignore[arg-type]
        self.graph.apply(event)
        return event


def _rejected(code: ReasonCode, detail: str, field: str) -> Call:
    return Call(
        outcome="rejected",
        feedback=Feedback(reason_code=code, detail=detail, layer="schema", field=field),
    )
