"""The governance pack's rules on an in-memory graph: consolidation, the caps, bad inputs."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.beliefs import HOUR_NS, KINDS, BeliefGraph, Workbench, scoring
from kernel.core.events import ConsolidationRecorded, Event
from kernel.core.reasons import ReasonCode

T0 = 1_700_000_000 * 10**9


def bench_with_sources(n: int = 2) -> Workbench:
    bench = Workbench()
    for i in range(n):
        call = bench.propose(
            "governance.record_observation",
            {"observation": f"o{i}", "source": f"s{i}"},
            task="t",
            now_ns=T0,
        )
        assert call.outcome == "accepted", call
    return bench


def consolidations(bench: Workbench) -> list[ConsolidationRecorded]:
    return list(bench.graph.consolidations)


def test_consolidation_every_25_observations() -> None:
    bench = bench_with_sources(0)
    for i in range(24):
        bench.propose(
            "governance.record_observation",
            {"observation": f"o{i}", "source": "s"},
            task="t",
            now_ns=T0 + i,
        )
    assert consolidations(bench) == []
    call = bench.propose(
        "governance.record_observation", {"observation": "o24", "source": "s"}, task="t", now_ns=T0
    )
    assert [type(e.payload).__name__ for e in call.events][-1] == "ConsolidationRecorded"
    [done] = consolidations(bench)
    assert (done.trigger, done.observations) == ("cadence", 25)
    assert bench.graph.workspaces["t"].observations == 0  # the count starts again


def test_carry_over_is_capped_at_20_and_the_overflow_archived_with_a_reason() -> None:
    bench = bench_with_sources(0)
    for i in range(23):
        bench.propose(
            "governance.record_observation",
            {"observation": f"o{i}", "source": f"s{i}"},
            task="t",
            now_ns=T0,
        )
        bench.propose(
            "governance.propose_proposition",
            {"proposition": f"p{i:02}", "text": f"claim {i}", "derived_from": [f"o{i}"]},
            task="t",
            now_ns=T0,
        )
    bench.propose("governance.request_consolidation", {}, task="t", now_ns=T0 + HOUR_NS)
    [done] = consolidations(bench)
    assert len(done.carried_over) == scoring.CARRY_OVER_CAP == 20
    assert [(a.proposition, a.reason) for a in done.archived] == [
        ("p20", "CARRY_OVER_CAP"),
        ("p21", "CARRY_OVER_CAP"),
        ("p22", "CARRY_OVER_CAP"),
    ]
    layers = {p.proposition: p.layer for p in bench.graph.propositions.values()}
    assert layers["p22"] == "archived" and layers["p00"] == "workspace"


def test_promotion_rechecks_freshness_at_consolidation_time() -> None:
    bench = bench_with_sources(2)
    bench.propose(
        "governance.propose_proposition",
        {"proposition": "p", "text": "x", "derived_from": ["o0", "o1"], "volatility": "high"},
        task="t",
        now_ns=T0,
    )
    assert bench.graph.propositions["p"].state == "accepted"
    # 30 h later (high volatility, 24 h half-life): freshness 0.42, confidence 0.65...
    later = T0 + 30 * HOUR_NS
    assessed = bench.graph.assess("p", later)
    assert assessed.freshness < 500_000
    bench.propose("governance.request_consolidation", {}, task="t", now_ns=later)
    [done] = consolidations(bench)
    # ...re-assessed then: no longer accepted (confidence below 0.80), not promoted.
    assert done.promoted == [] and done.carried_over == ["p"]
    assert bench.graph.propositions["p"].transitions[-1].cause == "consolidation"


def test_time_alone_never_makes_a_proposition_stronger() -> None:
    bench = bench_with_sources(1)
    bench.propose(
        "governance.propose_proposition",
        {"proposition": "p", "text": "x", "derived_from": ["o0"]},
        task="t",
        now_ns=T0,
    )
    confidences = [bench.graph.assess("p", T0 + h * HOUR_NS).confidence for h in range(0, 400, 7)]
    assert confidences == sorted(confidences, reverse=True)


CODES = {
    ReasonCode.SCHEMA_INVALID,
    ReasonCode.MISSING_PROVENANCE,
    ReasonCode.CONSTRAINT_VIOLATION,
    ReasonCode.DIRECT_CANONICAL_WRITE_FORBIDDEN,
}
names = st.sampled_from(["o0", "o1", "p", "q", "t1", "", "x y", "test:t"])
values = st.one_of(
    names,
    st.integers(-3, 3),
    st.booleans(),
    st.none(),
    st.lists(names, max_size=3),
    st.sampled_from(["0.5", "2", "low", "high", "irreversible", "accepted"]),
)
fields = st.sampled_from(
    [
        "observation",
        "source",
        "independence_group",
        "reliability",
        "proposition",
        "text",
        "derived_from",
        "about",
        "volatility",
        "test",
        "competing",
        "action_impact",
        "cost",
        "name",
        "entity",
        "alias_of",
        "supersedes",
        "status",
        "state",
        "confidence",
        "canonical",
        "outcome",
        "bogus",
    ]
)
calls = st.tuples(
    st.sampled_from([*KINDS, "governance.delete_everything"]),
    st.dictionaries(fields, values, max_size=6),
)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.lists(calls, min_size=1, max_size=12))
def test_any_call_is_judged_with_a_code_never_a_traceback(
    script: list[tuple[str, dict[str, Any]]],
) -> None:
    """Random tool calls: each is accepted, transformed, or rejected with a fixed code; and the
    graph the calls leave is the one refolding their events gives (replay)."""
    bench = bench_with_sources(2)
    bench.propose(
        "governance.propose_proposition",
        {"proposition": "p", "text": "x", "derived_from": ["o0"]},
        task="t",
        now_ns=T0,
    )
    recorded: list[Event] = []
    for n, (kind, params) in enumerate(script):
        call = bench.propose(kind, params, task="t", now_ns=T0 + n * HOUR_NS)
        assert call.outcome in ("accepted", "transformed", "rejected")
        if call.outcome == "rejected":
            assert call.feedback is not None and call.feedback.reason_code in CODES
            assert call.events == []
        recorded += call.events
        for asserted in ("status", "state", "confidence", "canonical"):
            if params.get(asserted) not in (None, "", False) and kind in KINDS:
                assert call.outcome == "rejected"
    for p in bench.graph.propositions.values():
        assert p.state in {s.value for s in scoring.BeliefState}
        assert all(o in bench.graph.observations for o in p.observations)  # provenance
    again = bench_with_sources(2)
    again.propose(
        "governance.propose_proposition",
        {"proposition": "p", "text": "x", "derived_from": ["o0"]},
        task="t",
        now_ns=T0,
    )
    for event in recorded:
        again.graph.apply(event)
    assert again.graph.propositions == bench.graph.propositions


def test_the_graph_round_trips_through_a_snapshot() -> None:
    bench = bench_with_sources(2)
    bench.propose(
        "governance.propose_proposition",
        {"proposition": "p", "text": "x", "derived_from": ["o0", "o1"]},
        task="t",
        now_ns=T0,
    )
    copy = bench.graph.copy()
    assert copy == bench.graph and copy is not bench.graph
    assert BeliefGraph().empty() and not bench.graph.empty()


def propose_test(bench: Workbench, test: str, **params: Any) -> str:
    call = bench.propose(
        "governance.propose_test", {"test": test, "proposition": "p", **params}, task="t", now_ns=T0
    )
    return call.outcome if call.feedback is None else str(call.feedback.reason_code)


def test_each_trigger_admits_a_test_and_none_refuses_it() -> None:
    bench = bench_with_sources(5)
    bench.propose(
        "governance.propose_proposition",
        {"proposition": "p", "text": "x", "derived_from": ["o0", "o1"]},
        task="t",
        now_ns=T0,
    )
    # Accepted at 0.95, nothing against it: no trigger, even at high impact.
    assert propose_test(bench, "t0") == "CONSTRAINT_VIOLATION"
    bench.propose(
        "governance.attach_contradiction",
        {"proposition": "p", "observation": "o2"},
        task="t",
        now_ns=T0,
    )
    assert bench.graph.propositions["p"].state == "contested"
    # One update left it contested, one contradiction unresolved: still no trigger at low impact.
    assert propose_test(bench, "t1", action_impact="low") == "CONSTRAINT_VIOLATION"
    bench.propose(
        "governance.attach_contradiction",
        {"proposition": "p", "observation": "o3"},
        task="t",
        now_ns=T0,
    )
    p = bench.graph.propositions["p"]
    assert (p.state, p.contested_updates, p.unresolved) == ("contested", 2, 2)
    assert propose_test(bench, "t2", action_impact="low") == "accepted"
    # Its result ingested, the contradictions count as resolved.
    bench.record_test("t2", "passed")
    call = bench.propose(
        "governance.execute_test_result_ingest", {"test": "t2"}, task="t", now_ns=T0
    )
    assert call.outcome == "accepted"
    assert bench.graph.propositions["p"].unresolved == 0
    assert bench.graph.observations["test:t2"].test == "t2"
