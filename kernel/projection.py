"""Projections: the kernel's whole state, folded from the journal.

Every actor reads state from here and nowhere else. The live kernel applies
each committed batch as the journal reports it; ``fold`` rebuilds the same
state from scratch, and the two must agree (``digest`` compares them). Nothing
here reads the clock or the network: time enters only as recorded event data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from typing import Any

import msgspec

from kernel import flow
from kernel.events import (
    AgentRegistered,
    AgentStatusChanged,
    Event,
    ExecutionStarted,
    ExecutionSucceeded,
    Manifest,
    TriggerFired,
    digest,
)
from kernel.flow import FLOW_EVENTS, FlowState, FlowStatus
from kernel.memory import MEMORY_ADAPTER, MEMORY_EVENTS, MemoryState, Pending

MOVING = frozenset(
    {
        FlowStatus.CREATED,
        FlowStatus.ACTIVE,
        FlowStatus.VALIDATING,
        FlowStatus.ACCEPTED,
        FlowStatus.EXECUTING,
        FlowStatus.DIRTY,
    }
)
"""Statuses in which a flow moves on without a human."""


class AgentStatus(StrEnum):
    """What an agent may do: ACTIVE proposes, PASSIVE only observes, the others nothing."""

    ACTIVE = "ACTIVE"
    PASSIVE = "PASSIVE"
    SUSPENDED = "SUSPENDED"
    RETIRED = "RETIRED"


class AgentView(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A registered agent as the registry knows it."""

    manifest: Manifest
    status: AgentStatus
    session_hash: str
    registered_seq: int


class Fact(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """One key of the state layer: its value, where it came from and when."""

    value: Any
    source: str
    seq: int
    ts: int


class ExecutionRecord(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """The recorded result of an idempotency key."""

    dfid: str
    external_id: str
    detail: dict[str, Any]
    seq: int


def visible(subscriptions: Iterable[str], key: str) -> bool:
    """Whether a state key or topic falls under one of the dotted-prefix subscriptions."""
    for prefix in subscriptions:
        if key == prefix or key.startswith(prefix + ".") or prefix == "*":
            return True
    return False


class Projections:
    """The state of the kernel as of ``last_seq``."""

    def __init__(self) -> None:
        self.last_seq = 0
        self.flows: dict[str, FlowState] = {}
        self.agents: dict[str, AgentView] = {}
        self.sessions: dict[str, str] = {}
        self.state: dict[str, Fact] = {}
        self.executions: dict[str, ExecutionRecord] = {}
        self.moving: set[str] = set()
        self.memory = MemoryState()
        self._committing: dict[str, FlowState] | None = None

    def apply(self, events: Iterable[Event]) -> None:
        """Fold committed events, in seq order, into the state."""
        # Flows the guard already folded for the transaction being committed.
        committing, self._committing = self._committing, None
        for event in events:
            payload = event.payload
            if event.dfid is not None and type(payload) in FLOW_EVENTS:
                dfid = event.dfid
                if committing is None or dfid not in committing:
                    self._set_flow(flow.apply(self.flows.get(dfid), event))
                if isinstance(payload, ExecutionSucceeded):
                    self.executions[payload.key] = ExecutionRecord(
                        dfid=dfid,
                        external_id=payload.external_id,
                        detail=payload.detail,
                        seq=event.seq,
                    )
                elif (
                    isinstance(payload, ExecutionStarted)
                    and payload.intent.adapter == MEMORY_ADAPTER
                ):
                    self._memory_started(event, payload)
            elif type(payload) in MEMORY_EVENTS:
                self.memory.apply(event)
            elif isinstance(payload, TriggerFired):
                for key, value in payload.facts.items():
                    self.state[key] = Fact(
                        value=value,
                        source=payload.source or payload.topic,
                        seq=event.seq,
                        ts=event.ts,
                    )
            elif isinstance(payload, AgentRegistered):
                manifest = payload.manifest
                previous = self.agents.get(manifest.agent_id)
                if previous is not None:
                    self.sessions.pop(previous.session_hash, None)
                # A new handshake never lifts a demotion: only an operator does.
                self.agents[manifest.agent_id] = AgentView(
                    manifest=manifest,
                    status=previous.status if previous else AgentStatus.ACTIVE,
                    session_hash=payload.session_hash,
                    registered_seq=event.seq,
                )
                self.sessions[payload.session_hash] = manifest.agent_id
            elif isinstance(payload, AgentStatusChanged):
                agent = self.agents.get(event.agent_id or "")
                if agent is not None:
                    self.agents[agent.manifest.agent_id] = msgspec.structs.replace(
                        agent, status=AgentStatus(payload.status)
                    )
            self.last_seq = event.seq
        if committing:
            for state in committing.values():
                self._set_flow(state)

    def _memory_started(self, event: Event, payload: ExecutionStarted) -> None:
        flow_state = self.flows.get(event.dfid or "")
        self.memory.started(
            payload.intent.key,
            Pending(
                dfid=event.dfid or "",
                root_dfid=flow_state.root_dfid if flow_state else event.dfid or "",
                agent_id=event.agent_id or "",
                started_seq=event.seq,
            ),
        )

    def _set_flow(self, state: FlowState) -> None:
        self.flows[state.dfid] = state
        if state.status in MOVING:
            self.moving.add(state.dfid)
        else:
            self.moving.discard(state.dfid)

    def guard(self) -> Callable[[Sequence[Event]], None]:
        """Return a check for one journal transaction: it refuses illegal flow transitions.

        The journal calls it for each append in the transaction, in order, before
        writing anything; an append whose events do not fold (because another actor
        moved the flow first) raises IllegalTransition and is not written, while the
        others are. This is what makes an illegal transition impossible on disk.
        The flows it folds are the flows the transaction commits, so :meth:`apply`
        adopts them rather than folding the same events a second time.
        """
        staged: dict[str, FlowState] = {}
        self._committing = staged

        def check(events: Sequence[Event]) -> None:
            mine: dict[str, FlowState] = {}
            for event in events:
                dfid = event.dfid
                if dfid is None or type(event.payload) not in FLOW_EVENTS:
                    continue
                current = mine.get(dfid) or staged.get(dfid) or self.flows.get(dfid)
                mine[dfid] = flow.apply(current, event)
            staged.update(mine)

        return check

    def visible_state(
        self, subscriptions: Iterable[str], staged: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Return the state an agent with these subscriptions may see, sorted by key.

        ``staged`` holds facts recorded but not yet folded (they win over the state).
        """
        subs = tuple(subscriptions)
        seen = {k: fact.value for k, fact in self.state.items() if visible(subs, k)}
        if staged:
            seen.update((k, v) for k, v in staged.items() if visible(subs, k))
        return dict(sorted(seen.items()))

    def snapshot(self) -> dict[str, Any]:
        """Return the whole state as plain data (for digests, time travel and the CLI)."""
        return {
            "last_seq": self.last_seq,
            "flows": self.flows,
            "agents": self.agents,
            "sessions": self.sessions,
            "state": self.state,
            "executions": self.executions,
            "memory": self.memory,
        }

    def digest(self) -> str:
        """Return the hash of the canonical projected state."""
        return digest(self.snapshot())


def fold(events: Iterable[Event]) -> Projections:
    """Rebuild projections from scratch."""
    projections = Projections()
    projections.apply(events)
    return projections
