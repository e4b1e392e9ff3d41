"""Stage 1 of the seed: the policy micro-scenarios, through a real kernel, then replayed.

Each scenario proposes the governance pack's tool calls (one flow each) with a
manual clock, checks the belief states the kernel folded, and refolds the journal
from scratch: replay lands on the same graph.
"""

from __future__ import annotations

from pathlib import Path

from kernel.audit import fold, payloads, rejudge
from kernel.beliefs import GOVERNANCE_PACK, BeliefState
from kernel.core.events import ProposalAccepted, ProposalSubmitted
from kernel.testing import ScriptedTests
from tests.support.beliefs_domain import Desk, belief_desk

ACCEPTED, PROVISIONAL, CONTESTED = BeliefState.ACCEPTED, BeliefState.PROVISIONAL, "contested"


async def replayed(desk: Desk) -> None:
    """Refold the journal: the same belief graph; re-judge it: the same verdicts."""
    events = await desk.events()
    assert fold(events).beliefs == desk.graph
    found = await rejudge(desk.kernel.journal, [GOVERNANCE_PACK])
    assert found.changes == [] and found.judged > 0


def transitions(desk: Desk, proposition: str) -> list[tuple[str, str, str, str]]:
    return [
        (t.from_state, t.to_state, t.cause, t.evidence)
        for t in desk.graph.propositions[proposition].transitions
    ]


async def test_promotion_after_independent_support(tmp_path: Path) -> None:
    async with belief_desk(tmp_path / "j.db") as desk:
        await desk.observe("o1", "wire")
        await desk.observe("o2", "registry")
        await desk.call(
            "propose_proposition", proposition="p", text="Acme is in Lyon", derived_from=["o1"]
        )
        assert desk.state("p") == PROVISIONAL  # 0.78: one group only
        await desk.call("attach_support", proposition="p", observation="o2")
        assert desk.state("p") == ACCEPTED
        assert transitions(desk, "p") == [
            ("", "provisional", "supports", "o1>p"),
            ("provisional", "accepted", "supports", "o2>p"),
        ]
        [last] = desk.graph.propositions["p"].transitions[-1:]
        assert last.evidence_seq == desk.graph.evidence["o2>p"] and last.confidence == 950_000

        await desk.call("request_consolidation")
        [done] = desk.graph.consolidations
        assert done.promoted == ["p"] and done.trigger == "task_boundary"
        assert desk.graph.propositions["p"].layer == "canonical"
        assert [p.proposition for p in desk.graph.promotions] == ["p"]
        await replayed(desk)


async def test_one_source_repeated_is_not_promoted(tmp_path: Path) -> None:
    async with belief_desk(tmp_path / "j.db") as desk:
        for n in range(1, 6):
            await desk.observe(f"o{n}", "blog")
        await desk.call(
            "propose_proposition", proposition="p", text="Acme is bankrupt", derived_from=["o1"]
        )
        for n in range(2, 6):
            await desk.call("attach_support", proposition="p", observation=f"o{n}")
        assert desk.state("p") == PROVISIONAL
        now = desk.clock.now_ns()
        assert desk.graph.assess("p", now).confidence == 900_000  # 0.70 + 0.20 + 0.10, capped
        await desk.call("request_consolidation")
        [done] = desk.graph.consolidations
        assert done.promoted == [] and done.carried_over == ["p"]
        assert desk.graph.propositions["p"].layer == "workspace"
        await replayed(desk)


async def test_conflicting_evidence_is_contested_and_kept(tmp_path: Path) -> None:
    async with belief_desk(tmp_path / "j.db") as desk:
        await desk.observe("o1", "wire")
        await desk.observe("o2", "registry")
        await desk.call(
            "propose_proposition", proposition="p", text="Acme is in Lyon", derived_from=["o1"]
        )
        await desk.call("attach_contradiction", proposition="p", observation="o2")
        assert desk.state("p") == CONTESTED
        assert transitions(desk, "p")[-1] == ("provisional", "contested", "contradicts", "o2>p")
        p = desk.graph.propositions["p"]
        assert len(p.support) == 1 and len(p.contradiction) == 1  # both paths preserved
        types = {e.type for e in desk.graph.edges if e.target == "p"}
        assert {"supports", "contradicts"} <= types
        await replayed(desk)


async def test_dynamic_claims_decay_to_deprecated(tmp_path: Path) -> None:
    async with belief_desk(tmp_path / "j.db") as desk:
        await desk.observe("o1", "wire")
        await desk.observe("o2", "registry")
        await desk.call(
            "propose_proposition",
            proposition="p",
            text="the queue is empty",
            derived_from=["o1"],
            volatility="high",
        )
        await desk.call("attach_support", proposition="p", observation="o2")
        assert desk.state("p") == ACCEPTED
        desk.advance_hours(24)  # one half-life: freshness 0.5 (accepted needs 0.40)
        await desk.observe("o3", "clock")
        assert desk.state("p") == PROVISIONAL
        desk.advance_hours(48)  # three half-lives: freshness 0.125 < 0.20
        await desk.observe("o4", "clock")
        assert desk.state("p") == "deprecated"
        last = desk.graph.propositions["p"].transitions[-1]
        assert (last.cause, last.freshness) == ("time", 125_000)
        assert last.evidence_seq == desk.graph.evidence["o4"]  # the recorded later "now"
        await desk.call("request_consolidation")
        [done] = desk.graph.consolidations
        assert [(a.proposition, a.reason) for a in done.archived] == [("p", "DEPRECATED")]
        await replayed(desk)


