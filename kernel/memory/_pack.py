"""The memory policy pack and its built-in executor.

Agents write memory only by proposing these kinds. They pass the DIM like any
other proposal (schema, authority, time, state, then the memory layer, which
checks memory writes against the active constraints too), and an accepted
one is executed by :class:`MemoryExecutor`, an adapter inside the kernel.

How an effect becomes a memory event: the "system behind" this adapter is the
journal itself. The execution engine records ExecutionStarted (the memory
projection notes the intent as pending, with its flow and agent), then calls
the executor, which appends the memory event (FactAdded, ConstraintAdded, ...)
caused by that ExecutionStarted and carrying the intent key; then the engine
records ExecutionSucceeded and closes the flow. The key in the memory event is
the executor's idempotency record: a call repeated after a crash finds the key
already written and returns the recorded seq, with no second event.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import ClassVar, Literal

from kernel.adapters.contract import AdapterError, Receipt
from kernel.core.events import (
    ConstraintAdded,
    ConstraintDeactivated,
    DecisionMade,
    Draft,
    Event,
    ExecutionIntent,
    FactAdded,
    MemoryQueried,
    Payload,
    RuleDecided,
    RuleProposed,
    RuleSource,
)
from kernel.policy.kinds import PolicyKind
from kernel.policy.packs import PolicyPack
from kernel.state.memory import MEMORY_ADAPTER, Pending, mentions
from kernel.state.projections import Projections
from kernel.state.rulebook import Promoter

PROPOSE_RULE = "memory.propose_rule"


class AddFact(PolicyKind, frozen=True, tag="memory.add_fact"):
    """Remember that ``name`` is ``value`` (confidence as a decimal string)."""

    adapter: ClassVar[str] = MEMORY_ADAPTER

    name: str
    value: str
    confidence: str = "1"


class AddConstraint(PolicyKind, frozen=True, tag="memory.add_constraint"):
    """Constrain every later proposal: "never X", "avoid X", "verify X before Y"."""

    adapter: ClassVar[str] = MEMORY_ADAPTER

    text: str
    priority: Literal["required", "learned", "preferred"] = "required"
    triggered_by: int | None = None


class DeactivateConstraint(PolicyKind, frozen=True, tag="memory.deactivate_constraint"):
    adapter: ClassVar[str] = MEMORY_ADAPTER

    constraint: int
    reason: str = ""


class RecordDecision(PolicyKind, frozen=True, tag="memory.record_decision"):
    adapter: ClassVar[str] = MEMORY_ADAPTER

    text: str
    rationale: str = ""
    refs: list[int] = []


class ProposeRule(PolicyKind, frozen=True, tag="memory.propose_rule"):
    """Propose a version of rulebook item ``rule``; the promoter gate decides on it.

    ``repo``, ``ref``, ``path`` and ``blob`` say where the text comes from (a rule
    without them is deferred to an operator); ``base_version`` is the version the
    agent saw in its context (0 for a new rule).
    """

    adapter: ClassVar[str] = MEMORY_ADAPTER

    rule: str
    title: str
    content: str
    labels: list[str] = []
    repo: str = ""
    ref: str = ""
    path: str = ""
    blob: str = ""
    base_version: int = 0
    reason: str = ""


class Query(PolicyKind, frozen=True, tag="memory.query"):
    """Consult memory about ``topic``: what procedural constraints wait for."""

    adapter: ClassVar[str] = MEMORY_ADAPTER

    topic: str


MEMORY_PACK = PolicyPack(
    name="memory",
    version="1.0.0",
    kinds=(AddFact, AddConstraint, DeactivateConstraint, RecordDecision, Query, ProposeRule),
    escalate_below_confidence=0.0,
)
"""Load it beside a domain pack to let agents (with these capabilities) keep memory."""

Append = Callable[[Sequence[Draft]], Awaitable[list[Event]]]


class MemoryExecutor:
    """The adapter that turns accepted memory intents into memory events."""

    def __init__(
        self, projections: Projections, append: Append, promoter: Promoter | None = None
    ) -> None:
        self._projections = projections
        self._append = append
        self._promoter = promoter or Promoter(lambda: projections.memory.rulebook, append)

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        """Record the memory event of ``intent`` once per key; return where it is."""
        memory = self._projections.memory
        written = memory.written.get(intent.key)
        if written is not None:
            return Receipt(external_id=f"memory#{written}")
        pending = memory.pending.get(intent.key)
        if pending is None:
            raise AdapterError(f"no started memory intent {intent.key}")
        if intent.kind == PROPOSE_RULE:
            return await self._propose_rule(intent, pending.root_dfid, pending)
        payload, detail = self._payload(intent, pending.root_dfid)
        [event] = await self._append(
            [
                Draft(
                    payload=payload,  # type: ignore[arg-type]
                    dfid=pending.dfid,
                    caused_by=pending.started_seq,
                    agent_id=pending.agent_id,
                )
            ]
        )
        return Receipt(external_id=f"memory#{event.seq}", detail=detail)

    async def _propose_rule(
        self, intent: ExecutionIntent, correlation: str, pending: Pending
    ) -> Receipt:
        p = intent.params
        proposal = RuleProposed(
            rule=p["rule"],
            title=p["title"],
            content=p["content"],
            labels=list(p.get("labels", [])),
            source=RuleSource(
                repo=p.get("repo", ""),
                ref=p.get("ref", ""),
                path=p.get("path", ""),
                blob=p.get("blob", ""),
            ),
            base_version=p.get("base_version", 0),
            proposer=pending.agent_id,
            reason=p.get("reason", ""),
            correlation_id=correlation,
            key=intent.key,
        )
        proposed, decided = await self._promoter.propose(
            proposal, dfid=pending.dfid, caused_by=pending.started_seq, agent_id=pending.agent_id
        )
        decision = decided.payload
        assert isinstance(decision, RuleDecided)
        return Receipt(
            external_id=f"memory#{proposed.seq}",
            detail={
                "decision": decision.decision,
                "reason": decision.reason,
                "version": decision.version,
            },
        )

    def _payload(
        self, intent: ExecutionIntent, correlation: str
    ) -> tuple[Payload, dict[str, object]]:
        p, key = intent.params, intent.key
        match intent.kind:
            case "memory.add_fact":
                return FactAdded(
                    name=p["name"],
                    value=p["value"],
                    confidence=p.get("confidence", "1"),
                    correlation_id=correlation,
                    key=key,
                ), {}
            case "memory.add_constraint":
                return ConstraintAdded(
                    text=p["text"],
                    priority=p.get("priority", "required"),
                    triggered_by=p.get("triggered_by"),
                    correlation_id=correlation,
                    key=key,
                ), {}
            case "memory.deactivate_constraint":
                return ConstraintDeactivated(
                    constraint=p["constraint"],
                    reason=p.get("reason", ""),
                    correlation_id=correlation,
                    key=key,
                ), {}
            case "memory.record_decision":
                return DecisionMade(
                    text=p["text"],
                    rationale=p.get("rationale", ""),
                    refs=list(p.get("refs", [])),
                    correlation_id=correlation,
                    key=key,
                ), {}
            case "memory.query":
                return self._query(p["topic"], correlation, key)
        raise AdapterError(f"the memory executor does not know {intent.kind!r}")

    def _query(self, topic: str, correlation: str, key: str) -> tuple[Payload, dict[str, object]]:
        memory = self._projections.memory
        facts = {
            name: fact.value
            for name, fact in sorted(memory.facts.items())
            if mentions(name, topic) or mentions(fact.value, topic)
        }
        constraints = sorted(c.seq for c in memory.constraints.values() if mentions(c.text, topic))
        payload = MemoryQueried(
            topic=topic,
            facts=sorted(facts),
            constraints=constraints,
            correlation_id=correlation,
            key=key,
        )
        return payload, {"facts": facts, "constraints": constraints}
