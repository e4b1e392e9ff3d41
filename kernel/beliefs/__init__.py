"""Governed beliefs: observations, propositions and belief states derived from evidence.

The API guide (docs/beliefs.md has the design and every decision on the seed's holes).

**The pure model** (no I/O, no clock, deterministic; use it directly for baselines
and ablations). Every score is an ``int`` in micro-units, ``SCALE`` = 1_000_000 = 1.0::

    from kernel.beliefs import Evidence, Volatility, assess, show, HOUR_NS

    support = [Evidence(group="wire", at_ns=0), Evidence(group="registry", at_ns=0)]
    a = assess(support, [], volatility=Volatility.MEDIUM, created_ns=0, now_ns=72 * HOUR_NS)
    a.state, show(a.confidence)        # (BeliefState.ACCEPTED, "0.800000")

``assess(support, contradiction, *, volatility, created_ns, now_ns, failed_test=False,
held=False, refuted=()) -> Assessment`` (state, confidence, support, contradiction, support_groups,
contradiction_groups, freshness, at_ns). Its parts: ``freshness(age_ns, volatility)``,
``group_weight(reliabilities)``, ``weight(evidence) -> (score, groups)``,
``diversity(groups)``, ``staleness(freshness, volatility)``, ``confidence(...)``,
``classify(...)`` (the state machine in ``PRECEDENCE`` order), ``promotable(assessment)``,
``triggers(...)``, ``suppressed(impact, cost, confidence)``, ``benefit(confidence)``;
``micro("0.8") -> 800_000`` and ``show(800_000) -> "0.800000"``. Every v0.1q constant
is a name of ``scoring`` (``scoring.CARRY_OVER_CAP``, ``scoring.HALF_LIFE_HOURS``...).
``held`` says the proposition was accepted or provisional before (deprecation needs it);
``refuted`` names observations whose contradiction no longer counts (each supports a rival
a failed discriminating test refuted: ``BeliefGraph.refuted(name)``).

**The kernel part.** Load ``GOVERNANCE_PACK`` and give the agent its kinds as
capabilities (``KINDS``); give the kernel a ``belief_test`` adapter if agents propose
tests (``kernel.testing.ScriptedTests`` is deterministic). Each kind is one tool:

- ``governance.record_observation`` (observation, source, independence_group,
  reliability "0..1" on first sight of the source, source_type, session, raw_payload,
  parsed_payload, task)
- ``governance.create_or_link_entity_candidate`` (name, observation, entity, alias_of)
- ``governance.propose_proposition`` (proposition, text, derived_from, volatility,
  proposition_class, about, predicts, supersedes): its observations become its support;
  a duplicate (same text and subjects) is TRANSFORMED into attach_support
- ``governance.attach_support`` / ``governance.attach_contradiction`` (proposition,
  observation)
- ``governance.propose_test`` (test, proposition, competing, action_impact, cost, method):
  refused unless a trigger holds; run by the ``belief_test`` adapter
- ``governance.execute_test_result_ingest`` (test): the recorded result as an observation
- ``governance.request_consolidation`` / ``governance.archive_episode`` (episode, summary)

Every kind takes ``task`` (the workspace; default: the flow's root DFID). Refusals carry
fixed reason codes (MISSING_PROVENANCE, DIRECT_CANONICAL_WRITE_FORBIDDEN,
SCHEMA_INVALID, CONSTRAINT_VIOLATION, UNAUTHORIZED). A transformed verdict is
accepted, with ``ProposalAccepted.applied`` (an ``Applied``: kind, params, reason).

**Without a kernel.** ``Workbench().propose(kind, params, task=..., now_ns=...) -> Call``
(outcome accepted / transformed / rejected, feedback, applied, events) runs the same
schema, beliefs layer, transform, effects and fold on an in-memory ``BeliefGraph``
(``bench.graph``); ``bench.record_test(test, outcome)`` stands in for the test adapter.

**Reading the result.** ``kernel.projections.beliefs`` (or ``kernel.audit.state_at(db,
seq).beliefs``) is a ``BeliefGraph``: ``propositions`` (``PropositionRecord``: state,
layer workspace/canonical/archived/discarded, support, contradiction, transitions),
``observations``, ``sources``, ``entities`` (aliases, possible_same_as), ``edges``,
``tests``, ``promotions``, ``consolidations``, ``episodes``; ``graph.assess(name, now_ns)``.
The events (kernel.audit.events) are ``ObservationRecorded``, ``SourceRegistered``,
``EntityCandidateRecorded``, ``PropositionProposed``, ``EvidenceAttached``,
``TestResultIngested``, ``PropositionTransitioned`` (from_state, to_state, cause,
evidence, the scores), ``ConsolidationRecorded`` and ``EpisodeArchived``.
"""

