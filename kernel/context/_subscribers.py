"""Which hosted agents a topic wakes, without asking every agent on every trigger.

A trigger wakes each hosted agent one of whose dotted-prefix subscriptions covers its
topic (:func:`kernel.state.records.visible`). Asking each agent costs a trigger the
number of agents registered: with a thousand hosted and four subscribed, nearly all of
a trigger's time went to the other 996. :class:`Subscribers` indexes the hosted agents by
subscription and looks a topic up by the prefixes that can cover it (the topic itself,
each part before a dot, and ``*``), so a trigger costs what it wakes.

The index is derived from the hosted agents and their registrations and is rebuilt when
either changes: a registration, a status change (each replaces the agent's record) or an
agent hosted, let go or hosted again. Telling that costs two counters compared
(:class:`Hosted` and ``Projections.agents_version``), whatever the agents registered;
maps without them cost a comparison of two tuples built in C. Nothing in it is
recorded: the flows it opens are what the journal says, in the same order as asking
every agent (sorted by agent id).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernel.state.projections import Projections
from kernel.state.records import AgentStatus, AgentView


def covering(topic: str) -> list[str]:
    """The subscriptions that cover ``topic``: itself, what precedes each dot, and ``*``."""
    found = [topic[:i] for i, char in enumerate(topic) if char == "."]
    found += [topic, "*"]
    return found


class Hosted(dict[str, Any]):
    """The hosted agents' mailboxes by id, with a :attr:`version` each change moves."""

    version = 0

    def __setitem__(self, key: str, value: Any) -> None:
        self.version += 1
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.version += 1
        super().__delitem__(key)

    def pop(self, key: str, *default: Any) -> Any:
        self.version += 1
        return super().pop(key, *default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self.version += 1
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.version += 1
        super().update(*args, **kwargs)

    def popitem(self) -> tuple[str, Any]:
        self.version += 1
        return super().popitem()

    def clear(self) -> None:
        self.version += 1
        super().clear()


class Subscribers:
    """The hosted agents a topic wakes, by an index rebuilt when the agents change.

    Args:
        hosts: the hosted agents' mailboxes by agent id (the kernel's own map: read, never
            changed here).
        projections: the kernel's projections (the registered agents; likewise).
    """

    def __init__(self, hosts: Mapping[str, Any], projections: Projections) -> None:
        self._hosts = hosts
        self._projections = projections
        self._seen: tuple[object, ...] | None = None
        self._by_prefix: dict[str, list[str]] = {}
        self._by_topic: dict[str, tuple[str, ...]] = {}

    def of(self, topic: str, *, active: bool = True) -> tuple[str, ...]:
        """The hosted agents ``topic`` wakes, sorted by id; ``active`` False: whatever their
        status (what a trigger reserves room for before the compiler looks)."""
        agents = self._fresh()
        key = topic if active else f"\x00{topic}"
        found = self._by_topic.get(key)
        if found is None:
            ids: set[str] = set()
            for prefix in covering(topic):
                ids.update(self._by_prefix.get(prefix, ()))
            found = tuple(
                sorted(
                    agent_id
                    for agent_id in ids
                    if not active or agents[agent_id].status is AgentStatus.ACTIVE
                )
            )
            self._by_topic[key] = found
        return found

    def _fresh(self) -> Mapping[str, AgentView]:
        agents = self._projections.agents
        hosted = getattr(self._hosts, "version", None)
        version = getattr(self._projections, "agents_version", None)
        # A snapshot restored replaces the agents' map: its id is part of what was seen.
        seen: tuple[object, ...] = (
            (hosted, id(agents), version)
            if hosted is not None and version is not None
            else (tuple(self._hosts), tuple(agents.values()))
        )
        if seen == self._seen:
            return agents
        self._seen = seen
        self._by_topic = {}
        by_prefix: dict[str, list[str]] = {}
        for agent_id in self._hosts:
            agent = agents.get(agent_id)
            if agent is None:
                continue
            for prefix in set(agent.manifest.subscriptions):
                by_prefix.setdefault(prefix, []).append(agent_id)
        self._by_prefix = by_prefix
        return agents
