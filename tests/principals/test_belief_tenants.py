"""Governed beliefs are per tenant, as memory is: a tenant's workspace and canonical graph are
its own.

A task belongs to the tenant whose flows first recorded in it (``BeliefGraph.tenants``,
derived from the flows' principals, never from an event field an agent writes). Another
tenant's flows do not see its observations, entities or propositions (they are unrecorded
to them: a reference is refused as one that never was), cannot write into its task
(CROSS_TENANT), are not merged into its propositions as duplicates, and its canonical
beliefs never come back in their contexts. Replays judge the same.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agents_sdk import Manifest
from kernel import DecisionVerdict, Kernel, ReasonCode
from kernel.audit import open_journal
from kernel.audit.reverify import rejudge
from kernel.beliefs import GOVERNANCE_PACK, KINDS, BeliefGraph
from kernel.context._layers import layer_body
from kernel.core.events import Principal
from kernel.state.beliefs.domain import _canonical
from kernel.state.beliefs.graph import ObservationRecord
from kernel.testing import ManualClock
from tests.principals.kit import ACME, ANN, EVE, GLOBEX
from tests.support.helpers import ScriptedAgent, kernel_for

ASKED = "Where is Acme Corp headquartered?"


@asynccontextmanager
async def believing(path: Path) -> AsyncIterator[Kernel]:
    """The governance pack, two tenants declared, vouching for nobody."""
    async with kernel_for(
        path, packs=[GOVERNANCE_PACK], allow=["front"], clock=ManualClock(), principal=None
    ) as kernel:
        await kernel.register(ScriptedAgent("front", capabilities=KINDS))
        await kernel.declare_tenant(ACME)
        await kernel.declare_tenant(GLOBEX)
        yield kernel


async def call(kernel: Kernel, who: Principal, tool: str, task: str, **params: Any) -> Any:
    return await kernel.propose(
        "front",
        f"governance.{tool}",
        {"task": task, **params},
        explain="the test",
        confidence=0.9,
        principal=who,
    )


async def learn(kernel: Kernel, who: Principal, task: str) -> None:
    """Two independent sources place Acme Corp in Lyon; the task promotes it to canonical."""
    for observation, source in (("o1", "wire"), ("o2", "registry")):
        done = await call(
            kernel,
            who,
            "record_observation",
            task,
            observation=f"{task}.{observation}",
            source=source,
            independence_group=source,
            raw_payload=f"{source}: Acme Corp is in Lyon",
        )
        assert done.verdict is DecisionVerdict.EXECUTED, done
    steps: list[tuple[str, dict[str, Any]]] = [
        (
            "create_or_link_entity_candidate",
            {"name": "Acme Corp", "observation": f"{task}.o1", "entity": f"{task}.acme"},
        ),
        (
            "propose_proposition",
            {
                "proposition": f"{task}.p",
                "text": "Acme Corp is headquartered in Lyon",
                "derived_from": [f"{task}.o1"],
                "about": [f"{task}.acme"],
            },
        ),
        ("attach_support", {"proposition": f"{task}.p", "observation": f"{task}.o2"}),
        ("request_consolidation", {}),
    ]
    for tool, params in steps:
        done = await call(kernel, who, tool, task, **params)
        assert done.verdict is DecisionVerdict.EXECUTED, (tool, done)


def knowledge(kernel: Kernel, tenant: str) -> list[str]:
    """What a context compiled for ``tenant`` on the question brings back."""
    manifest = Manifest(agent_id="front", version="1", capabilities=[], subscriptions=["q"])
    body = layer_body(
        kernel.projections,
        manifest,
        {},
        ASKED,
        as_of_ns=kernel.projections.beliefs.latest_ns,
        tenant=tenant,
    )
    return list(body.reactivated)


async def test_a_tenants_beliefs_are_its_own(tmp_path: Path) -> None:
    async with believing(tmp_path / "j.db") as kernel:
        await learn(kernel, ANN, "t-acme")
        graph: BeliefGraph = kernel.projections.beliefs
        assert graph.propositions["t-acme.p"].layer == "canonical"
        assert graph.tenants == {"t-acme": "acme"}
        assert "t-acme.p" in graph.seen_by("acme").propositions
        theirs = graph.seen_by("globex")
        assert theirs.propositions == {} and theirs.observations == {} and theirs.names == {}
        # Ann's later task recalls it; Eve's context on the same question does not.
        assert knowledge(kernel, "acme") == [
            "entity:t-acme.acme",
            "proposition:t-acme.p",
        ]
        assert knowledge(kernel, "globex") == []


async def test_another_tenant_can_neither_write_into_nor_reference_a_tenants_beliefs(
    tmp_path: Path,
) -> None:
    async with believing(tmp_path / "j.db") as kernel:
        await learn(kernel, ANN, "t-acme")
        into = await call(
            kernel, EVE, "record_observation", "t-acme", observation="x1", source="tip"
        )
        assert (into.verdict, into.reason_code) == (
            DecisionVerdict.REFUSED,
            ReasonCode.CROSS_TENANT,
        )
        own = await call(
            kernel, EVE, "record_observation", "t-globex", observation="g1", source="tip"
        )
        assert own.verdict is DecisionVerdict.EXECUTED
        # Ann's proposition and observation are unrecorded to Eve's flows.
        support = await call(
            kernel, EVE, "attach_support", "t-globex", proposition="t-acme.p", observation="g1"
        )
        assert support.verdict is DecisionVerdict.REFUSED
        claim = {"proposition": "g.p", "text": "Acme Corp is headquartered in Lyon"}
        derived = await call(
            kernel, EVE, "propose_proposition", "t-globex", **claim, derived_from=["t-acme.o1"]
        )
        assert derived.verdict is DecisionVerdict.REFUSED
        # The same claim from her own observation is hers, not merged into Ann's.
        same = await call(
            kernel, EVE, "propose_proposition", "t-globex", **claim, derived_from=["g1"]
        )
        assert same.verdict is DecisionVerdict.EXECUTED
        graph = kernel.projections.beliefs
        assert graph.propositions["g.p"].task == "t-globex"
        assert graph.propositions["t-acme.p"].observations == ["t-acme.o1", "t-acme.o2"]
        assert graph.tenants == {"t-acme": "acme", "t-globex": "globex"}


async def test_tenant_beliefs_rejudge_as_recorded(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with believing(db) as kernel:
        await learn(kernel, ANN, "t-acme")
        await call(kernel, EVE, "record_observation", "t-acme", observation="x1", source="tip")
        await call(kernel, EVE, "record_observation", "t-globex", observation="g1", source="tip")
        await call(
            kernel, EVE, "attach_support", "t-globex", proposition="t-acme.p", observation="g1"
        )
    async with open_journal(db, readonly=True) as journal:
        result = await rejudge(journal, [GOVERNANCE_PACK])
        rejected = await journal.read(types=["ProposalRejected"])
    assert len(rejected) == 2
    assert result.changes == [] and result.mismatches == []


def test_a_graph_of_no_tenant_is_its_own_view_and_digests_as_before() -> None:
    graph = BeliefGraph()
    assert graph.seen_by("acme") is graph  # nothing to hide: nothing copied
    graph.observations["o"] = ObservationRecord(observation="o", source="s", group="s", task="t")
    assert "tenants" not in _canonical(graph)  # journals before tenants hash as they did
    graph.tenants["t"] = "acme"
    assert _canonical(graph)["tenants"] == {"t": "acme"}