async def test_ambiguous_aliases_are_never_merged(tmp_path: Path) -> None:
    async with belief_desk(tmp_path / "j.db") as desk:
        await desk.observe("o1", "crm")
        await desk.call(
            "create_or_link_entity_candidate",
            name="Jordan Smith",
            observation="o1",
            entity="person:jordan-1",
        )
        await desk.call(
            "create_or_link_entity_candidate",
            name="J. Smith",
            observation="o1",
            alias_of="person:jordan-1",
        )
        assert desk.graph.entities["person:jordan-1"].aliases == ["J. Smith"]
        await desk.call(
            "create_or_link_entity_candidate",
            name="Jordan Smith",
            observation="o1",
            entity="person:jordan-2",
        )
        # A second "Jordan Smith": a new candidate, possibly the same, not merged.
        second = desk.graph.entities["person:jordan-2"]
        assert second.possible_same_as == ["person:jordan-1"]
        await desk.call("create_or_link_entity_candidate", name="Jordan Smith", observation="o1")
        graph = desk.graph
        assert len(graph.entities) == 3
        third = next(e for e in graph.entities.values() if e.entity.startswith("entity:"))
        assert third.possible_same_as == ["person:jordan-1", "person:jordan-2"]
        assert graph.entities["person:jordan-1"].aliases == ["J. Smith"]  # untouched
        assert sum(e.type == "possible_same_as" for e in graph.edges) == 3
        await replayed(desk)


async def test_failed_discriminating_test_rejects(tmp_path: Path) -> None:
    tests = ScriptedTests({"t1": "failed"})
    async with belief_desk(tmp_path / "j.db", tests) as desk:
        await desk.observe("o1", "wire")
        await desk.observe("o2", "registry")
        await desk.call(
            "propose_proposition", proposition="p", text="Acme is in Lyon", derived_from=["o1"]
        )
        await desk.call(
            "propose_proposition", proposition="q", text="Acme is in Paris", derived_from=["o2"]
        )
        # A low-impact test costing more than its bounded benefit is suppressed.
        code = await desk.refusal(
            "propose_test",
            test="t0",
            proposition="p",
            competing=["q"],
            action_impact="low",
            cost="0.9",
        )
        assert code == "CONSTRAINT_VIOLATION"
        flow = await desk.call(
            "propose_test",
            test="t1",
            proposition="p",
            competing=["q"],
            action_impact="irreversible",
            method="ask the registry",
        )
        assert flow.status == "CLOSED" and [c.params["test"] for c in tests.calls] == ["t1"]
        assert desk.graph.tests["t1"].outcome == "failed"
        await desk.call("execute_test_result_ingest", test="t1")
        assert desk.state("p") == "rejected"
        assert transitions(desk, "p")[-1][1:] == ("rejected", "test", "test:t1")
        assert desk.graph.observations["test:t1"].test == "t1"  # re-entered as an observation
        assert desk.state("q") == PROVISIONAL
        await replayed(desk)


async def test_a_duplicate_proposition_is_transformed_into_support(tmp_path: Path) -> None:
    async with belief_desk(tmp_path / "j.db") as desk:
        await desk.observe("o1", "wire")
        await desk.observe("o2", "registry")
        await desk.call(
            "propose_proposition", proposition="p", text="Acme is in Lyon", derived_from=["o1"]
        )
        flow = await desk.call(
            "propose_proposition", proposition="p2", text="acme is in  Lyon.", derived_from=["o2"]
        )
        assert flow.status == "CLOSED"
        events = await desk.kernel.journal.flow_events(flow.dfid)
        [accepted] = payloads(events, ProposalAccepted)
        assert accepted.applied is not None
        assert accepted.applied.kind == "governance.attach_support"
        assert accepted.applied.params == {
            "proposition": "p",
            "observation": "o2",
            "task": "task-1",
        }
        [submitted] = payloads(events, ProposalSubmitted)
        assert submitted.proposal.kind == "governance.propose_proposition"
        assert "p2" not in desk.graph.propositions and desk.state("p") == ACCEPTED
        # The same duplicate again has nothing new to add: refused.
        code = await desk.refusal(
            "propose_proposition", proposition="p3", text="Acme is in Lyon", derived_from=["o2"]
        )
        assert code == "CONSTRAINT_VIOLATION"
        await replayed(desk)


async def test_refusals_carry_fixed_codes(tmp_path: Path) -> None:
    async with belief_desk(tmp_path / "j.db") as desk:
        await desk.observe("o1", "wire")
        assert (
            await desk.refusal(
                "propose_proposition", proposition="p", text="x", derived_from=["nowhere"]
            )
            == "MISSING_PROVENANCE"
        )
        assert await desk.refusal("propose_proposition", proposition="p", text="x") == (
            "MISSING_PROVENANCE"
        )
        assert await desk.refusal("record_observation", observation="o9") == "MISSING_PROVENANCE"
        assert await desk.refusal(
            "propose_proposition", proposition="p", text="x", derived_from=["o1"], status="accepted"
        ) == ("DIRECT_CANONICAL_WRITE_FORBIDDEN")
        assert (
            await desk.refusal("attach_support", proposition="p", observation="o1", canonical=True)
            == "DIRECT_CANONICAL_WRITE_FORBIDDEN"
        )
        assert await desk.refusal("unknown_tool", thing=1) == "SCHEMA_INVALID"
        assert await desk.refusal("attach_support", proposition="p", observation=7) == (
            "SCHEMA_INVALID"
        )
        assert await desk.refusal("record_observation", observation="o1", source="wire") == (
            "CONSTRAINT_VIOLATION"  # observations are immutable
        )
        assert await desk.refusal("execute_test_result_ingest", test="t") == "MISSING_PROVENANCE"
        assert desk.graph.propositions == {}
        await replayed(desk)
