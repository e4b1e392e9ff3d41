"""Beliefs that come back: a second task's context holds what the first one promoted."""

from __future__ import annotations

from pathlib import Path

from agents_sdk import Agent, Manifest, Proposal, WorkingContext
from kernel.audit import fold
from kernel.context._layers import layer_body
from kernel.core.events import ContextCompiled
from kernel.state.beliefs.graph import BeliefGraph
from kernel.state.beliefs.recall import MAX_PROPOSITIONS, reactivate
from tests.support.beliefs_domain import Desk, belief_desk


class Reader(Agent):
    """An agent of a later task: it reads its context and proposes nothing."""

    def __init__(self) -> None:
        self.manifest = Manifest(
            agent_id="reader",
            version="1.0.0",
            capabilities=[],
            subscriptions=["task2"],
        )
        self.contexts: list[WorkingContext] = []

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        self.contexts.append(ctx)
        return None


async def first_task(desk: Desk) -> None:
    """Task 1 learns, from two independent sources, that Acme Corp is in Lyon; promotes it."""
    await desk.observe("o1", "wire")
    await desk.observe("o2", "registry")
    linked = await desk.call(
        "create_or_link_entity_candidate", name="Acme Corp", observation="o1", entity="acme"
    )
    assert linked.status == "CLOSED", await desk.why(linked)
    await desk.call(
        "propose_proposition",
        proposition="p",
        text="Acme Corp is headquartered in Lyon",
        derived_from=["o1"],
        about=["acme"],
    )
    await desk.call("attach_support", proposition="p", observation="o2")
    await desk.call("request_consolidation")
    archived = await desk.call("archive_episode", episode="e1", summary="Located Acme Corp")
    assert archived.status == "CLOSED", await desk.why(archived)
    assert desk.graph.propositions["p"].layer == "canonical"


async def test_a_second_tasks_context_holds_the_promoted_belief_with_provenance(
    tmp_path: Path,
) -> None:
    async with belief_desk(tmp_path / "j.db", allow=("reader",)) as desk:
        await first_task(desk)
        reader = Reader()
        await desk.kernel.register(reader)
        desk.advance_hours(2)
        [dfid] = await desk.kernel.trigger("task2", {"task2.question": "Where is acme corp?"})
        [other] = await desk.kernel.trigger("task2", {"task2.question": "What is on the menu?"})
        await desk.kernel.wait_quiet()
        events = await desk.kernel.journal.read()

    ctx, unrelated = reader.contexts
    [prop] = ctx.knowledge["propositions"]
    assert prop["id"] == "p" and prop["state"] == "accepted"
    assert prop["provenance"]["task"] == "task-1"
    assert prop["provenance"]["observations"] == ["o1", "o2"]
    assert prop["provenance"]["sources"] == ["registry", "wire"]
    assert prop["provenance"]["consolidation"] != ""
    assert 0 < prop["freshness"] <= 1_000_000
    assert [e["id"] for e in ctx.knowledge["entities"]] == ["acme"]
    assert [e["summary"] for e in ctx.knowledge["episodes"]] == ["Located Acme Corp"]
    assert unrelated.knowledge == {}

    # Recorded: what came back; and compiling again from the journal gives the same layer.
    compiled = {
        e.dfid: (i, e.payload)
        for i, e in enumerate(events)
        if isinstance(e.payload, ContextCompiled)
    }
    index, recorded = compiled[dfid]
    assert recorded.reactivated == ["entity:acme", "proposition:p", "episode:e1"]
    assert compiled[other][1].reactivated == []
    before = fold(events[:index])
    again = layer_body(before, reader.manifest, {}, "task2", as_of_ns=recorded.as_of_ns)
    assert again.reactivated == recorded.reactivated
    assert again.knowledge == ctx.knowledge


def test_the_budget_is_fixed_and_nothing_canonical_means_nothing_shown() -> None:
    assert reactivate(BeliefGraph(), "anything at all", 0) == ({}, [])
    assert MAX_PROPOSITIONS == 20
