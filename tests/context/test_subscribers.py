"""The index of who a topic wakes answers as asking every hosted agent would, and follows
the agents as they register, change status and are hosted or let go."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.context import Hosted, Subscribers
from kernel.core.events import Manifest
from kernel.state.records import AgentStatus, AgentView, visible

PARTS = st.sampled_from(["desk", "a", "b", "", "trade", "*"])
NAMES = st.lists(PARTS, min_size=1, max_size=3).map(".".join)


@dataclass
class Registered:
    """What Subscribers reads of the projections: the registered agents, and the version
    each registration or status change moves (as ``Projections`` does)."""

    agents: dict[str, AgentView] = field(default_factory=dict)
    agents_version: int = 0

    def register(self, agent: AgentView) -> None:
        self.agents_version += 1
        self.agents[agent.manifest.agent_id] = agent


def view(agent_id: str, subscriptions: list[str], status: AgentStatus, seq: int) -> AgentView:
    manifest = Manifest(
        agent_id=agent_id, version="1.0.0", capabilities=[], subscriptions=subscriptions
    )
    return AgentView(manifest=manifest, status=status, session_hash=agent_id, registered_seq=seq)


def asked(
    hosts: dict[str, Any], projections: Registered, topic: str, active: bool
) -> tuple[str, ...]:
    """Every hosted agent asked, as the compiler did before the index."""
    found = []
    for agent_id in sorted(hosts):
        agent = projections.agents.get(agent_id)
        if agent is None or (active and agent.status is not AgentStatus.ACTIVE):
            continue
        if visible(agent.manifest.subscriptions, topic):
            found.append(agent_id)
    return tuple(found)


AGENTS = st.lists(
    st.tuples(
        st.sampled_from(["ann", "bob", "cid", "dee"]),
        st.lists(NAMES, max_size=3),
        st.sampled_from(list(AgentStatus)),
        st.booleans(),  # hosted
    ),
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(AGENTS, min_size=1, max_size=4), topics=st.lists(NAMES, min_size=1))
def test_the_index_wakes_whom_asking_every_agent_would(
    steps: list[list[tuple[str, list[str], AgentStatus, bool]]], topics: list[str]
) -> None:
    """Registrations, status changes and hosting change between lookups; every answer, for
    active agents and for all, is the scan's."""
    hosts: dict[str, Any] = Hosted()
    projections = Registered()
    index = Subscribers(hosts, projections)  # type: ignore[arg-type]  # reads .agents only
    seq = 0
    for step in steps:
        for agent_id, subscriptions, status, hosted in step:
            seq += 1
            projections.register(view(agent_id, subscriptions, status, seq))
            if hosted:
                hosts[agent_id] = object()
            else:
                hosts.pop(agent_id, None)
        for topic in topics:
            for active in (True, False):
                assert index.of(topic, active=active) == asked(hosts, projections, topic, active)


def test_an_agent_let_go_and_another_hosted_is_seen_at_once() -> None:
    hosts: dict[str, Any] = Hosted(ann=object())
    projections = Registered(
        {
            "ann": view("ann", ["desk"], AgentStatus.ACTIVE, 1),
            "bob": view("bob", ["desk"], AgentStatus.ACTIVE, 2),
        }
    )
    index = Subscribers(hosts, projections)  # type: ignore[arg-type]
    assert index.of("desk.tick") == ("ann",)
    del hosts["ann"]
    hosts["bob"] = object()  # as many hosted as before, and no registration in between
    assert index.of("desk.tick") == ("bob",)
    projections.register(view("bob", ["other"], AgentStatus.ACTIVE, 3))
    assert index.of("desk.tick") == ()
    # A snapshot restored: another map of agents, its version as it was saved (none).
    projections.agents = {"bob": view("bob", ["desk"], AgentStatus.ACTIVE, 4)}
    assert index.of("desk.tick") == ("bob",)
