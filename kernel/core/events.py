"""The event envelope and every event type the kernel records.

Every step of every DecisionFlow is one of these, appended to the journal.
Events are frozen, tagged msgspec Structs: the tag is the event's ``type``.
New fields always get defaults, so journals written by older kernels still
decode.

The hash of an event covers its canonical bytes (JSON with sorted keys, no
insignificant whitespace, empty defaults omitted) chained to the hash of the
event before it, so editing, dropping or reordering any recorded event breaks
the chain from that point on.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Any, TypeVar

import msgspec

from kernel.core._approval_events import (
    ApprovalSuperseded,
    ApprovalVoted,
    GrantIssued,
    GrantRevoked,
    GrantUsed,
    GrantVoted,
    QuorumRule,
    ReasoningCharged,
    WebhookDelivered,
    WebhookFailed,
)
from kernel.core._belief_events import (
    BELIEF_PAYLOADS,
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
from kernel.core._drift_events import DriftBreached
from kernel.core._flow_events import (
    ActorRestarted,
    AgentRefused,
    AgentRegistered,
    AgentStatusChanged,
    ApprovalExpired,
    CompensationFailed,
    CompensationStarted,
    CompensationSucceeded,
    ContextCompiled,
    CredentialIssued,
    DecisionRefused,
    DuplicateSuppressed,
    ExecutionFailed,
    ExecutionRefused,
    ExecutionRetried,
    ExecutionStarted,
    ExecutionSucceeded,
    FlowAborted,
    FlowClosed,
    FlowCompensated,
    FlowCreated,
    FlowDirty,
    FlowEscalated,
    HumanDecided,
    KernelStarted,
    KernelStopped,
    MessageDeadLettered,
    ProposalAccepted,
    ProposalRejected,
    ProposalSubmitted,
    ResourceReleased,
    ResourceReserved,
    SubmissionRefused,
    TriggerFired,
)
from kernel.core._governance_events import (
    AmendmentRefused,
    ArtifactsCollected,
    ArtifactStored,
    CheckpointKeyChanged,
    CitationsChecked,
    ConstraintAdded,
    ConstraintAdvisory,
    ConstraintDeactivated,
    DecisionMade,
    FactAdded,
    FlowFlagged,
    InputRefused,
    LimitAmended,
    MeaningScored,
    MemoryQueried,
    OperatorKeyRevoked,
    OperatorKeyTrusted,
    PackLoaded,
    ProjectionCheckpoint,
    RequestVerified,
    RuleDecided,
    RuleProposed,
    RuleRetracted,
    RuleSource,
    SubjectErased,
)
from kernel.core._principal_events import (
    PRINCIPAL_PAYLOADS,
    DecidedWithoutJournal,
    Delegated,
    FailMode,
    Layer,
    Member,
    OnBehalf,
    Permission,
    Principal,
    TenantDeclared,
    TenantPolicy,
    TenantPolicyChanged,
    TenantSpec,
    Tier,
)
from kernel.core._records import (
    ExecutionIntent,
    Feedback,
    Manifest,
    PackRef,
    Payload,
    ProposalRecord,
    Record,
)
from kernel.core._shadow_events import (
    SHADOW_PAYLOADS,
    Judged,
    ShadowDiffered,
    ShadowLoaded,
    ShadowPromoted,
    ShadowRetired,
)

GENESIS_HASH = bytes(32)
"""The ``prev_hash`` of the first event of every journal."""


AnyPayload = (
    KernelStarted
    | KernelStopped
    | ActorRestarted
    | MessageDeadLettered
    | AgentRegistered
    | AgentRefused
    | AgentStatusChanged
    | TriggerFired
    | FlowCreated
    | ContextCompiled
    | ProposalSubmitted
    | ProposalRejected
    | ProposalAccepted
    | FlowEscalated
    | HumanDecided
    | ApprovalExpired
    | DecisionRefused
    | ExecutionStarted
    | ExecutionSucceeded
    | ExecutionFailed
    | DuplicateSuppressed
    | FlowClosed
    | FlowAborted
    | SubmissionRefused
    | ExecutionRetried
    | ExecutionRefused
    | FlowDirty
    | CompensationStarted
    | CompensationSucceeded
    | CompensationFailed
    | FlowCompensated
    | ResourceReserved
    | ResourceReleased
    | ProjectionCheckpoint
    | FactAdded
    | ConstraintAdded
    | ConstraintDeactivated
    | DecisionMade
    | MemoryQueried
    | PackLoaded
    | LimitAmended
    | AmendmentRefused
    | FlowFlagged
    | RuleProposed
    | RuleDecided
    | CitationsChecked
    | ConstraintAdvisory
    | InputRefused
    | RuleRetracted
    | CredentialIssued
    | OperatorKeyTrusted
    | OperatorKeyRevoked
    | RequestVerified
    | SourceRegistered
    | ObservationRecorded
    | EntityCandidateRecorded
    | PropositionProposed
    | EvidenceAttached
    | TestResultIngested
    | PropositionTransitioned
    | ConsolidationRecorded
    | EpisodeArchived
    | MeaningScored
    | ArtifactStored
    | ArtifactsCollected
    | ApprovalVoted
    | ApprovalSuperseded
    | GrantIssued
    | GrantVoted
    | GrantRevoked
    | GrantUsed
    | ReasoningCharged
    | WebhookDelivered
    | WebhookFailed
    | CheckpointKeyChanged
    | SubjectErased
    | TenantDeclared
    | TenantPolicyChanged
    | Delegated
    | DecidedWithoutJournal
    | DriftBreached
    | ShadowLoaded
    | ShadowDiffered
    | ShadowRetired
    | ShadowPromoted
)


class Draft(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """An event before the journal numbers, stamps and chains it.

    A negative ``caused_by`` is relative: -k names the event k places before
    this one in the same append (whose seqs are contiguous), because that seq
    is not known until the journal assigns it.
    """

    payload: AnyPayload
    dfid: str | None = None
    parent_dfid: str | None = None
    caused_by: int | None = None
    agent_id: str | None = None


class Event(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """The envelope every recorded fact travels in.

    ``seq`` is global and gap-free; ``ts`` is the wall-clock time of the
    append in nanoseconds (read through the kernel's clock port); ``caused_by``
    is the seq of the event that led to this one.
    """

    seq: int
    ts: int
    payload: AnyPayload
    dfid: str | None = None
    parent_dfid: str | None = None
    caused_by: int | None = None
    agent_id: str | None = None
    prev_hash: str = ""
    hash: str = ""

    @property
    def type(self) -> str:
        """The event type: the payload's tag."""
        return type(self.payload).__name__


P = TypeVar("P", bound=Payload)


def payload_of(event: Event, kind: type[P]) -> P:
    """Return ``event``'s payload as a ``kind``, for reading its fields with their types.

    ``event.payload`` is the union of every payload type, so a type checker cannot know
    which fields it has; this says which one is expected and checks it.

    Raises:
        TypeError: The event carries another payload type.
    """
    payload = event.payload
    if not isinstance(payload, kind):
        raise TypeError(f"event {event.seq} is {event.type}, not {kind.__name__}")
    return payload


def payloads(events: Iterable[Event], kind: type[P]) -> list[P]:
    """Return the payloads of type ``kind`` among ``events``, in their order."""
    return [e.payload for e in events if isinstance(e.payload, kind)]


_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(Event)


def event_type(payload: Payload) -> str:
    """Return the type name recorded for ``payload``."""
    return type(payload).__name__


def canonical(obj: Any) -> bytes:
    """Return the canonical JSON bytes of ``obj``: sorted keys, compact, defaults omitted."""
    return _encoder.encode(obj)


def stamp(draft: Draft, seq: int, ts: int) -> Event:
    """Return the event a draft becomes at ``seq`` and ``ts``, before it is chained."""
    return Event(
        seq=seq,
        ts=ts,
        payload=draft.payload,
        dfid=draft.dfid,
        parent_dfid=draft.parent_dfid,
        caused_by=draft.caused_by,
        agent_id=draft.agent_id,
    )


def body_of(draft: Draft, seq: int, ts: int) -> bytes:
    """Return the canonical bytes that are stored and hashed for an event."""
    return _encoder.encode(stamp(draft, seq, ts))


def chain(prev_hash: bytes, body: bytes, key: bytes | None = None) -> bytes:
    """Return the hash of an event whose canonical bytes are ``body``.

    With a chain ``key`` it is HMAC-SHA256 rather than SHA-256, so only a holder
    of the key can compute a hash that verifies (see docs/integrity.md).
    """
    if key is None:
        return hashlib.sha256(prev_hash + body).digest()
    return hmac.digest(key, prev_hash + body, "sha256")


def chain_key_id(key: bytes) -> str:
    """Return a short id naming a chain key without revealing it (an HMAC of a fixed label)."""
    return hmac.new(key, b"dirk chain key id v1", hashlib.sha256).hexdigest()[:16]


_CLOSED = FlowClosed()


def closing_of(event: Event) -> Event:
    """Return the FlowClosed a closing ExecutionSucceeded stands for (see ``closes``).

    It is what the engine recorded as a row of its own before: the next event of the flow,
    caused by the success, in the same append (same time). It has the success's seq and
    hash, having no row of its own: what vouches for it is the row it is derived from.
    """
    return _standing_for(event, _CLOSED)


def _standing_for(event: Event, payload: Payload) -> Event:
    """``payload`` as the event ``event``'s row also stands for: its seq, time and hash."""
    return Event(
        seq=event.seq,
        ts=event.ts,
        payload=payload,  # type: ignore[arg-type]
        dfid=event.dfid,
        parent_dfid=event.parent_dfid,
        caused_by=event.seq,
        agent_id=event.agent_id,
        prev_hash=event.hash,
        hash=event.hash,
    )


def closes_flow(event: Event) -> bool:
    """Whether ``event`` is an ExecutionSucceeded that ends its flow (a FlowClosed follows)."""
    payload = event.payload
    return type(payload) is ExecutionSucceeded and payload.closes


def derived_of(event: Event) -> Event | None:
    """Return the event ``event``'s row also stands for, or None (see :func:`with_derived`).

    A closing success stands for its FlowClosed; a FlowCreated that carries its flow's first
    context for that ContextCompiled. Either is the next event of the flow, caused by the
    row's, with its seq, time and hash.
    """
    payload = event.payload
    kind = type(payload)
    if kind is ExecutionSucceeded:
        return closing_of(event) if payload.closes else None  # type: ignore[union-attr]
    if kind is FlowCreated and payload.context is not None:  # type: ignore[union-attr]
        return _standing_for(event, payload.context)  # type: ignore[union-attr]
    if kind is ProposalAccepted and payload.start is not None:  # type: ignore[union-attr]
        return _standing_for(event, ExecutionStarted(intent=payload.start))  # type: ignore[union-attr]
    if kind is ProposalSubmitted and payload.accepted is not None:  # type: ignore[union-attr]
        return _standing_for(event, payload.accepted)  # type: ignore[union-attr]
    return None


def is_derived(event: Event) -> bool:
    """Whether ``event`` has no row of its own (derived by :func:`with_derived`).

    Only a derived event is caused by its own seq: an id made of the seq alone (a bus
    message's, say) needs this to tell it from the row it shares the seq with.
    """
    return event.caused_by == event.seq


def with_derived(events: list[Event]) -> list[Event]:
    """Return ``events`` with the event each row also stands for right after it.

    A closing success stands for its FlowClosed, a FlowCreated with its first context for
    that ContextCompiled (:func:`derived_of`). Every reader of the journal sees events
    through this (folds, listeners, reads, scans, verify): the journal stores one row where
    two events travel together, and the contract of the second (narratives, spans, the
    console, the mesh's subjects) stays. ``events`` itself is returned when nothing is
    derived.
    """
    first = next((i for i, event in enumerate(events) if _derives(event)), None)
    if first is None:
        return events
    out = events[:first]
    last = len(events) - 1
    for index in range(first, last + 1):
        event = events[index]
        out.append(event)
        if _derives(event) and not (
            # Already derived (a list handed on twice, or an event itself derived): never
            # a second time.
            (index < last and events[index + 1].seq == event.seq) or event.caused_by == event.seq
        ):
            derived = derived_of(event)
            while derived is not None:
                out.append(derived)
                derived = derived_of(derived)
    return out


def _derives(event: Event) -> bool:
    """Whether ``event``'s row stands for a second event (:func:`derived_of`)."""
    payload = event.payload
    kind = type(payload)
    if kind is ExecutionSucceeded:
        return payload.closes  # type: ignore[union-attr]
    if kind is ProposalAccepted:
        return payload.start is not None  # type: ignore[union-attr]
    if kind is ProposalSubmitted:
        return payload.accepted is not None  # type: ignore[union-attr]
    return kind is FlowCreated and payload.context is not None  # type: ignore[union-attr]


def decode_body(body: bytes, prev_hash: bytes, hash_: bytes) -> Event:
    """Decode stored canonical bytes back into an Event carrying its chain hashes."""
    event = _decoder.decode(body)
    return msgspec.structs.replace(event, prev_hash=prev_hash.hex(), hash=hash_.hex())


def digest(obj: Any) -> str:
    """Return the hex SHA-256 of the canonical bytes of ``obj``."""
    return hashlib.sha256(canonical(obj)).hexdigest()


__all__ = [
    # governed beliefs (kernel.core._belief_events)
    "BELIEF_PAYLOADS",
    "GENESIS_HASH",
    "PRINCIPAL_PAYLOADS",
    "SHADOW_PAYLOADS",
    "ActorRestarted",
    "AgentRefused",
    "AgentRegistered",
    "AgentStatusChanged",
    "AmendmentRefused",
    "AnyPayload",
    "Applied",
    "ApprovalExpired",
    "ApprovalSuperseded",
    "ApprovalVoted",
    "Archived",
    "ArtifactStored",
    "ArtifactsCollected",
    "CheckpointKeyChanged",
    "CitationsChecked",
    "CompensationFailed",
    "CompensationStarted",
    "CompensationSucceeded",
    "ConsolidationRecorded",
    "ConstraintAdded",
    "ConstraintAdvisory",
    "ConstraintDeactivated",
    "ContextCompiled",
    "CredentialIssued",
    "DecidedWithoutJournal",
    "DecisionMade",
    "DecisionRefused",
    "Delegated",
    "Draft",
    "DriftBreached",
    "DuplicateSuppressed",
    "EntityCandidateRecorded",
    "EpisodeArchived",
    "Event",
    "EvidenceAttached",
    "ExecutionFailed",
    "ExecutionIntent",
    "ExecutionRefused",
    "ExecutionRetried",
    "ExecutionStarted",
    "ExecutionSucceeded",
    "FactAdded",
    "FailMode",
    "Feedback",
    "FlowAborted",
    "FlowClosed",
    "FlowCompensated",
    "FlowCreated",
    "FlowDirty",
    "FlowEscalated",
    "FlowFlagged",
    "GrantIssued",
    "GrantRevoked",
    "GrantUsed",
    "GrantVoted",
    "HumanDecided",
    "InputRefused",
    "Judged",
    "KernelStarted",
    "KernelStopped",
    "Layer",
    "LimitAmended",
    "Manifest",
    "MeaningScored",
    "Member",
    "MemoryQueried",
    "MessageDeadLettered",
    "ObservationRecorded",
    "OnBehalf",
    "OperatorKeyRevoked",
    "OperatorKeyTrusted",
    "PackLoaded",
    "PackRef",
    "Payload",
    "Permission",
    "Principal",
    "ProjectionCheckpoint",
    "ProposalAccepted",
    "ProposalRecord",
    "ProposalRejected",
    "ProposalSubmitted",
    "PropositionProposed",
    "PropositionTransitioned",
    "QuorumRule",
    "ReasoningCharged",
    "Record",
    "RequestVerified",
    "ResourceReleased",
    "ResourceReserved",
    "RuleDecided",
    "RuleProposed",
    "RuleRetracted",
    "RuleSource",
    "ShadowDiffered",
    "ShadowLoaded",
    "ShadowPromoted",
    "ShadowRetired",
    "SourceRegistered",
    "SubjectErased",
    "SubmissionRefused",
    "TenantDeclared",
    "TenantPolicy",
    "TenantPolicyChanged",
    "TenantSpec",
    "TestResultIngested",
    "Tier",
    "TriggerFired",
    "WebhookDelivered",
    "WebhookFailed",
    "body_of",
    "canonical",
    "chain",
    "chain_key_id",
    "closes_flow",
    "closing_of",
    "decode_body",
    "derived_of",
    "digest",
    "event_type",
    "is_derived",
    "stamp",
    "with_derived",
]
