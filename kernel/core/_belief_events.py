"""Events of governed beliefs: observations, sources, entities, propositions, evidence, tests,
transitions, consolidation and episodes (kernel.beliefs; docs/beliefs.md).

The beliefs executor returns them in its receipt and the execution engine records
them with the intent's ExecutionSucceeded, in one append. Every one carries the
intent ``key`` that wrote it (the executor's idempotency record), the ``task``
(the root DFID of the flow that proposed it: the workspace it belongs to) and
``at_ns``, the kernel clock's time when it was made: the recorded "now" every
score of it is computed at. Scores are integers in micro-units (1_000_000 = 1.0).
"""

from __future__ import annotations

from typing import Any

from kernel.core._records import Payload, Record


class SourceRegistered(Payload, frozen=True, tag=True):
    """A source seen for the first time: its independence group and hand-set reliability."""

    source: str
    source_type: str = ""
    independence_group: str = ""
    reliability: int = 1_000_000
    domain_tags: list[str] = []
    correction_rate: int = 0
    task: str = ""
    at_ns: int = 0
    key: str = ""


class ObservationRecorded(Payload, frozen=True, tag=True):
    """An immutable input: what arrived, from which source, in which session and task.

    ``observation`` is its id (the intent key's, or the test's); ``test`` names the
    test whose result it is (execute_test_result_ingest), empty otherwise.
    """

    observation: str
    source: str
    source_type: str = ""
    independence_group: str = ""
    session: str = ""
    raw_payload: str = ""
    parsed_payload: dict[str, Any] = {}
    ingest_status: str = "accepted"
    test: str = ""
    task: str = ""
    at_ns: int = 0
    key: str = ""


class EntityCandidateRecorded(Payload, frozen=True, tag=True):
    """A cheap entity candidate, or an alias linked to an existing entity (never a hard merge).

    ``linked_to`` is the entity the name was linked to as an alias (exact, unique
    match); ``possible_same_as`` the entities the name is ambiguous with.
    """

    entity: str
    name: str
    entity_type: str = ""
    linked_to: str = ""
    aliases: list[str] = []
    possible_same_as: list[str] = []
    observation: str = ""
    task: str = ""
    at_ns: int = 0
    key: str = ""


class PropositionProposed(Payload, frozen=True, tag=True):
    """A claim about the world, traceable to the observations it is ``derived_from``."""

    proposition: str
    text: str
    proposition_class: str = "descriptive"
    volatility: str = "medium"
    about: list[str] = []
    predicts: list[str] = []
    supersedes: str = ""
    derived_from: list[str] = []
    task: str = ""
    at_ns: int = 0
    key: str = ""


class EvidenceAttached(Payload, frozen=True, tag=True):
    """An observation supports or contradicts a proposition (``stance``), weighted by its source.

    ``evidence`` is its id (transitions name it); ``reliability`` is the source's,
    in micro-units, as it stood when attached.
    """

    evidence: str
    proposition: str
    observation: str
    stance: str = "supports"
    source: str = ""
    independence_group: str = ""
    reliability: int = 1_000_000
    task: str = ""
    at_ns: int = 0
    key: str = ""


class TestResultIngested(Payload, frozen=True, tag=True):
    """The recorded result of a discriminating test re-entered as an observation.

    ``test`` is the key of the propose_test intent its adapter executed; ``outcome``
    is the adapter's (passed, failed or inconclusive), read from the recorded receipt.
    """

    __test__ = False  # not a pytest class

    test: str
    proposition: str
    outcome: str
    observation: str = ""
    task: str = ""
    at_ns: int = 0
    key: str = ""


class PropositionTransitioned(Payload, frozen=True, tag=True):
    """A proposition's state changed; ``evidence`` names what caused it.

    ``cause`` is ``proposed``, ``supports``, ``contradicts``, ``test``,
    ``consolidation`` or ``time`` (a later recorded time, for decay); ``evidence``
    is the id of the evidence, test, observation or consolidation that caused it.
    The scores are the assessment at ``at_ns`` that produced ``to_state``.
    """

    proposition: str
    from_state: str
    to_state: str
    cause: str
    evidence: str = ""
    confidence: int = 0
    support: int = 0
    contradiction: int = 0
    support_groups: int = 0
    contradiction_groups: int = 0
    freshness: int = 0
    task: str = ""
    at_ns: int = 0
    key: str = ""


class Archived(Record, frozen=True):
    """A proposition archived at consolidation, with the reason code why."""

    proposition: str
    reason: str


class ConsolidationRecorded(Payload, frozen=True, tag=True):
    """A workspace consolidated: what was promoted, carried over, archived and discarded.

    ``trigger`` is ``task_boundary`` (request_consolidation, archive_episode) or
    ``cadence`` (every 25 observations). The workspace of ``task`` is dropped;
    the carried-over propositions stay in it, unresolved.
    """

    consolidation: str
    trigger: str
    promoted: list[str] = []
    carried_over: list[str] = []
    archived: list[Archived] = []
    discarded: list[str] = []
    observations: int = 0
    task: str = ""
    at_ns: int = 0
    key: str = ""


class EpisodeArchived(Payload, frozen=True, tag=True):
    """A task's episode summarised into a compact archival record."""

    episode: str
    summary: str = ""
    observations: int = 0
    propositions: dict[str, str] = {}
    """Each proposition of the episode and its state when archived."""
    task: str = ""
    at_ns: int = 0
    key: str = ""


class Applied(Record, frozen=True):
    """The form a transformed proposal was applied in: its kind and parameters, and why.

    Recorded on ProposalAccepted beside the submitted form (ProposalSubmitted).
    """

    kind: str
    params: dict[str, Any] = {}
    reason: str = ""


BELIEF_PAYLOADS = (
    SourceRegistered,
    ObservationRecorded,
    EntityCandidateRecorded,
    PropositionProposed,
    EvidenceAttached,
    TestResultIngested,
    PropositionTransitioned,
    ConsolidationRecorded,
    EpisodeArchived,
)
