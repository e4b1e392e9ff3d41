"""Events of the kernel's life, the registry, triggers, every DecisionFlow and its resources."""

from __future__ import annotations

from typing import Any

from kernel.core._approval_events import QuorumRule
from kernel.core._belief_events import Applied
from kernel.core._principal_events import OnBehalf
from kernel.core._records import (
    ExecutionIntent,
    Feedback,
    Manifest,
    PackRef,
    Payload,
    ProposalRecord,
)
from kernel.core.reasons import ReasonCode

# --- kernel lifecycle ---------------------------------------------------------


class KernelStarted(Payload, frozen=True, tag=True):
    """A kernel opened the journal; ``head_*`` is the last event it found (seq 0: none)."""

    kernel_version: str
    packs: list[PackRef] = []
    head_seq: int = 0
    head_hash: str = ""
    fold: int = 1
    """The fold rules the kernel applies from this event on (kernel.state.projections.FOLD)."""
    allow: list[str] | None = None
    """The agent ids the kernel allows to register (None: not recorded, older kernels)."""


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

    Only ``verifier`` is recorded (the public key the secret seeds, ``ed25519:...``; before
    keys, ``sha256:<hex>`` of it: kernel.registry), never the secret; it replaces the
    agent's previous one. Live sessions stay valid.
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
    """A flow begins. ``traceparent`` is the W3C trace context of the caller's span when
    the embedding code passed one (its trace links to it; see docs/traces.md).

    A flow opened by ``Kernel.propose`` records the ids its caller gave: the
    conversation it belongs to (a framework's run or thread) and the tool call it
    governs. Spans carry them as ``gen_ai.conversation.id`` and ``gen_ai.tool.call.id``.

    ``on_behalf`` is whom the flow acts for (kernel.core._principal_events): the
    authenticated principal, the agent's tier and the delegation chain. None: opened by a
    kernel before principals existed, or for nobody (the DIM then refuses its proposal
    PRINCIPAL_MISSING, on journals whose fold rules know principals).

    ``agent_version`` is the agent's own version as its manifest said when the flow
    opened (``Manifest.agent_version``): spans carry it as ``gen_ai.agent.version``.

    ``context`` is the flow's first context, compiled in the same append: one row where
    two events travel together, the ContextCompiled derived from it for every reader
    (kernel.core.events.with_derived). None: recorded as a row of its own (journals
    before it, and a flow whose first context was not compiled with it).
    """

    root_dfid: str
    topic: str = ""
    traceparent: str = ""
    conversation_id: str = ""
    tool_call_id: str = ""
    on_behalf: OnBehalf | None = None
    agent_version: str = ""
    context: ContextCompiled | None = None


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
    artifacts: dict[str, str] = {}
    """The artifacts the context referenced, state key -> ``sha256:<hex>``: what its agent
    may fetch (kernel.state.artifacts)."""
    memory_hash: str = ""
    """The hash of the memory layer shown (``compile_memory``'s document): which memory the
    agent saw."""
    reactivated: list[str] = []
    """What canonical memory the knowledge layer brought back (``proposition:<id>``,
    ``entity:<id>``, ``episode:<id>``): the beliefs the agent was shown."""


class ProposalSubmitted(Payload, frozen=True, tag=True):
    """A proposal, as the DIM took it to judge.

    ``accepted`` is its verdict when the DIM accepted it in the same append with nothing
    recorded between: one row where the two events travel together (and the acceptance's
    start with them, ``ProposalAccepted.start``), the ProposalAccepted derived from it for
    every reader (kernel.core.events.with_derived). None: the verdict, if any, is a row of
    its own (journals before it, rejections, escalations, and a proposal something else
    was recorded after before its verdict).
    """

    attempt: int
    proposal: ProposalRecord
    by_human: bool = False
    accepted: ProposalAccepted | None = None


class ProposalRejected(Payload, frozen=True, tag=True):
    """A verdict against the proposal; ``pack`` is the hash of the pack that judged it."""

    attempt: int
    feedback: Feedback
    pack: str = ""


class ProposalAccepted(Payload, frozen=True, tag=True):
    attempt: int
    by_human: bool = False
    pack: str = ""
    applied: Applied | None = None
    """A transformed verdict: the form applied instead of the one submitted (kernel.beliefs)."""
    grant: str = ""
    """The standing grant under which a proposal that would have escalated proceeded."""
    rechecked: bool = False
    """The verdict of an approved (or queued) action judged again just before it executes."""
    start: ExecutionIntent | None = None
    """The intent whose execution starts in the same append: one row where two events travel
    together, the ExecutionStarted derived from it for every reader
    (kernel.core.events.with_derived). None: the start, if any, is a row of its own (journals
    before it, and an acceptance something else was recorded after before the start)."""


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
    version: str = ""
    """The version of the pack ``pack`` hashes (what a later re-judgement names)."""
    quorum: QuorumRule | None = None
    """What the approval needs (None: one operator's approval, as before quorums)."""


class HumanDecided(Payload, frozen=True, tag=True):
    """A human's decision on an escalated flow; ``inbox_id`` names the inbox row it came from.

    ``via`` says how it reached the kernel: ``api`` (embedding code in the kernel's
    process, trusted as code) or ``inbox`` (a signed request; ``signer`` names the key
    that signed it: the operator's own, or a door's such as the console's). Empty in
    journals written before either was recorded. ``self_approved``: the operator is the
    flow's proposer, and the flow's pack allows that (``PolicyPack.self_approval``).
    """

    decision: str
    operator: str
    reason: str = ""
    params: dict[str, Any] | None = None
    action_hash: str = ""
    inbox_id: int | None = None
    via: str = ""
    signer: str = ""
    self_approved: bool = False


class ApprovalExpired(Payload, frozen=True, tag=True):
    """Nobody decided within the approval's time; the escalation desk noticed at ``ts``."""

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
    via: str = ""
    signer: str = ""


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
    closes: bool = False
    """The flow ends with this result (its single action). The journal stores no FlowClosed
    row after it: every reader gets the FlowClosed it stands for, derived right after it
    (same seq, time and hash: :func:`kernel.core.events.with_derived`). Journals from before
    it (both rows) read the same."""


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