from kernel.beliefs._bench import Call, Workbench
from kernel.beliefs._pack import (
    GOVERNANCE_PACK,
    ArchiveEpisode,
    AttachContradiction,
    AttachSupport,
    BeliefsExecutor,
    IngestTestResult,
    LinkEntityCandidate,
    ProposeProposition,
    ProposeTest,
    RecordObservation,
    RequestConsolidation,
)
from kernel.core.events import (
    Applied,
    Archived,
    ConsolidationRecorded,
    EntityCandidateRecorded,
    EpisodeArchived,
    EvidenceAttached,
    ObservationRecorded,
    PropositionProposed,
    PropositionTransitioned,
    SourceRegistered,
    TestResultIngested,
)
from kernel.state.beliefs import BELIEFS_ADAPTER, TEST_ADAPTER, scoring
from kernel.state.beliefs.effects import KINDS, effects
from kernel.state.beliefs.gate import check, transform
from kernel.state.beliefs.graph import (
    EDGE_TYPES,
    BeliefGraph,
    Edge,
    EntityRecord,
    ObservationRecord,
    PropositionRecord,
    SourceRecord,
    TestRecord,
    TransitionRecord,
)
from kernel.state.beliefs.scoring import (
    HOUR_NS,
    PRECEDENCE,
    SCALE,
    Assessment,
    BeliefState,
    Evidence,
    Impact,
    Volatility,
    assess,
    benefit,
    classify,
    confidence,
    diversity,
    freshness,
    group_weight,
    micro,
    promotable,
    show,
    staleness,
    suppressed,
    triggers,
    weight,
)

__all__ = [
    "BELIEFS_ADAPTER",
    "EDGE_TYPES",
    "GOVERNANCE_PACK",
    "HOUR_NS",
    "KINDS",
    "PRECEDENCE",
    "SCALE",
    "TEST_ADAPTER",
    "Applied",
    "ArchiveEpisode",
    "Archived",
    "Assessment",
    "AttachContradiction",
    "AttachSupport",
    "BeliefGraph",
    "BeliefState",
    "BeliefsExecutor",
    "Call",
    "ConsolidationRecorded",
    "Edge",
    "EntityCandidateRecorded",
    "EntityRecord",
    "EpisodeArchived",
    "Evidence",
    "EvidenceAttached",
    "Impact",
    "IngestTestResult",
    "LinkEntityCandidate",
    "ObservationRecord",
    "ObservationRecorded",
    "ProposeProposition",
    "ProposeTest",
    "PropositionProposed",
    "PropositionRecord",
    "PropositionTransitioned",
    "RecordObservation",
    "RequestConsolidation",
    "SourceRecord",
    "SourceRegistered",
    "TestRecord",
    "TestResultIngested",
    "TransitionRecord",
    "Volatility",
    "Workbench",
    "assess",
    "benefit",
    "check",
    "classify",
    "confidence",
    "diversity",
    "effects",
    "freshness",
    "group_weight",
    "micro",
    "promotable",
    "scoring",
    "show",
    "staleness",
    "suppressed",
    "transform",
    "triggers",
    "weight",
]
