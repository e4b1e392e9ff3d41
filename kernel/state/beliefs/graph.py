"""The belief graph: workspaces per task and the canonical memory graph, folded from events.

One store holds every object the seed names (sources, observations, entities,
propositions, edges of the eight types, belief states, aliases, promotion events,
episodes); each proposition and entity carries its ``layer``: ``workspace`` (the
transient, task-scoped epistemic workspace), ``canonical`` (promoted at a
consolidation), ``archived`` or ``discarded``. A task's workspace is the set of
its propositions still in the workspace layer; consolidation moves them out (the
carried-over ones stay), which is how the workspace is dropped without erasing
history.

Plain data (msgspec Structs, dicts and lists): a snapshot stores and restores it
as is, and ``copy`` is a round trip through msgpack. Belief states are a fold:
:meth:`BeliefGraph.assess` scores a proposition from its recorded evidence at a
recorded time, and the state the graph holds is the one the latest
PropositionTransitioned recorded, which the executor derived with the same
function (:mod:`kernel.state.beliefs.effects`), so replay lands on the same
states. ``dirk verify`` checks it: it refolds and compares digests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import msgspec

from kernel.core.events import (
    ConsolidationRecorded,
    EntityCandidateRecorded,
    EpisodeArchived,
    Event,
    EvidenceAttached,
    ObservationRecorded,
    Payload,
    PropositionProposed,
    PropositionTransitioned,
    SourceRegistered,
    TestResultIngested,
)
from kernel.state.beliefs.scoring import (
    Assessment,
    BeliefState,
    Evidence,
    Volatility,
    assess,
    holds,
)

EDGE_TYPES = (
    "supports",
    "contradicts",
    "about",
    "predicts",
    "tested_by",
    "derived_from",
    "possible_same_as",
    "supersedes",
)
"""The eight relationship types of the seed (section 8.6)."""

WORKSPACE = "workspace"
CANONICAL = "canonical"
ARCHIVED = "archived"
DISCARDED = "discarded"


class SourceRecord(msgspec.Struct, kw_only=True):
    source: str
    source_type: str
    group: str
    reliability: int
    domain_tags: list[str] = []
    correction_rate: int = 0
    seq: int = 0


class ObservationRecord(msgspec.Struct, kw_only=True):
    observation: str
    source: str
    group: str
    task: str
    session: str = ""
    raw_payload: str = ""
    test: str = ""
    at_ns: int = 0
    seq: int = 0
    spawned: int = 0
    """Propositions derived from it (the workspace spawns a limited number)."""


class EntityRecord(msgspec.Struct, kw_only=True):
    entity: str
    name: str
    entity_type: str = ""
    aliases: list[str] = []
    possible_same_as: list[str] = []
    task: str = ""
    layer: str = WORKSPACE
    created_ns: int = 0
    touched_ns: int = 0
    seq: int = 0


class Edge(msgspec.Struct, frozen=True, kw_only=True):
    """One relationship row: ``type`` is one of :data:`EDGE_TYPES`."""

    type: str
    source: str
    target: str
    seq: int


class TransitionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One recorded state change, and the evidence (id and seq) that caused it."""

    seq: int
    from_state: str
    to_state: str
    cause: str
    evidence: str
    evidence_seq: int
    confidence: int
    support: int
    contradiction: int
    support_groups: int
    contradiction_groups: int
    freshness: int
    at_ns: int


class PropositionRecord(msgspec.Struct, kw_only=True):
    proposition: str
    text: str
    proposition_class: str = "descriptive"
    volatility: str = "medium"
    about: list[str] = []
    derived_from: list[str] = []
    supersedes: str = ""
    task: str = ""
    layer: str = WORKSPACE
    created_ns: int = 0
    seq: int = 0
    support: list[Evidence] = []
    contradiction: list[Evidence] = []
    observations: list[str] = []
    """Observations attached as evidence (each at most once)."""
    state: str = BeliefState.TENTATIVE
    held: bool = False
    """Accepted or provisional at some recorded transition (deprecation needs it)."""
    failed_test: bool = False
    refuted_against: list[str] = []
    """The competing propositions of its latest ingested test, if that test failed:
    the rivals it was refuted against (its support no longer contradicts them)."""
    tests: list[str] = []
    contested_updates: int = 0
    """Consecutive evidence updates that left it contested."""
    unresolved: int = 0
    """Contradictions attached since its latest ingested test."""
    transitions: list[TransitionRecord] = []


