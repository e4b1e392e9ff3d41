"""The memory policy pack and its built-in executor.

Agents write memory only by proposing these kinds. They pass the DIM like any
other proposal (schema, authority, time, state, then the memory layer, which
checks memory writes against the active constraints too), and an accepted
one is executed by :class:`MemoryExecutor`, an adapter inside the kernel.

How an effect becomes a memory event: the executor never writes. The
execution engine records ExecutionStarted (the memory projection notes the
intent as pending, with its flow and agent), then calls the executor, which
returns the memory event (FactAdded, ConstraintAdded, ...) in its receipt
(:class:`~kernel.state.memory.Remembered`); the engine stages it, caused by
that ExecutionStarted and carrying the intent key, in the same append as
ExecutionSucceeded and FlowClosed: the fact and the end of its execution are
recorded together or not at all. The key in the memory event is the
idempotency record: ``lookup`` (asked on recovery) and a repeated call find
it written and answer ``memory:<key>``, with no second event.

A rule proposal is decided by the rulebook's owner, the DIM: the executor
sends it a :class:`~kernel.runtime.messages.SubmitRule` and waits for the
recorded decision, like an adapter waits for its system.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from kernel.adapters.contract import AdapterError, Receipt
from kernel.core.events import (
    ConstraintAdded,
    ConstraintDeactivated,
    DecisionMade,
    Event,
    ExecutionIntent,
    FactAdded,
    MemoryQueried,
    RuleDecided,
    RuleProposed,
    RuleSource,
)
from kernel.policy.kinds import PolicyKind
from kernel.policy.packs import PolicyPack
from kernel.runtime.actors import Reply
from kernel.runtime.messages import SubmitRule
from kernel.state.domain import ExecutorPorts, Recipient, State
from kernel.state.memory import (
    MEMORY_ADAPTER,
    Memory,
    MemoryState,
    MemoryWrite,
    Pending,
    Remembered,
    memory_id,
    mentions,
    recorded_receipt,
    started,
)

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


class MemoryExecutor:
    """The adapter that turns accepted memory intents into memory events.

    Args:
        projections: the memory projection (what is written, what is pending).
        rulebook: the mailbox of the rulebook's owner (the DIM), for rule proposals.
    """

    def __init__(self, projections: State, rulebook: Recipient) -> None:
        self._memory = projections.domain(Memory)
        self._rulebook = rulebook

    @property
    def _state(self) -> MemoryState:
        return self._memory.state

    async def lookup(self, key: str) -> Receipt | None:
        """Return the receipt of the memory effect recorded under ``key``, None if none is."""
        return recorded_receipt(self._state, key)

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        """Return the memory event of ``intent`` for the engine to record, once per key."""
        memory = self._state
        done = recorded_receipt(memory, intent.key)
        if done is not None:
            return done
        pending = started(memory, intent.key, "memory")
        if intent.kind == PROPOSE_RULE:
            return await self._propose_rule(intent, pending.root_dfid, pending)
        payload, detail = self._payload(intent, pending.root_dfid)
        return Remembered(external_id=memory_id(intent.key), detail=detail, records=(payload,))

    async def _propose_rule(
        self, intent: ExecutionIntent, correlation: str, pending: Pending
    ) -> Receipt:
        """Hand the proposal to the rulebook's owner; it records it with the promoter's decision.

        The one memory effect another actor records (the rulebook has one serial
        writer), so it crosses like any adapter's effect: once per key (the DIM
        records a key once; ``lookup`` finds it after a crash).
        """
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
        reply: Reply[list[Event] | Exception] = Reply()
        await self._rulebook.send(
            SubmitRule(
                proposal=proposal,
                flow=pending.dfid,
                caused_by=pending.started_seq,
                agent_id=pending.agent_id,
                reply=reply,
            )
        )
        answer = await reply.wait()
        if isinstance(answer, Exception):
            raise AdapterError(f"the rulebook refused the proposal: {answer}") from answer
        if not answer:
            return Receipt(external_id=memory_id(intent.key))  # recorded before
        decision = answer[-1].payload
        assert isinstance(decision, RuleDecided)
        return Receipt(
            external_id=memory_id(intent.key),
            detail={
                "decision": decision.decision,
                "reason": decision.reason,
                "version": decision.version,
            },
        )

    def _payload(
        self, intent: ExecutionIntent, correlation: str
    ) -> tuple[MemoryWrite, dict[str, object]]:
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

    def _query(
        self, topic: str, correlation: str, key: str
    ) -> tuple[MemoryWrite, dict[str, object]]:
        memory = self._state
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


def executor(ports: ExecutorPorts) -> MemoryExecutor:
    """Build the memory executor of one kernel (the memory domain names it: kernel.wiring)."""
    return MemoryExecutor(ports.projections, ports.dim)
