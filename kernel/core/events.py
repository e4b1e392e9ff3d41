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
from typing import Any

import msgspec

from kernel.core.reasons import ReasonCode

GENESIS_HASH = bytes(32)
"""The ``prev_hash`` of the first event of every journal."""


# Data-only structs are not tracked by the cyclic garbage collector (gc=False): they
# never form reference cycles, and tracking the many alive in a busy kernel cost a
# quarter of its time in collections.
class Payload(
    msgspec.Struct, frozen=True, gc=False, kw_only=True, tag_field="type", omit_defaults=True
):
    """Base of every event payload; the subclass name is the event type."""


class Record(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """Base of the plain records nested inside payloads."""


# --- records nested in payloads ---------------------------------------------


class PackRef(Record, frozen=True):
    """A policy pack as loaded: name, version and content hash."""

    name: str
    version: str
    hash: str


class Manifest(Record, frozen=True):
    """What an agent declares at its handshake: who it is and what it may do.

    ``version`` is the semver of the DIR contract the agent speaks (the kernel
    accepts its own major and any minor up to its own); ``capabilities`` are
    the policy kinds it may propose; ``subscriptions`` are the trigger topics
    (dotted prefixes) it wakes on and the state it may see.
    """

    agent_id: str
    version: str
    capabilities: list[str] = []
    subscriptions: list[str] = []
    limits: dict[str, Any] = {}
    max_attempts: int = 3


class ProposalRecord(Record, frozen=True):
    """A PolicyProposal exactly as the agent submitted it (still an untrusted claim)."""

    kind: str
    params: dict[str, Any] = {}
    version: str = ""
    explain: str = ""
    confidence: float = 1.0
    valid_until_ns: int | None = None
    context_ref: str = ""


class Feedback(Record, frozen=True):
    """Why a proposal was not accepted, as handed back to the agent."""

    reason_code: ReasonCode
    detail: str = ""
    layer: str = ""
    field: str = ""
    rule: str = ""
    limit: str = ""


class ExecutionIntent(Record, frozen=True):
    """What the kernel will carry out: minted by the kernel only, never by an agent."""

    key: str
    kind: str
    adapter: str
    params: dict[str, Any] = {}
    step: int = 0
    valid_until_ns: int | None = None
    action: str = ""
    """The saga step's action (empty for a one-step intent)."""
    compensation: bool = False
    """Whether this intent undoes the completed step ``step``."""
    bounds: dict[str, Any] = {}
    """Execution constraints checked against the adapter's live quote before the call."""


# --- kernel lifecycle ---------------------------------------------------------


class KernelStarted(Payload, frozen=True, tag=True):
    """A kernel opened the journal; ``head_*`` is the last event it found (seq 0: none)."""

    kernel_version: str
    packs: list[PackRef] = []
    head_seq: int = 0
    head_hash: str = ""


class KernelStopped(Payload, frozen=True, tag=True):
    """A kernel stopped; ``head_*`` is the last event before this one."""

    reason: str
    detail: str = ""
    head_seq: int = 0
    head_hash: str = ""


class ActorRestarted(Payload, frozen=True, tag=True):
    actor: str
    error: str
    restarts: int


class MessageDeadLettered(Payload, frozen=True, tag=True):
    actor: str
    message: str
    error: str


# --- registry -----------------------------------------------------------------


class AgentRegistered(Payload, frozen=True, tag=True):
    manifest: Manifest
    session_hash: str


class AgentRefused(Payload, frozen=True, tag=True):
    reason_code: ReasonCode
    detail: str = ""
    version: str = ""


class AgentStatusChanged(Payload, frozen=True, tag=True):
    """An operator changed an agent's status; ``inbox_id`` names the inbox row it came from."""

    status: str
    reason: str = ""
    operator: str = ""
    inbox_id: int | None = None


class CredentialIssued(Payload, frozen=True, tag=True):
    """An operator provisioned (or rotated) the credential an agent must show to handshake.

    Only ``verifier`` is recorded (``sha256:<hex>`` of the secret, kernel.registry), never
    the secret; it replaces the agent's previous one. Live sessions stay valid.
    """

    verifier: str
    reason: str = ""
    operator: str = ""
    inbox_id: int | None = None


# --- the world and its triggers -----------------------------------------------


class TriggerFired(Payload, frozen=True, tag=True):
    """Something happened in the world; ``facts`` update the state layer."""

    topic: str
    facts: dict[str, Any] = {}
    source: str = ""


# --- DecisionFlow -------------------------------------------------------------


class FlowCreated(Payload, frozen=True, tag=True):
    root_dfid: str
    topic: str = ""


class ContextCompiled(Payload, frozen=True, tag=True):
    """A context handed to an agent: the state it was shown and what the budget dropped.

    ``context_ref`` hashes the state the agent is entitled to see (what the DIM
    checks for staleness); ``as_of_ns`` is recorded when a time window applied.
    """

    attempt: int
    context_ref: str
    state: dict[str, Any] = {}
    feedback: Feedback | None = None
    tokens: int = 0
    dropped: list[str] = []
    as_of_ns: int = 0
    rules: list[str] = []
    """The rulebook items the context showed, as ``id@vN`` (what citations are checked against)."""


class ProposalSubmitted(Payload, frozen=True, tag=True):
    attempt: int
    proposal: ProposalRecord
    by_human: bool = False


class ProposalRejected(Payload, frozen=True, tag=True):
    """A verdict against the proposal; ``pack`` is the hash of the pack that judged it."""

    attempt: int
    feedback: Feedback
    pack: str = ""


class ProposalAccepted(Payload, frozen=True, tag=True):
    attempt: int
    by_human: bool = False
    pack: str = ""


class FlowEscalated(Payload, frozen=True, tag=True):
    """A flow waits for a human; it opens an approval bound to ``action_hash``.

    ``impact`` comes from the policy kind's pack, never from the agent; an
    empty ``action_hash`` means there is no proposal to approve (a silent agent).
    """

    reason_code: ReasonCode
    detail: str = ""
    partial: dict[str, Any] = {}
    """For a saga: which steps are in effect, undone and failed (the human's starting point)."""
    pack: str = ""
    rule: str = ""
    impact: str = "HIGH_IMPACT"
    action_hash: str = ""


class HumanDecided(Payload, frozen=True, tag=True):
    """A human's decision on an escalated flow; ``inbox_id`` names the inbox row it came from."""

    decision: str
    operator: str
    reason: str = ""
    params: dict[str, Any] | None = None
    action_hash: str = ""
    inbox_id: int | None = None


class ApprovalExpired(Payload, frozen=True, tag=True):
    """Nobody decided within the approval's time; the escalation manager noticed at ``ts``."""

    action_hash: str = ""
    detail: str = ""


class DecisionRefused(Payload, frozen=True, tag=True):
    """A human decision the kernel did not apply (late, for another action, malformed...).

    Recorded so that an inbox row is taken exactly once whatever became of it;
    ``target`` names the flow when no flow of that DFID exists.
    """

    reason_code: ReasonCode
    decision: str = ""
    operator: str = ""
    detail: str = ""
    inbox_id: int | None = None
    target: str = ""


class ExecutionStarted(Payload, frozen=True, tag=True):
    intent: ExecutionIntent


class ExecutionSucceeded(Payload, frozen=True, tag=True):
    key: str
    external_id: str = ""
    detail: dict[str, Any] = {}
    recovered: bool = False
    """The result was found by the adapter's ``lookup`` after a restart, not by a call."""
    reconciled: bool = False
    """The result was observed outside the kernel and recorded by a human (``reconcile``)."""


class ExecutionFailed(Payload, frozen=True, tag=True):
    key: str
    error: str
    transient: bool = False
    unknown: bool = False
    """The effect may have happened: the intent stays pending until a human decides."""


class ExecutionRetried(Payload, frozen=True, tag=True):
    """A transient failure of attempt ``attempt``; the next one is due at ``retry_at_ns``."""

    key: str
    attempt: int
    error: str
    delay_ns: int
    retry_at_ns: int
    unknown: bool = False
    """The failed attempt may have reached the system (its outcome is unknown)."""


class ExecutionRefused(Payload, frozen=True, tag=True):
    """An intent refused at the moment of execution: the world moved outside its bounds."""

    key: str
    reason_code: ReasonCode
    bound: str
    detail: str = ""
    bounds: dict[str, Any] = {}
    observed: dict[str, Any] = {}


class FlowDirty(Payload, frozen=True, tag=True):
    """A saga step failed after earlier steps took effect; compensations follow."""

    step: int
    reason_code: ReasonCode
    detail: str = ""


class CompensationStarted(Payload, frozen=True, tag=True):
    intent: ExecutionIntent


class CompensationSucceeded(Payload, frozen=True, tag=True):
    key: str
    step: int
    external_id: str = ""
    detail: dict[str, Any] = {}
    recovered: bool = False
    reconciled: bool = False
    """Recorded by a human who observed the result outside the kernel (``reconcile``)."""


class CompensationFailed(Payload, frozen=True, tag=True):
    key: str
    step: int
    error: str
    transient: bool = False
    unknown: bool = False
    """The compensation may have happened: it stays pending until a human decides."""


class FlowCompensated(Payload, frozen=True, tag=True):
    """Every completed step of a failed saga was undone."""

    steps: int = 0


class DuplicateSuppressed(Payload, frozen=True, tag=True):
    """A repeated submission or delivery was answered from the record, with no new effect."""

    key: str
    source: str


class FlowClosed(Payload, frozen=True, tag=True):
    pass


class FlowAborted(Payload, frozen=True, tag=True):
    reason_code: ReasonCode
    detail: str = ""


class SubmissionRefused(Payload, frozen=True, tag=True):
    """A submission refused at the kernel's boundary, before it could touch a flow."""

    reason_code: ReasonCode
    detail: str = ""
    claimed_agent: str = ""


# --- resources (semantic locks) -------------------------------------------------


class ResourceReserved(Payload, frozen=True, tag=True):
    """The flow (``dfid``) now holds ``amount`` of ``pool``; replaces what it held there."""

    pool: str
    amount: int


class ResourceReleased(Payload, frozen=True, tag=True):
    """The flow (``dfid``) no longer holds anything of ``pool``."""

    pool: str
    amount: int
    reason: str = ""


# --- policy packs, limit amendments and soft guards -----------------------------


class PackLoaded(Payload, frozen=True, tag=True):
    """A pack version loaded into the running kernel: proposals judged after it use it.

    ``previous`` is the hash of the version it replaced (empty for a new pack).
    """

    pack: PackRef
    previous: str = ""
    operator: str = ""
    reason: str = ""


class LimitAmended(Payload, frozen=True, tag=True):
    """An operator set one of an agent's limits (``agent_id``) until ``expires_at_ns``.

    ``floor`` and ``ceiling`` are the pack's bounds the value was checked against.
    """

    limit: str
    value: int | str
    floor: str
    ceiling: str
    expires_at_ns: int
    operator: str
    reason: str = ""
    pack: str = ""
    inbox_id: int | None = None


class AmendmentRefused(Payload, frozen=True, tag=True):
    """A limit amendment the kernel did not apply (unknown limit, out of bounds...)."""

    reason_code: ReasonCode
    limit: str = ""
    value: str = ""
    operator: str = ""
    detail: str = ""
    inbox_id: int | None = None


class FlowFlagged(Payload, frozen=True, tag=True):
    """A soft guard found the flow worth a human look (NEEDS_REVIEW); the verdict stands.

    ``confidence`` is the guard's score as a decimal string; ``failed`` says the
    guard could not judge at all (it raised or overran), which is flagged too.
    The DIM flags a rule that overran its time budget the same way (guard
    ``"rule budget"``): ``rule``, its ``budget_us``, the measured ``took_us``
    and the ``pack`` hash name it for the pack's author. The measured time is a
    recorded fact, never an input of the verdict.
    """

    guard: str
    reason: str
    confidence: str = ""
    failed: bool = False
    rule: str = ""
    budget_us: int = 0
    took_us: int = 0
    pack: str = ""


# --- replay -------------------------------------------------------------------


class ProjectionCheckpoint(Payload, frozen=True, tag=True):
    """The kernel's own record of the projected state's hash after event ``seq``.

    ``dirk verify`` recomputes the hash by replay; a snapshot stored beside the
    journal is trusted only if it hashes to a checkpoint's digest.
    """

    seq: int
    digest: str
    snapshot: str = ""
    """Hex SHA-256 of the stored snapshot's bytes: checking it is far cheaper than the digest."""


# --- memory (facts, constraints, decisions), written by the memory executor ----


class FactAdded(Payload, frozen=True, tag=True):
    """A fact an agent learned, accepted by the DIM; ``key`` the intent key that wrote it."""

    name: str
    value: str
    confidence: str = "1"
    correlation_id: str = ""
    key: str = ""


class ConstraintAdded(Payload, frozen=True, tag=True):
    """A constraint on every later proposal; its id is this event's seq.

    ``priority`` is required or learned (enforced) or preferred (advisory);
    a learned constraint names the event of the mistake in ``triggered_by``.
    """

    text: str
    priority: str = "required"
    triggered_by: int | None = None
    correlation_id: str = ""
    key: str = ""


class ConstraintDeactivated(Payload, frozen=True, tag=True):
    constraint: int
    reason: str = ""
    correlation_id: str = ""
    key: str = ""


class DecisionMade(Payload, frozen=True, tag=True):
    text: str
    rationale: str = ""
    refs: list[int] = []
    correlation_id: str = ""
    key: str = ""


class MemoryQueried(Payload, frozen=True, tag=True):
    """An agent consulted memory about ``topic`` (what procedural constraints wait for)."""

    topic: str
    facts: list[str] = []
    constraints: list[int] = []
    correlation_id: str = ""
    key: str = ""


# --- the rulebook: versioned rules with provenance, through the promoter gate ----


class RuleSource(Record, frozen=True):
    """Where a rule's text comes from: repository, ref, path and blob (content) hash."""

    repo: str = ""
    ref: str = ""
    path: str = ""
    blob: str = ""


class RuleProposed(Payload, frozen=True, tag=True):
    """A proposed version of the rulebook item ``rule``; the promoter decides on it.

    ``base_version`` is the version the proposer saw (0 for a new rule);
    ``proposer`` is the agent or the operator; ``key`` is the memory intent key
    when an agent proposed it through ``memory.propose_rule``.
    """

    rule: str
    title: str
    content: str
    labels: list[str] = []
    source: RuleSource = msgspec.field(default_factory=RuleSource)
    base_version: int = 0
    proposer: str = ""
    by_operator: bool = False
    reason: str = ""
    correlation_id: str = ""
    key: str = ""


class RuleDecided(Payload, frozen=True, tag=True):
    """The audit record of one decision on the proposal this event is ``caused_by``.

    ``decision`` is promote, defer, skip or override; ``actor`` is ``promoter``
    (the kernel's deterministic gate) or the operator's name; ``version`` is
    the version the decision created (0 when it created none).
    """

    rule: str
    decision: str
    actor: str
    reason: str
    detail: str = ""
    prior_version: int = 0
    version: int = 0
    inbox_id: int | None = None


class CitationsChecked(Payload, frozen=True, tag=True):
    """Which ``[rule:id@vN]`` citations of a proposal's explanation its context held.

    ``incorrect`` maps each citation the flow's context did not hold to why
    (not shown, another version shown, no such rule).
    """

    correct: list[str] = []
    incorrect: dict[str, str] = {}


class ConstraintAdvisory(Payload, frozen=True, tag=True):
    """A proposal touches preferred (advisory) constraints: recorded, not refused."""

    constraints: list[int]
    detail: str = ""


# --- the wall: input refused at the kernel's boundary ------------------------------


class InputRefused(Payload, frozen=True, tag=True):
    """A human act or an inbox row refused at the kernel's boundary, before anything applied it.

    ``entry`` names the way in (``agent_status``, ``rule``, ``inbox``...); ``field``
    what was wrong; ``target`` what it named (a proposal seq, an agent, a flow) when
    the envelope cannot. Every recorded string is clipped (kernel.core.wall). An inbox row
    (``inbox_id``) refused here is taken: it is never read again.
    """

    reason_code: ReasonCode
    entry: str
    field: str = ""
    detail: str = ""
    operator: str = ""
    target: str = ""
    inbox_id: int | None = None


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
    | CredentialIssued
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


def decode_body(body: bytes, prev_hash: bytes, hash_: bytes) -> Event:
    """Decode stored canonical bytes back into an Event carrying its chain hashes."""
    event = _decoder.decode(body)
    return msgspec.structs.replace(event, prev_hash=prev_hash.hex(), hash=hash_.hex())


def digest(obj: Any) -> str:
    """Return the hex SHA-256 of the canonical bytes of ``obj``."""
    return hashlib.sha256(canonical(obj)).hexdigest()