class TestRecord(msgspec.Struct, kw_only=True):
    """A proposed discriminating test: its intent key, and the adapter's recorded outcome."""

    __test__ = False  # not a pytest class

    test: str
    key: str
    proposition: str
    competing: list[str] = []
    impact: str = "high"
    cost: str = "0"
    method: str = ""
    adapter: str = ""
    task: str = ""
    seq: int = 0
    outcome: str = ""
    """passed, failed or inconclusive once its adapter's receipt is recorded."""
    ingested: bool = False


class Promotion(msgspec.Struct, frozen=True, kw_only=True):
    proposition: str
    consolidation: str
    seq: int


class EpisodeRecord(msgspec.Struct, kw_only=True):
    episode: str
    task: str
    summary: str = ""
    observations: int = 0
    propositions: dict[str, str] = {}
    seq: int = 0


class WorkspaceRecord(msgspec.Struct, kw_only=True):
    """A task's workspace counters: observations since its last consolidation."""

    task: str
    observations: int = 0
    consolidations: int = 0


class _Owned(Protocol):
    """A record of the graph that a task recorded (its tenant's, if the task is one's)."""

    @property
    def task(self) -> str: ...


_R = TypeVar("_R", bound=_Owned)


class BeliefGraph(msgspec.Struct, kw_only=True):
    """The governed-beliefs projection (see the module docstring)."""

    sources: dict[str, SourceRecord] = {}
    observations: dict[str, ObservationRecord] = {}
    entities: dict[str, EntityRecord] = {}
    names: dict[str, list[str]] = {}
    """Entities by casefolded name or alias (aliases; an ambiguous name lists several)."""
    propositions: dict[str, PropositionRecord] = {}
    edges: list[Edge] = []
    tests: dict[str, TestRecord] = {}
    test_keys: dict[str, str] = {}
    """The intent key of each proposed test -> its test id."""
    evidence: dict[str, int] = {}
    """Evidence, test and consolidation ids -> the seq of the event that recorded them."""
    promotions: list[Promotion] = []
    workspaces: dict[str, WorkspaceRecord] = {}
    consolidations: list[ConsolidationRecorded] = []
    episodes: dict[str, EpisodeRecord] = {}
    refuters: dict[str, list[str]] = {}
    """Proposition -> the rivals a failed discriminating test refuted against it."""
    latest_ns: int = 0
    """The latest recorded time of any belief event: the "now" the DIM judges belief
    proposals at (never its own clock, so ``dirk verify --verdicts`` judges alike)."""
    tenants: dict[str, str] = {}
    """Each task (root DFID) whose flows act for a declared tenant -> that tenant; a task
    absent is shared (kernel.state.principals.memory_tenant, as memory's facts are)."""

    def empty(self) -> bool:
        """Whether nothing was ever recorded (old journals: the digest leaves it out)."""
        return not (self.sources or self.observations or self.tests or self.entities)

    def copy(self) -> BeliefGraph:
        """Return a deep copy later folds do not change."""
        return msgspec.msgpack.decode(msgspec.msgpack.encode(self), type=BeliefGraph)

    # --- reading -------------------------------------------------------------------

    def assess(self, proposition: str, now_ns: int) -> Assessment:
        """Score ``proposition`` from its recorded evidence at the recorded time ``now_ns``."""
        p = self.propositions[proposition]
        return assess(
            p.support,
            p.contradiction,
            volatility=Volatility(p.volatility),
            created_ns=p.created_ns,
            now_ns=now_ns,
            failed_test=p.failed_test,
            held=p.held,
            refuted=self.refuted(proposition),
        )

    def refuted(self, proposition: str) -> frozenset[str]:
        """The observations whose contradiction of ``proposition`` no longer counts.

        Each supports a rival whose latest ingested discriminating test, naming
        ``proposition`` among its competing propositions, failed: the testimony
        against it was the rival's, and the test refuted the rival. The evidence
        and its edges stay recorded (docs/beliefs.md).
        """
        found: set[str] = set()
        for rival in self.refuters.get(proposition, []):
            r = self.propositions.get(rival)
            if r is not None:
                found.update(e.observation for e in r.support if e.observation)
        return frozenset(found)

    def workspace(self, task: str) -> list[str]:
        """The propositions in ``task``'s workspace, in the order they were proposed."""
        return [
            p.proposition
            for p in self.propositions.values()
            if p.task == task and p.layer == WORKSPACE
        ]

    def seen_by(self, tenant: str) -> BeliefGraph:
        """The graph as a flow for ``tenant`` reads it: what shared tasks and its own recorded.

        Another tenant's observations, entities, propositions, tests and episodes are
        not in it (sources, being no one's, are). A view to read, never to fold into;
        the graph itself when no task was ever a tenant's (nothing to hide, nothing paid).
        """
        if not self.tenants:
            return self
        owners = self.tenants

        def seen(records: dict[str, _R]) -> dict[str, _R]:
            return {k: v for k, v in records.items() if owners.get(v.task, tenant) == tenant}

        entities = seen(self.entities)
        names = {n: [e for e in ids if e in entities] for n, ids in self.names.items()}
        return msgspec.structs.replace(
            self,
            observations=seen(self.observations),
            entities=entities,
            names={n: ids for n, ids in names.items() if ids},
            propositions=seen(self.propositions),
            tests=seen(self.tests),
            episodes=seen(self.episodes),
        )

    def named(self, name: str) -> list[str]:
        """The entities bearing ``name`` as canonical name or alias."""
        return list(self.names.get(fold_name(name), []))

    # --- folding -------------------------------------------------------------------

    def apply(self, event: Event) -> None:
        """Fold one belief event."""
        at_ns = getattr(event.payload, "at_ns", 0)
        if at_ns > self.latest_ns:
            self.latest_ns = at_ns
        fold = _FOLDS.get(type(event.payload))
        if fold is not None:
            fold(self, event.payload, event.seq)

    def _source(self, e: SourceRegistered, seq: int) -> None:
        self.sources[e.source] = SourceRecord(
            source=e.source,
            source_type=e.source_type,
            group=e.independence_group or e.source,
            reliability=e.reliability,
            domain_tags=list(e.domain_tags),
            correction_rate=e.correction_rate,
            seq=seq,
        )

    def _observation(self, e: ObservationRecorded, seq: int) -> None:
        self.observations[e.observation] = ObservationRecord(
            observation=e.observation,
            source=e.source,
            group=e.independence_group or e.source,
            task=e.task,
            session=e.session,
            raw_payload=e.raw_payload,
            test=e.test,
            at_ns=e.at_ns,
            seq=seq,
        )
        self.evidence[e.observation] = seq
        space = self.workspaces.setdefault(e.task, WorkspaceRecord(task=e.task))
        space.observations += 1

    def _ingested(self, e: TestResultIngested, seq: int) -> None:
        test = self.tests.get(e.test)
        if test is not None:
            test.ingested = True
        self.evidence[f"test:{e.test}"] = seq
        p = self.propositions.get(e.proposition)
        if p is not None:
            p.failed_test = e.outcome == "failed"
            p.unresolved = 0
            self._refute(p, test.competing if test is not None and p.failed_test else [])

    def _episode(self, e: EpisodeArchived, seq: int) -> None:
        self.episodes[e.episode] = EpisodeRecord(
            episode=e.episode,
            task=e.task,
            summary=e.summary,
            observations=e.observations,
            propositions=dict(e.propositions),
            seq=seq,
        )

    def test_started(self, key: str, params: dict[str, object], adapter: str, seq: int) -> None:
        """Note a propose_test intent started: the test exists, its adapter runs it."""
        test = str(params.get("test", ""))
        proposition = str(params.get("proposition", ""))
        if not test or test in self.tests:
            return
        competing = params.get("competing", [])
        self.tests[test] = TestRecord(
            test=test,
            key=key,
            proposition=proposition,
            competing=[str(c) for c in competing] if isinstance(competing, list) else [],
            impact=str(params.get("action_impact", "high")),
            cost=str(params.get("cost", "0")),
            method=str(params.get("method", "")),
            adapter=adapter,
            task=str(params.get("task", "")),
            seq=seq,
        )
        self.test_keys[key] = test
        self.evidence.setdefault(f"proposed:{test}", seq)
        p = self.propositions.get(proposition)
        if p is not None:
            p.tests.append(test)
            self.edges.append(Edge(type="tested_by", source=proposition, target=test, seq=seq))

    def test_done(self, key: str, detail: dict[str, object]) -> None:
        """Note a test's recorded outcome (the adapter's receipt detail ``outcome``)."""
        test = self.tests.get(self.test_keys.get(key, ""))
        if test is not None and not test.outcome:
            outcome = str(detail.get("outcome", ""))
            test.outcome = outcome if outcome in OUTCOMES else "inconclusive"

    def _entity(self, e: EntityCandidateRecorded, seq: int) -> None:
        if e.linked_to and e.linked_to in self.entities:
            entity = self.entities[e.linked_to]
            entity.touched_ns = e.at_ns
            if fold_name(e.name) not in {fold_name(n) for n in (entity.name, *entity.aliases)}:
                entity.aliases.append(e.name)
                self._name(e.name, entity.entity)
            return
        self.entities[e.entity] = EntityRecord(
            entity=e.entity,
            name=e.name,
            entity_type=e.entity_type,
            aliases=list(e.aliases),
            possible_same_as=list(e.possible_same_as),
            task=e.task,
            created_ns=e.at_ns,
            touched_ns=e.at_ns,
            seq=seq,
        )
        for name in (e.name, *e.aliases):
            self._name(name, e.entity)
        for other in e.possible_same_as:
            if other in self.entities and e.entity not in self.entities[other].possible_same_as:
                self.entities[other].possible_same_as.append(e.entity)
            self.edges.append(Edge(type="possible_same_as", source=e.entity, target=other, seq=seq))

    def _refute(self, p: PropositionRecord, rivals: list[str]) -> None:
        """Make ``rivals`` the propositions ``p`` is refuted against (its latest test)."""
        for rival in p.refuted_against:
            left = [r for r in self.refuters.get(rival, []) if r != p.proposition]
            if left:
                self.refuters[rival] = left
            else:
                self.refuters.pop(rival, None)
        p.refuted_against = [r for r in dict.fromkeys(rivals) if r != p.proposition]
        for rival in p.refuted_against:
            self.refuters.setdefault(rival, []).append(p.proposition)

    def _name(self, name: str, entity: str) -> None:
        bearers = self.names.setdefault(fold_name(name), [])
        if entity not in bearers:
            bearers.append(entity)

    def _proposition(self, e: PropositionProposed, seq: int) -> None:
        self.propositions[e.proposition] = PropositionRecord(
            proposition=e.proposition,
            text=e.text,
            proposition_class=e.proposition_class,
            volatility=e.volatility,
            about=list(e.about),
            derived_from=list(e.derived_from),
            supersedes=e.supersedes,
            task=e.task,
            created_ns=e.at_ns,
            seq=seq,
        )
        self.evidence[f"proposed:{e.proposition}"] = seq
        for observation in e.derived_from:
            found = self.observations.get(observation)
            if found is not None:
                found.spawned += 1
            self.edges.append(
                Edge(type="derived_from", source=e.proposition, target=observation, seq=seq)
            )
        for entity in e.about:
            self.edges.append(Edge(type="about", source=e.proposition, target=entity, seq=seq))
            if entity in self.entities:
                self.entities[entity].touched_ns = e.at_ns
        for target in e.predicts:
            self.edges.append(Edge(type="predicts", source=e.proposition, target=target, seq=seq))
        if e.supersedes:
            self.edges.append(
                Edge(type="supersedes", source=e.proposition, target=e.supersedes, seq=seq)
            )

    def _evidence(self, e: EvidenceAttached, seq: int) -> None:
        p = self.propositions.get(e.proposition)
        self.evidence[e.evidence] = seq
        if p is None:
            return
        item = Evidence(
            group=e.independence_group or e.source,
            reliability=e.reliability,
            at_ns=e.at_ns,
            seq=seq,
            observation=e.observation,
        )
        if e.stance == "contradicts":
            p.contradiction.append(item)
            p.unresolved += 1
        else:
            p.support.append(item)
        p.observations.append(e.observation)
        edge = "contradicts" if e.stance == "contradicts" else "supports"
        self.edges.append(Edge(type=edge, source=e.observation, target=e.proposition, seq=seq))
        now = self.assess(e.proposition, e.at_ns)
        p.contested_updates = p.contested_updates + 1 if now.state is BeliefState.CONTESTED else 0

    def _transition(self, e: PropositionTransitioned, seq: int) -> None:
        p = self.propositions.get(e.proposition)
        if p is None:
            return
        p.state = e.to_state
        p.held = p.held or holds(BeliefState(e.to_state))
        p.transitions.append(
            TransitionRecord(
                seq=seq,
                from_state=e.from_state,
                to_state=e.to_state,
                cause=e.cause,
                evidence=e.evidence,
                evidence_seq=self.evidence.get(e.evidence, 0),
                confidence=e.confidence,
                support=e.support,
                contradiction=e.contradiction,
                support_groups=e.support_groups,
                contradiction_groups=e.contradiction_groups,
                freshness=e.freshness,
                at_ns=e.at_ns,
            )
        )

    def _consolidation(self, e: ConsolidationRecorded, seq: int) -> None:
        self.consolidations.append(e)
        self.evidence[e.consolidation] = seq
        for proposition in e.promoted:
            p = self.propositions.get(proposition)
            if p is not None:
                p.layer = CANONICAL
                for entity in p.about:
                    if entity in self.entities:
                        self.entities[entity].layer = CANONICAL
            self.promotions.append(
                Promotion(proposition=proposition, consolidation=e.consolidation, seq=seq)
            )
        for archived in e.archived:
            if archived.proposition in self.propositions:
                self.propositions[archived.proposition].layer = ARCHIVED
        for proposition in e.discarded:
            if proposition in self.propositions:
                self.propositions[proposition].layer = DISCARDED
        space = self.workspaces.setdefault(e.task, WorkspaceRecord(task=e.task))
        space.observations = 0
        space.consolidations += 1


_FOLDS: dict[type[Payload], Callable[[BeliefGraph, Any, int], None]] = {
    SourceRegistered: BeliefGraph._source,
    ObservationRecorded: BeliefGraph._observation,
    EntityCandidateRecorded: BeliefGraph._entity,
    PropositionProposed: BeliefGraph._proposition,
    EvidenceAttached: BeliefGraph._evidence,
    TestResultIngested: BeliefGraph._ingested,
    PropositionTransitioned: BeliefGraph._transition,
    ConsolidationRecorded: BeliefGraph._consolidation,
    EpisodeArchived: BeliefGraph._episode,
}
"""What each belief event records (its payload and seq)."""

OUTCOMES = ("passed", "failed", "inconclusive")


def fold_name(name: str) -> str:
    """The form names and texts are compared in: casefolded, whitespace collapsed."""
    return " ".join(name.casefold().split()).rstrip(".")
