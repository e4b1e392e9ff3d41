"""The memory policy pack and its built-in executor.

Agents write memory only by proposing these kinds. They pass the DIM like any
other proposal (schema, authority, time, state, then the memory layer, which
checks memory writes against the active constraints too), and an accepted
one is executed by :class:`MemoryExecutor`, an adapter inside the kernel.

How an effect becomes a memory event: the executor never writes. The
execution engine records ExecutionStarted (the memory projection notes the
intent as pending, with its flow and agent), then calls the executor, which
returns the memory event (FactAdded, ConstraintAdded, ...) in its receipt
(:class:`~kernel.state.domain.RecordingReceipt`); the engine stages it, caused by
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

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

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
from kernel.policy.packs import PolicyCatalog, PolicyPack
from kernel.runtime.actors import Reply
from kernel.runtime.messages import SubmitRule
from kernel.state.constraints import parse
from kernel.state.domain import ExecutorPorts, Recipient, RecordingReceipt, State
from kernel.state.meaning import MATCHER, phrase_in, relevant
from kernel.state.memory import (
    MEMORY_ADAPTER,
    Memory,
    MemoryState,
    MemoryWrite,
    Pending,
    memory_id,
    recorded_receipt,
    started,
)
from kernel.state.principals import memory_tenant

PROPOSE_RULE = "memory.propose_rule"


class AddFact(PolicyKind, frozen=True, tag="memory.add_fact"):
    """Remember that ``name`` is ``value`` (confidence as a decimal string)."""

    adapter: ClassVar[str] = MEMORY_ADAPTER

    name: str
    value: str
    confidence: str = "1"


class AddConstraint(PolicyKind, frozen=True, tag="memory.add_constraint"):
    """Constrain later proposals: "never X", "avoid X", "verify X before Y", "always X".

    ``kinds`` scopes it to those policy kinds (a procedure's action is then any proposal
    of them, whatever its words); ``params`` to those parameters of theirs (the
    explanation is then not read). Empty: every kind, the whole text.
    """

    adapter: ClassVar[str] = MEMORY_ADAPTER

    text: str
    priority: Literal["required", "learned", "preferred"] = "required"
    triggered_by: int | None = None
    kinds: list[str] = []
    params: list[str] = []


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
    agent saw in its context (0 for a new rule); ``ns`` the rulebook namespace;
    ``input_event`` the id of the input that brought it (proposed once per namespace).
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
    ns: str = "default"
    input_event: str = ""


class Query(PolicyKind, frozen=True, tag="memory.query"):
    """Consult memory about ``topic``: what procedural constraints wait for."""

    adapter: ClassVar[str] = MEMORY_ADAPTER

    topic: str


def memory_pack(*, conflicts: Literal["refuse", "escalate"] = "refuse") -> PolicyPack:
    """Return the memory pack; ``conflicts`` says what a contradicting constraint meets.

    ``refuse`` (the default): CONSTRAINT_CONFLICT, naming both constraints.
    ``escalate``: the same, sent to a human, who may put it in force anyway.
    """
    return PolicyPack(
        name="memory",
        version="1.1.0",
        kinds=(AddFact, AddConstraint, DeactivateConstraint, RecordDecision, Query, ProposeRule),
        escalate_below_confidence=0.0,
        escalate_refusals=("CONSTRAINT_CONFLICT",) if conflicts == "escalate" else (),
    )


MEMORY_PACK = memory_pack()
"""Load it beside a domain pack to let agents (with these capabilities) keep memory.
(1.0.0, which judged older journals, is ``policies.memory_1_0``.)"""


class MemoryExecutor:
    """The adapter that turns accepted memory intents into memory events.

    Args:
        projections: the memory projection (what is written, what is pending).
        rulebook: the mailbox of the rulebook's owner (the DIM), for rule proposals.
        catalog: the packs in force: a constraint records the synonyms they declare, and
            its scope must name their kinds.
    """

    def __init__(
        self, projections: State, rulebook: Recipient, catalog: PolicyCatalog | None = None
    ) -> None:
        self._projections = projections
        self._memory = projections.domain(Memory)
        self._rulebook = rulebook
        self._catalog = catalog

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
        # What it writes is the tenant's its flow acts for (kernel.state.memory).
        tenant = memory_tenant(self._projections, pending.dfid)
        payload, detail = self._payload(intent, pending.root_dfid, tenant)
        return RecordingReceipt(
            external_id=memory_id(intent.key), detail=detail, records=(payload,)
        )

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
            ns=p.get("ns", "default"),
            input_event=p.get("input_event", ""),
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
        self, intent: ExecutionIntent, correlation: str, tenant: str
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
                    tenant=tenant,
                ), {}
            case "memory.add_constraint":
                return self._constraint(p, correlation, key, tenant), {}
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
                return self._query(p["topic"], correlation, key, tenant)
        raise AdapterError(f"the memory executor does not know {intent.kind!r}")

    def _constraint(
        self, p: dict[str, Any], correlation: str, key: str, tenant: str
    ) -> ConstraintAdded:
        """The constraint as recorded: matched by meaning, with the packs' synonyms it uses.

        Raises:
            AdapterError: its scope names a kind no loaded pack defines, or a parameter
                none of its kinds has (terminal: a typo must not scope a constraint away).
        """
        kinds, params = list(p.get("kinds", [])), list(p.get("params", []))
        catalog = self._catalog
        if catalog is not None:
            _check_scope(catalog.kinds, kinds, params)
        packs = catalog.packs if catalog is not None else ()
        phrases = [phrase for phrase in parse(p["text"]) or () if phrase]
        return ConstraintAdded(
            text=p["text"],
            priority=p.get("priority", "required"),
            triggered_by=p.get("triggered_by"),
            correlation_id=correlation,
            key=key,
            matcher=MATCHER,
            synonyms=relevant(phrases, [group for pack in packs for group in pack.synonyms]),
            kinds=kinds,
            params=params,
            tenant=tenant,
        )

    def _query(
        self, topic: str, correlation: str, key: str, tenant: str
    ) -> tuple[MemoryWrite, dict[str, object]]:
        memory = self._state
        facts = {
            name: fact.value
            for name, fact in sorted(memory.facts_of(tenant).items())
            if phrase_in(topic, name) or phrase_in(topic, fact.value)
        }
        seen = memory.seen_by(tenant).constraints.values()
        constraints = sorted(c.seq for c in seen if phrase_in(topic, c.text, c.synonyms))
        payload = MemoryQueried(
            topic=topic,
            facts=sorted(facts),
            constraints=constraints,
            correlation_id=correlation,
            key=key,
        )
        return payload, {"facts": facts, "constraints": constraints}


def _check_scope(
    known: Mapping[str, type[PolicyKind]], kinds: list[str], params: list[str]
) -> None:
    for kind in kinds:
        if kind not in known:
            raise AdapterError(f"the constraint's scope names kind {kind!r}, which no pack defines")
    fields = {f for kind in (kinds or known) for f in known[kind].__struct_fields__}
    for name in params:
        if name not in fields:
            raise AdapterError(f"the constraint's scope names parameter {name!r}, of no such kind")


def executor(ports: ExecutorPorts) -> MemoryExecutor:
    """Build the memory executor of one kernel (the memory domain names it: kernel.api.wiring)."""
    return MemoryExecutor(ports.projections, ports.dim, ports.catalog)
