"""Governed memory: facts, constraints, decisions and queries, folded from memory events.

Memory is written only through a memory policy kind the DIM accepted (see
:mod:`kernel.memory._pack`): the memory executor returns the event (a
:class:`kernel.state.domain.RecordingReceipt`) and the execution engine records it with the
intent's ExecutionSucceeded (rule events: the DIM, the rulebook's owner), so every fact
and every constraint has a proposal, a verdict and a cause in the journal. This module
holds the projection (:class:`MemoryState`) and the DIM's memory layer
(:func:`kernel.state.constraints.check`), a pure function of the proposal and the memory state.

The DIM's memory layer (what constraints forbid and require, how their texts
match, their conflicts) is :mod:`kernel.state.constraints`.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import msgspec

from kernel.adapters.contract import AdapterError, Receipt
from kernel.core.events import (
    ConstraintAdded,
    ConstraintDeactivated,
    ContextCompiled,
    DecisionMade,
    Event,
    ExecutionFailed,
    ExecutionRefused,
    ExecutionStarted,
    ExecutionSucceeded,
    FactAdded,
    Feedback,
    FlowAborted,
    FlowClosed,
    FlowCompensated,
    MeaningScored,
    MemoryQueried,
    Payload,
    ProposalRecord,
    RuleDecided,
    RuleProposed,
    RuleRetracted,
)
from kernel.core.flow import FlowState
from kernel.policy.rules import View
from kernel.state.constraints import (
    CONSTRAINT_KINDS,
    ConstraintRecord,
    ScoreRecord,
    by_priority,
    check,
)
from kernel.state.domain import Domain, ExecutorFactory, Fold, Saved, State
from kernel.state.rulebook import DEFAULT_NS, Rulebook, RuleSearch, select, shown_item

MEMORY_EVENTS = frozenset(
    {
        MeaningScored,
        FactAdded,
        ConstraintAdded,
        ConstraintDeactivated,
        DecisionMade,
        MemoryQueried,
        RuleProposed,
        RuleDecided,
        RuleRetracted,
    }
)
"""Payload types folded into :class:`MemoryState`."""

MEMORY_WRITES: frozenset[type[Payload]] = frozenset(
    {FactAdded, ConstraintAdded, ConstraintDeactivated, DecisionMade, MemoryQueried}
)
"""Memory events the execution engine records with a memory intent's ExecutionSucceeded.
(Rule events are staged by the rulebook's owner, the DIM, never by the engine.)"""

QUERIED_TOPICS = 256
"""The most topics remembered as queried per agent and per flow tree (bounded folds): the
newest by seq are kept; a topic queried longer ago must be queried again (fail closed)."""

MEMORY_ADAPTER = "memory"
"""The adapter name of the built-in memory executor."""


class FactRecord(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """A fact as memory holds it; ``tenant`` left out of the digest while empty."""

    value: str
    confidence: str
    seq: int
    agent_id: str
    correlation_id: str
    tenant: str = ""
    """The tenant whose flows see it (empty: every tenant's)."""


def fact_key(tenant: str, name: str) -> str:
    """A fact's key in :attr:`MemoryState.facts`: its name, after its tenant's if it has one.

    A NUL separates them: no recorded name holds one, so a shared fact's name can never
    be mistaken for another tenant's key.
    """
    return f"{tenant}\x00{name}" if tenant else name


class TenantMemory(msgspec.Struct, frozen=True, kw_only=True):
    """The part of memory a tenant's proposals are judged by: shared constraints and its own."""

    constraints: dict[int, ConstraintRecord]
    queried: dict[str, dict[str, int]]
    scores: dict[str, dict[str, ScoreRecord]]


class Pending(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A memory intent started and not yet recorded: whose, and which event started it."""

    dfid: str
    root_dfid: str
    agent_id: str
    started_seq: int


MemoryWrite = FactAdded | ConstraintAdded | ConstraintDeactivated | DecisionMade | MemoryQueried


def memory_id(key: str) -> str:
    """The external id of the memory effect of intent ``key`` (its memory event carries the key)."""
    return f"memory:{key}"


def recorded_receipt(memory: MemoryState, key: str) -> Receipt | None:
    """The receipt of the kernel's own effect recorded under ``key`` (memory or beliefs), or None.

    The key in the recorded event is the idempotency record of the kernel's executors:
    ``lookup`` (asked on recovery) and a repeated call find it and answer from it, until
    the intent's outcome is recorded (then the engine never asks again, and the record
    goes: see :meth:`MemoryState.settled`).
    """
    return Receipt(external_id=memory_id(key)) if key in memory.written else None


def started(memory: MemoryState, key: str, what: str) -> Pending:
    """Return intent ``key`` as its committed ExecutionStarted left it pending.

    Raises:
        AdapterError: No such intent was started (``what`` names the executor's effects).
    """
    pending = memory.pending.get(key)
    if pending is None:
        raise AdapterError(f"no started {what} intent {key}")
    return pending


class MemoryState(msgspec.Struct, kw_only=True):
    """The memory projection: plain data, so a snapshot stores and restores it as is.

    ``queried`` maps an agent id or a root DFID to the topics it queried (topic ->
    seq of the latest MemoryQueried); ``written`` maps the intent keys the executor
    recorded to their memory event (the executor's idempotency record); ``pending`` the
    intents started and not yet written.

    Journals whose kernel folds with bounds (``KernelStarted.fold`` >= 2, see
    :mod:`kernel.state.projections`) keep none of these growing with the flows served:
    an intent leaves ``written`` and ``pending`` when its outcome is recorded (or its
    flow ends), a tree's queries leave ``queried`` when its root has ended and one of
    its flows ends, and each agent and tree keeps its newest :data:`QUERIED_TOPICS`.
    Older journals fold exactly as their kernels did (their checkpoints hash it all).
    """

    facts: dict[str, FactRecord] = {}
    constraints: dict[int, ConstraintRecord] = {}
    decisions: int = 0
    queried: dict[str, dict[str, int]] = {}
    written: dict[str, int] = {}
    pending: dict[str, Pending] = {}
    rulebook: Rulebook = msgspec.field(default_factory=Rulebook)
    scores: dict[str, dict[str, ScoreRecord]] = {}
    """Embedding scores recorded for the proposals of each open flow, by text hash."""

    def copy(self) -> MemoryState:
        """Return a copy that later folds do not change (records are immutable)."""
        return MemoryState(
            facts=dict(self.facts),
            constraints=dict(self.constraints),
            decisions=self.decisions,
            queried={who: dict(topics) for who, topics in self.queried.items()},
            written=dict(self.written),
            pending=dict(self.pending),
            rulebook=self.rulebook.copy(),
            scores={dfid: dict(texts) for dfid, texts in self.scores.items()},
        )

    def started(self, key: str, pending: Pending) -> None:
        """Note a memory intent the execution engine started (the executor's work list)."""
        if key not in self.written:
            self.pending[key] = pending

    def settled(self, key: str) -> None:
        """Forget intent ``key``: its outcome is recorded, so no call or lookup asks again."""
        if self.written:
            self.written.pop(key, None)
        if self.pending:
            self.pending.pop(key, None)

    def flow_ended(self, dfid: str, root_dfid: str, root_open: bool) -> None:
        """Forget what flow ``dfid`` of tree ``root_dfid`` kept here, now that it ended.

        Its intents can no longer run. Its tree's queries stop verifying once the tree's
        root has ended too: a flow of that tree still moving must query again (fail
        closed, never a silent allow).
        """
        if self.pending:
            for key in [k for k, p in self.pending.items() if p.dfid == dfid]:
                del self.pending[key]
        if not root_open:
            self.queried.pop(root_dfid, None)

    def apply(self, event: Event, bounded: bool = False) -> None:
        """Fold one memory event (``bounded``: keep the newest queried topics only)."""
        self.recorded(event)
        fold = _FOLDS.get(type(event.payload))
        if fold is not None:
            fold(self, event, bounded)

    def recorded(self, event: Event) -> None:
        """Note the intent key an event carries: the kernel executors' idempotency record."""
        key = getattr(event.payload, "key", "")
        if key:
            self.written[key] = event.seq
            self.pending.pop(key, None)

    def _fact(self, event: Event, bounded: bool) -> None:
        payload = cast(FactAdded, event.payload)
        self.facts[fact_key(payload.tenant, payload.name)] = FactRecord(
            value=payload.value,
            confidence=payload.confidence,
            seq=event.seq,
            agent_id=event.agent_id or "",
            correlation_id=payload.correlation_id,
            tenant=payload.tenant,
        )

    def _constraint(self, event: Event, bounded: bool) -> None:
        payload = cast(ConstraintAdded, event.payload)
        self.constraints[event.seq] = ConstraintRecord(
            seq=event.seq,
            text=payload.text,
            priority=payload.priority,
            triggered_by=payload.triggered_by,
            agent_id=event.agent_id or "",
            correlation_id=payload.correlation_id,
            matcher=payload.matcher,
            synonyms=[list(group) for group in payload.synonyms],
            kinds=list(payload.kinds),
            params=list(payload.params),
            tenant=payload.tenant,
        )

    def _deactivated(self, event: Event, bounded: bool) -> None:
        self.constraints.pop(cast(ConstraintDeactivated, event.payload).constraint, None)

    def _decision(self, event: Event, bounded: bool) -> None:
        self.decisions += 1

    def _queried(self, event: Event, bounded: bool) -> None:
        payload = cast(MemoryQueried, event.payload)
        for who in (event.agent_id or "", payload.correlation_id):
            if who:
                topics = self.queried.setdefault(who, {})
                topics[payload.topic] = event.seq
                if bounded and len(topics) > QUERIED_TOPICS:
                    # By seq, not by dict order: a snapshot restores either order.
                    del topics[min(topics, key=topics.__getitem__)]

    def _rule(self, event: Event, bounded: bool) -> None:
        self.rulebook.apply(event)

    def _scored(self, event: Event, bounded: bool) -> None:
        payload = cast(MeaningScored, event.payload)
        self.scores.setdefault(event.dfid or "", {})[payload.text] = ScoreRecord(
            model=payload.model,
            version=payload.version,
            threshold=payload.threshold,
            scores=dict(payload.scores),
        )

    def facts_of(self, tenant: str) -> dict[str, FactRecord]:
        """Return the facts a flow for ``tenant`` sees, by name: the shared ones and its own.

        Its own fact wins over a shared one of the same name; another tenant's are never
        seen (a flow for no tenant sees the shared ones only).
        """
        facts = {key: fact for key, fact in self.facts.items() if not fact.tenant}
        if tenant:
            cut = len(tenant) + 1
            facts.update(
                (key[cut:], fact) for key, fact in self.facts.items() if fact.tenant == tenant
            )
        return facts

    def seen_by(self, tenant: str) -> MemoryState | TenantMemory:
        """Return the memory ``tenant``'s proposals are judged by: no other tenant's constraints."""
        if not any(c.tenant for c in self.constraints.values()):
            return self
        return TenantMemory(
            constraints={s: c for s, c in self.constraints.items() if c.tenant in ("", tenant)},
            queried=self.queried,
            scores=self.scores,
        )

    def view(self, max_facts: int | None = None, tenant: str = "") -> dict[str, Any]:
        """Return the memory layer a context for ``tenant`` shows: constraints, newest facts."""
        seen = self.facts_of(tenant)
        facts = sorted(seen.items(), key=lambda item: item[1].seq, reverse=True)
        if max_facts is not None:
            facts = facts[:max_facts]
        return {
            "constraints": [
                {"id": c.seq, "text": c.text, "priority": c.priority}
                for c in sorted(self.seen_by(tenant).constraints.values(), key=by_priority)
            ],
            "facts": {name: fact.value for name, fact in sorted(facts)},
        }


def canonical_memory(state: MemoryState) -> Any:
    """The memory's form in the digest: what journals' checkpoints hashed.

    Constraints and rule proposals are keyed by seq (canonical JSON keys are strings).
    Parts added since (rulebook namespaces, the input events seen, embedding scores) are
    left out while empty, so an older journal's checkpoints still verify.
    """
    builtins: dict[str, Any] = msgspec.to_builtins(state, str_keys=True)
    book = builtins["rulebook"]
    for later in ("spaces", "seen"):
        if not book.get(later):
            book.pop(later, None)
    if not builtins.get("scores"):
        builtins.pop("scores", None)
    return builtins


_FOLDS: dict[type[Payload], Callable[[MemoryState, Event, bool], None]] = {
    FactAdded: MemoryState._fact,
    ConstraintAdded: MemoryState._constraint,
    ConstraintDeactivated: MemoryState._deactivated,
    DecisionMade: MemoryState._decision,
    MemoryQueried: MemoryState._queried,
    RuleProposed: MemoryState._rule,
    RuleDecided: MemoryState._rule,
    RuleRetracted: MemoryState._rule,
    MeaningScored: MemoryState._scored,
}
"""What each memory event records (the rule events: in the rulebook it holds)."""


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@functools.lru_cache(maxsize=256)
def iso_time(ns: int) -> str:
    """Return a recorded time (ns since the epoch) as ISO 8601 in UTC, to the microsecond.

    Integer arithmetic only: the same recorded time is the same text on every replay.
    The latest times asked are kept (a compile batch asks for its one time per body).
    """
    moment = _EPOCH + dt.timedelta(microseconds=ns // 1000)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def memory_document(
    ns: str,
    generated_at_ns: int,
    constraints: list[dict[str, Any]],
    facts: dict[str, Any],
    rules: list[dict[str, Any]],
) -> dict[str, Any]:
    """Return the memory JSON an agent is shown: what ``compile_memory`` answers.

    ``ns`` is the rulebook namespace its rules come from, ``generated_at`` the recorded
    time it was compiled at; a context records the document's hash (``memory_hash``),
    so a replay knows which memory its agent saw. ``rules`` is left out when none is shown.
    """
    document: dict[str, Any] = {
        "ns": ns,
        "generated_at": iso_time(generated_at_ns),
        "constraints": constraints,
        "facts": facts,
    }
    if rules:
        document["rules"] = rules
    return document


def compile_memory(
    memory: MemoryState,
    prompt: str,
    *,
    ns: str = DEFAULT_NS,
    k: int = 5,
    generated_at_ns: int = 0,
    max_facts: int | None = None,
    search: RuleSearch | None = None,
) -> dict[str, Any]:
    """Return the memory JSON for a task: the rules of ``ns`` relevant to ``prompt``, constraints,
    facts (the rulebook document's ``compile_memory``; the same document a context shows)."""
    view = memory.view(max_facts)
    rules = [shown_item(r) for r in select(memory.rulebook, prompt, k, search, ns)]
    return memory_document(ns, generated_at_ns, view["constraints"], view["facts"], rules)


# --- the domain ---------------------------------------------------------------------

_OUTCOMES = (ExecutionSucceeded, ExecutionRefused, ExecutionFailed)
_Outcome = ExecutionSucceeded | ExecutionRefused | ExecutionFailed
_ENDINGS = (FlowClosed, FlowAborted, FlowCompensated)


class Memory(Domain):
    """Governed memory as a domain: its writes, the executors' idempotency record, its check.

    Its state (:class:`MemoryState`, saved as ``memory``) also holds the rulebook (folded
    by :class:`~kernel.state.rulebook.Rules`) and the idempotency record of every kernel
    executor that returns events to record (``written``, ``pending``): journals'
    checkpoints hashed them there.
    """

    name = "memory"

    def __init__(self, projections: State) -> None:
        self._projections = projections
        self._recording: frozenset[str] = frozenset()
        self.state = MemoryState()

    def folds(self) -> Mapping[type[Payload], Fold]:
        self._recording = self._projections.recording
        folds: dict[type[Payload], Fold] = dict.fromkeys(MEMORY_WRITES, self._write)
        folds[MeaningScored] = self._write
        # The record of every executor's events (and of the rule proposals it hands over).
        for kinds in self._projections.records.values():
            folds.update((kind, self._recorded) for kind in kinds if kind not in folds)
        folds[RuleProposed] = self._recorded
        folds[ExecutionStarted] = self._started
        folds.update(dict.fromkeys(_OUTCOMES, self._outcome))
        folds.update(dict.fromkeys(_ENDINGS, self._ended))
        return folds

    def saved(self) -> Sequence[Saved]:
        def load(state: MemoryState) -> None:
            self.state = state

        return (
            Saved(
                name="memory",
                type=MemoryState,
                get=lambda: self.state,
                load=load,
                copy=MemoryState.copy,
                canonical=canonical_memory,
            ),
        )

    def check(self, proposal: ProposalRecord, view: View, flow: FlowState) -> Feedback | None:
        if not self.state.constraints and proposal.kind not in CONSTRAINT_KINDS:
            return None  # no constraint to break, and not a write the memory checks
        last = self._projections.last_seq
        seen = self.state.seen_by(view.tenant)
        return check(seen, proposal, view.agent_id, flow.root_dfid, flow.dfid, last)

    def executors(self) -> Mapping[str, ExecutorFactory | str]:
        # Built in: it hands memory events to the engine, rule proposals to the DIM.
        return {MEMORY_ADAPTER: "kernel.memory._pack:executor"}

    def records(self) -> Mapping[str, frozenset[type[Payload]]]:
        return {MEMORY_ADAPTER: MEMORY_WRITES}

    def _write(self, event: Event) -> None:
        self.state.apply(event, bounded=self._projections.fold > 1)

    def _recorded(self, event: Event) -> None:
        self.state.recorded(event)

    def _started(self, event: Event) -> None:
        """Note an intent of a recording executor as pending (the executor's work list)."""
        intent = event.payload.intent  # type: ignore[union-attr]  # ExecutionStarted
        if intent.adapter not in self._recording:
            return
        dfid = event.dfid or ""
        flow = self._projections.current_flow(dfid)
        pending = Pending(
            dfid=dfid,
            root_dfid=flow.root_dfid if flow else dfid,
            agent_id=event.agent_id or "",
            started_seq=event.seq,
        )
        self.state.started(intent.key, pending)

    def _outcome(self, event: Event) -> None:
        # Fold rules 2: an intent's outcome is recorded (an unknown one waits for a human).
        payload: _Outcome = event.payload  # type: ignore[assignment]
        if self._projections.fold > 1 and not getattr(payload, "unknown", False):
            self.state.settled(payload.key)

    def _ended(self, event: Event) -> None:
        """Let the memory forget what a flow that just ended kept in it (fold rules 2).

        Asked at the ending event itself, live and in replay alike: what the memory keeps
        may not depend on how events were batched into commits.
        """
        memory = self.state
        if memory.scores:
            # A flow's recorded scores judge only its own proposals.
            memory.scores.pop(event.dfid or "", None)
        if self._projections.fold < 2 or not (memory.pending or memory.queried):
            return
        dfid = event.dfid or ""
        state = self._projections.current_flow(dfid)
        if state is None:
            return
        tree = self._projections.current_flow(state.root_dfid)
        memory.flow_ended(dfid, state.root_dfid, root_open=tree is not None and not tree.terminal)


class Rules(Domain):
    """The rulebook as a domain: rule events, and the rules each open flow was shown.

    Its state is the :class:`~kernel.state.rulebook.Rulebook` inside the memory's (saved
    there, where journals' checkpoints hashed it), so it comes after :class:`Memory`.
    It judges no proposal (citations are recorded, never judged: kernel.dim) and has no
    executor: the DIM writes rule events; agents' rule proposals reach it through the
    memory executor.
    """

    name = "rules"

    def __init__(self, projections: State) -> None:
        self._memory = projections.domain(Memory)

    def folds(self) -> Mapping[type[Payload], Fold]:
        return {
            RuleProposed: self._rule,
            RuleDecided: self._rule,
            RuleRetracted: self._rule,
            ContextCompiled: self._shown,
            # What citations are checked against goes when its flow ends.
            FlowClosed: self._ended,
            FlowAborted: self._ended,
            FlowCompensated: self._ended,
        }

    def saved(self) -> Sequence[Saved]:
        return ()

    def _rule(self, event: Event) -> None:
        self._memory.state.rulebook.apply(event)

    def _shown(self, event: Event) -> None:
        # The rules this attempt showed: what its citations are checked against.
        rules = event.payload.rules  # type: ignore[union-attr]  # ContextCompiled
        self._memory.state.rulebook.context_shown(event.dfid or "", rules)

    def _ended(self, event: Event) -> None:
        self._memory.state.rulebook.shown.pop(event.dfid or "", None)
