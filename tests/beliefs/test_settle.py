"""Issue 19 follow-up: a failed discriminating test settles a dispute; correlated copies do not.

Stage 1-style, through a real kernel, then replayed: the transitions the test
result causes name it, and refolding the journal lands on the same graph.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.audit import fold, open_journal
from kernel.beliefs import (
    HOUR_NS,
    SCALE,
    Assessment,
    Call,
    Evidence,
    Volatility,
    Workbench,
    assess,
)
from kernel.cli import main
from kernel.core.events import PropositionTransitioned
from kernel.state.snapshots import checkpoints, state_at, verify_projections
from kernel.testing import ScriptedTests
from tests.beliefs.test_stage1 import replayed, transitions
from tests.support.beliefs_domain import Desk, belief_desk


async def dispute(desk: Desk) -> None:
    """Two groups say Lyon (q), two other groups say Paris (p): each contradicts the other."""
    for o, source in (("o1", "wire"), ("o2", "registry"), ("o3", "gazette"), ("o4", "radio")):
        await desk.observe(o, source)
    await desk.call(
        "propose_proposition", proposition="q", text="Acme is in Lyon", derived_from=["o1"]
    )
    await desk.call("attach_support", proposition="q", observation="o2")
    await desk.call(
        "propose_proposition", proposition="p", text="Acme is in Paris", derived_from=["o3"]
    )
    await desk.call("attach_support", proposition="p", observation="o4")
    for o in ("o3", "o4"):
        await desk.call("attach_contradiction", proposition="q", observation=o)
    for o in ("o1", "o2"):
        await desk.call("attach_contradiction", proposition="p", observation=o)
    assert desk.state("q") == desk.state("p") == "contested"


async def test_a_failed_discriminating_test_settles_the_dispute(tmp_path: Path) -> None:
    tests = ScriptedTests({"t1": "failed"})
    async with belief_desk(tmp_path / "j.db", tests, checkpoint_every=7) as desk:
        await dispute(desk)
        flow = await desk.call(
            "propose_test", test="t1", proposition="p", competing=["q"], method="registry"
        )
        assert flow.status == "CLOSED", await desk.why(flow)
        await desk.call("execute_test_result_ingest", test="t1")

        assert desk.state("p") == "rejected"
        # p's testimony no longer counts against q: the dispute is settled, by the test.
        assert desk.state("q") == "accepted"
        assert transitions(desk, "q")[-1] == ("contested", "accepted", "test", "test:t1")
        last = desk.graph.propositions["q"].transitions[-1]
        assert last.evidence_seq == desk.graph.evidence["test:t1"]
        assert (last.contradiction, last.contradiction_groups, last.confidence) == (0, 0, 950_000)
        # History stays: the contradiction evidence and its edges are still recorded.
        q = desk.graph.propositions["q"]
        assert len(q.contradiction) == 2
        against = {
            e.source for e in desk.graph.edges if e.type == "contradicts" and e.target == "q"
        }
        assert against == {"o3", "o4"}
        assert desk.graph.refuted("q") == {"o3", "o4"}
        await replayed(desk)
    # Snapshots taken before and after the test restore the same graph as a refold.
    async with open_journal(tmp_path / "j.db", readonly=True) as opened:
        events = list(await opened.read())
        assert len(await checkpoints(opened)) >= 2
        for seq in range(1, opened.head_seq + 1):
            prefix = [e for e in events if e.seq <= seq]  # a seq may hold two events
            assert (await state_at(opened, seq)).beliefs == fold(prefix).beliefs
        report = await verify_projections(opened)
    assert report.ok, report.problems
    # dirk beliefs shows the contradiction kept as history and marked as not counted.
    shown = await anyio.to_thread.run_sync(beliefs_json, tmp_path / "j.db")
    rows = {r["proposition"]: r for r in shown["propositions"]}
    assert [e.get("refuted", False) for e in rows["q"]["evidence"]] == [
        False,
        False,
        True,
        True,
    ]
    assert not any(e.get("refuted") for e in rows["p"]["evidence"])
    assert rows["q"]["state"] == "accepted" and rows["q"]["contradiction"] == "0.000000"


def beliefs_json(path: Path) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["beliefs", "--db", str(path), "--json"]) == 0
    found: dict[str, Any] = json.loads(out.getvalue())
    return found


async def test_a_failed_test_settles_only_against_the_rivals_it_names(tmp_path: Path) -> None:
    tests = ScriptedTests({"t1": "failed"})
    async with belief_desk(tmp_path / "j.db", tests) as desk:
        await dispute(desk)
        await desk.call(
            "propose_proposition", proposition="r", text="Acme is in Nice", derived_from=["o3"]
        )
        # A test of p against r only: p is refuted, q's dispute is not settled by it.
        await desk.call("propose_test", test="t1", proposition="p", competing=["r"])
        await desk.call("execute_test_result_ingest", test="t1")
        assert desk.state("p") == "rejected"
        assert desk.state("q") == "contested"
        assert desk.graph.refuted("q") == frozenset()
        await replayed(desk)


async def test_correlated_copies_contest_an_accepted_belief(tmp_path: Path) -> None:
    """The finding kept (docs/beliefs.md): one independence group can contest two.

    Under the seed's literal contested rule (support >= 0.45 and contradiction >= 0.45)
    one pool's first copy already weighs 0.70; the rule is kept, so this pins it,
    and shows the seed's remedy: a discriminating test, which now settles it.
    """
    tests = ScriptedTests({"t1": "failed"})
    async with belief_desk(tmp_path / "j.db", tests) as desk:
        await desk.observe("o1", "hr")
        await desk.observe("o2", "colleague")
        await desk.call(
            "propose_proposition", proposition="q", text="Kim is CFO", derived_from=["o1"]
        )
        await desk.call("attach_support", proposition="q", observation="o2")
        assert desk.state("q") == "accepted"
        for n in range(3, 6):
            await desk.observe(f"o{n}", f"outlet{n}", group="press-pool")
            await desk.call("attach_contradiction", proposition="q", observation=f"o{n}")
        assessed = desk.graph.assess("q", desk.clock.now_ns())
        assert assessed.contradiction_groups == 1 and assessed.support_groups == 2
        assert desk.state("q") == "contested"
        assert transitions(desk, "q")[2] == ("accepted", "contested", "contradicts", "o3>q")

        # The seed's own remedy is its test loop: the copies' claim, tested and failed,
        # no longer counts against q, which is accepted again (thresholds untouched).
        await desk.call(
            "propose_proposition", proposition="p", text="Kim is CEO", derived_from=["o3"]
        )
        for n in (4, 5):
            await desk.call("attach_support", proposition="p", observation=f"o{n}")
        for n in (1, 2):  # two unresolved contradictions: the test trigger holds
            await desk.call("attach_contradiction", proposition="p", observation=f"o{n}")
        flow = await desk.call("propose_test", test="t1", proposition="p", competing=["q"])
        assert flow.status == "CLOSED", await desk.why(flow)
        await desk.call("execute_test_result_ingest", test="t1")
        assert desk.state("p") == "rejected"
        assert desk.state("q") == "accepted"
        assert transitions(desk, "q")[-1] == ("contested", "accepted", "test", "test:t1")
        await replayed(desk)


observations = st.sampled_from([f"o{n}" for n in range(6)])
at = st.integers(min_value=0, max_value=48 * HOUR_NS)
group = st.sampled_from("abcd")
evidence = st.builds(
    Evidence,
    group=group,
    reliability=st.integers(min_value=0, max_value=SCALE),
    at_ns=at,
    observation=observations,
)


def assess_at(
    support: Sequence[Evidence],
    against: Sequence[Evidence],
    *,
    refuted: Collection[str] = (),
    failed_test: bool = False,
) -> Assessment:
    """Assess at 48 hours, medium volatility, created at 0."""
    return assess(
        support,
        against,
        volatility=Volatility.MEDIUM,
        created_ns=0,
        now_ns=48 * HOUR_NS,
        refuted=refuted,
        failed_test=failed_test,
    )


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    st.lists(evidence, max_size=6),
    st.lists(evidence, max_size=6),
    st.frozensets(observations),
    st.booleans(),
)
def test_refuted_contradiction_counts_as_never_attached(
    support: list[Evidence], against: list[Evidence], refuted: frozenset[str], failed: bool
) -> None:
    before = assess_at(support, against, failed_test=failed)
    after = assess_at(support, against, refuted=refuted, failed_test=failed)
    assert assess_at(support, against, refuted=(), failed_test=failed) == before
    # Exactly the evidence left counts: as if the refuted contradiction was never attached.
    kept = [e for e in against if e.observation not in refuted]
    assert assess_at(support, kept, failed_test=failed) == after
    # Support, freshness and a failed test of its own are untouched.
    assert (after.support, after.support_groups, after.freshness) == (
        before.support,
        before.support_groups,
        before.freshness,
    )
    if failed:
        assert after.state == before.state == "rejected"
    if all(e.observation in refuted for e in against):
        assert after.contradiction == after.contradiction_groups == 0


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    st.lists(st.builds(Evidence, group=group, at_ns=at, observation=observations), max_size=6),
    st.lists(st.builds(Evidence, group=group, at_ns=at, observation=observations), max_size=6),
    st.frozensets(observations),
)
def test_refuting_only_lowers_contradiction_at_one_reliability(
    support: list[Evidence], against: list[Evidence], refuted: frozenset[str]
) -> None:
    """With one reliability per group's evidence, a refutation never raises contradiction.

    (With mixed reliabilities it can: the group's next evidence moves up to the 0.70
    step. That is saturation's order, and the rule is "as if never attached".)
    """
    before = assess_at(support, against)
    after = assess_at(support, against, refuted=refuted)
    assert after.contradiction <= before.contradiction
    assert after.contradiction_groups <= before.contradiction_groups
    assert after.confidence >= before.confidence


OUTCOMES = st.sampled_from(["passed", "failed", "inconclusive"])


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    st.integers(min_value=1, max_value=3),
    st.integers(min_value=1, max_value=3),
    OUTCOMES,
    OUTCOMES,
    st.booleans(),
)
def test_a_tested_dispute_folds_consistently(
    left: int, right: int, out_a: str, out_b: str, b_first: bool
) -> None:
    """Any dispute, any test outcomes, either order: states are the fold's, history stays,
    and a failed test leaves its rival scored without the refuted side's contradiction."""
    bench = Workbench()
    now = 0

    def call(kind: str, **params: Any) -> Call:
        nonlocal now
        now += HOUR_NS
        return bench.propose(f"governance.{kind}", params, task="t", now_ns=now)

    sides = {"a": [f"a{i}" for i in range(left)], "b": [f"b{i}" for i in range(right)]}
    for side, observations in sides.items():
        for o in observations:
            call("record_observation", observation=o, source=o)
        call("propose_proposition", proposition=side, text=f"it is {side}", derived_from=[o])
        for o in observations[:-1]:
            call("attach_support", proposition=side, observation=o)
    for side, rival in (("a", "b"), ("b", "a")):
        for o in sides[rival]:
            call("attach_contradiction", proposition=side, observation=o)
    proposed = {}
    for side, rival, outcome in (("a", "b", out_a), ("b", "a", out_b)):
        test = f"t-{side}"
        made = call("propose_test", test=test, proposition=side, competing=[rival])
        if made.outcome != "rejected":
            bench.record_test(test, outcome)
            proposed[side] = outcome
    history = {p: len(bench.graph.propositions[p].contradiction) for p in "ab"}
    for side in sorted(proposed, reverse=b_first):
        done = call("execute_test_result_ingest", test=f"t-{side}")
        assert done.outcome == "accepted", done
        for event in done.events:
            if isinstance(event.payload, PropositionTransitioned):
                # Every transition the ingest records names the test result.
                assert (event.payload.cause, event.payload.evidence) == ("test", f"test:t-{side}")
    graph = bench.graph
    for p in "ab":
        assert graph.propositions[p].state == graph.assess(p, now).state  # the fold's state
        assert len(graph.propositions[p].contradiction) >= history[p]  # history stays
    for side, rival in (("a", "b"), ("b", "a")):
        refuted = proposed.get(side) == "failed"
        assert graph.propositions[side].state == "rejected" or not refuted
        if refuted and proposed.get(rival) != "failed":
            assert graph.assess(rival, now).contradiction == 0
            assert graph.refuted(rival) == frozenset(sides[side])
            groups = len(sides[rival]) + (proposed.get(rival) == "passed")
            assert graph.propositions[rival].state == ("accepted" if groups >= 2 else "provisional")
        elif not refuted:
            assert graph.refuted(rival) == frozenset()
