"""Events of governance: packs, amendments, guards, checkpoints, memory, the rulebook, the wall."""

from __future__ import annotations

import msgspec

from kernel.core._principal_events import Principal
from kernel.core._records import PackRef, Payload, Record
from kernel.core.reasons import ReasonCode

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
    """A fact an agent learned, accepted by the DIM; ``key`` the intent key that wrote it.

    ``tenant`` is the tenant its flow acted for: the fact is that tenant's, seen by its
    flows only (empty: written for no tenant, shared by all).
    """

    name: str
    value: str
    confidence: str = "1"
    correlation_id: str = ""
    key: str = ""
    tenant: str = ""


class ConstraintAdded(Payload, frozen=True, tag=True):
    """A constraint on every later proposal; its id is this event's seq.

    ``priority`` is required or learned (enforced) or preferred (advisory);
    a learned constraint names the event of the mistake in ``triggered_by``.

    How its text is matched is recorded with it, so a replay matches exactly as the
    kernel did (kernel.state.meaning): ``matcher`` is empty for a constraint written
    before meaning (whole words, as written), ``meaning/1`` for normalised, stemmed
    phrases; ``synonyms`` the groups of phrases that mean the same, taken from the
    packs in force when it was written; ``kinds`` and ``params`` its scope (the
    action kinds it governs and the parameters read; empty: every kind, the whole text).
    ``tenant`` is the tenant its flow acted for: it binds that tenant's proposals only
    (empty: written for no tenant, it binds every proposal).
    """

    text: str
    priority: str = "required"
    triggered_by: int | None = None
    correlation_id: str = ""
    key: str = ""
    matcher: str = ""
    synonyms: list[list[str]] = []
    kinds: list[str] = []
    params: list[str] = []
    tenant: str = ""


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


class MeaningScored(Payload, frozen=True, tag=True):
    """How close a proposal's text came to each active constraint, by an embedding model.

    Recorded on the proposal's flow before the DIM judges it (kernel.api), when a
    kernel has an embedding matcher (``Ports.meaning``): the verdict reads these
    recorded scores, never the model, so ``dirk verify --verdicts`` judges exactly as
    the kernel did without it. ``text`` is the hash of the text scored; ``scores``
    maps each constraint id to its score in micro-units (1.0 = 1_000_000), and
    ``threshold`` is the score a match needs, in the same units.
    """

    model: str
    version: str
    threshold: int
    text: str
    scores: dict[str, int] = {}


# --- artifacts: large documents by reference, the bytes kept in the artifact store --


class ArtifactStored(Payload, frozen=True, tag=True):
    """A document was put in the artifact store: its reference, never its bytes.

    ``ref`` is ``sha256:<hex>`` of the bytes (the store is content-addressed);
    ``by`` who put it (an operator, an agent, the embedding application);
    ``summary`` a short description an agent's context shows beside the reference.
    """

    ref: str
    size: int
    media_type: str = "application/octet-stream"
    summary: str = ""
    by: str = ""
    name: str = ""


class ArtifactsCollected(Payload, frozen=True, tag=True):
    """Artifacts no live flow, state fact or memory fact referenced were deleted from the store.

    Recorded before the bytes are deleted (record first): ``refs`` and their total
    ``size`` in bytes, who asked and why.
    """

    refs: list[str]
    size: int = 0
    operator: str = ""
    reason: str = ""
    inbox_id: int | None = None


# --- the rulebook: versioned rules with provenance, through the promoter ----


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
    ns: str = "default"
    """The rulebook namespace (a tenant, a team): rules of one never show in another."""
    input_event: str = ""
    """The id of the input that brought the proposal (a webhook delivery, a seed item):
    the promoter skips a second proposal from the same input in the same namespace."""


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
    ns: str = "default"


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
    request_id: str = ""
    """The refused inbox request's own id (when it decoded): never taken from another row."""
    principal: Principal | None = None
    """The principal the refused caller was authenticated as acting for, when its door had
    authenticated one (the refusal is then an attempt in that tenant's audit); none when it
    was refused before (a bad token's claim is not trusted)."""


# --- the operator inbox: whose keys the kernel trusts, and whose requests it took -----


class OperatorKeyTrusted(Payload, frozen=True, tag=True):
    """The kernel trusts ``key`` (``ed25519:...``) as principal ``name`` in ``role``.

    Recorded the first time a request signed with the key is taken; the key comes from
    the kernel's keyring file (kernel.inbox.keyring), never from the journal itself.
    ``role`` is ``operator`` (acts as itself), ``door`` (the console or an MCP server:
    acts for the operators it signed in) or ``agent`` (proposes as itself).
    """

    name: str
    role: str
    key: str
    fingerprint: str = ""


class OperatorKeyRevoked(Payload, frozen=True, tag=True):
    """A key the kernel trusted is gone from its keyring (or was replaced): never again."""

    name: str
    key: str
    fingerprint: str = ""
    detail: str = ""


class RequestVerified(Payload, frozen=True, tag=True):
    """An inbox row's proof checked out: who asked, who signed, with which key.

    ``principal`` is the operator (or agent) the request acts as; ``signer`` the name of
    the key that signed it: the principal itself, or a door (``console``, an MCP
    server) that signed in the operator and says so. What the kernel made of the
    request follows in an event naming the same ``inbox_id``. ``request_id`` is the
    request's own id, inside the signed bytes: another row carrying it is refused.
    """

    inbox_id: int
    request_id: str
    request: str
    principal: str
    signer: str
    fingerprint: str = ""


# --- the rulebook: retraction --------------------------------------------------------


class RuleRetracted(Payload, frozen=True, tag=True):
    """An operator took rule ``rule`` out of force: agents no longer see it; its history stays.

    ``version`` is the version that was in force. A later proposal for the same
    id starts from that version (``base_version``), so versions never repeat.
    """

    rule: str
    operator: str
    reason: str
    version: int = 0
    inbox_id: int | None = None
    ns: str = "default"


# --- proofs: the checkpoint signing key, erasure -----------------------------------


class CheckpointKeyChanged(Payload, frozen=True, tag=True):
    """From this event on the kernel signs the journal's checkpoints with ``key``.

    Recorded when a kernel starts signing with a key the journal has not recorded last:
    the first key, and each rotation (``previous`` names the key it replaces). Only
    public halves: ``key`` as ``ed25519:...``, ``vkey`` as C2SP writes a verifier key
    (kernel.core.notes). Checkpoints signed with an earlier key still verify with it.
    """

    origin: str
    key: str
    vkey: str
    previous: str = ""


class SubjectErased(Payload, frozen=True, tag=True):
    """A data subject's keys were destroyed: every field sealed for it is unreadable now.

    The sealed fields stay in the events (their ciphertext is what the chain, the tree
    and every checkpoint cover), so the journal still verifies (kernel.proofs.erasure).
    ``keys`` counts the keys destroyed; ``retention`` names the pack rule that expired
    the subject ("" for an operator's erasure).
    """

    subject: str
    keys: int = 0
    operator: str = ""
    reason: str = ""
    retention: str = ""
    inbox_id: int | None = None
