"""Every message one kernel actor sends another, and one union per receiving actor.

Messages are not records: they are never journalled, and carry what the
receiver needs to stage the next events (the journal is the record, DESIGN §4).
Each actor's mailbox is typed with its union (``Mailbox[DimMessage]``) and its
``handle`` takes that union, so mypy checks every send and every ``match``.

This module imports only the vocabulary (events, reasons, contracts, packs,
adapters' and constraints' result types), never an actor module: actors meet
here instead of importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeAlias

import msgspec

from kernel.adapters.constraints import Violation
from kernel.adapters.contract import Receipt
from kernel.core.events import (
    AmendmentRefused,
    Draft,
    Event,
    Feedback,
    LimitAmended,
    Manifest,
    OnBehalf,
    PackRef,
    ProposalRecord,
    RuleProposed,
)
from kernel.core.reasons import ReasonCode
from kernel.policy.contracts import HandshakeRefused, Session, Verdict, WorkingContext
from kernel.policy.packs import PackError

if TYPE_CHECKING:  # the actors import the projections, which fold amendments (AmendLimit)
    from kernel.core.flow import FlowState
    from kernel.runtime.actors import Reply
    from kernel.state.projections import AgentStatus

# --- to the registry ---------------------------------------------------------


class CredentialProof(msgspec.Struct, frozen=True, kw_only=True):
    """A handshake's proof that its sender holds the agent's credential, without the credential.

    ``signature`` is the Ed25519 signature (kernel.core.keys) of ``message`` by the key
    derived from the credential (``kernel.registry.agent_key``); the registry checks it
    against the agent's recorded public key. ``message`` is built by the kernel's side of
    the bus from its own one-time challenge and the manifest, so a proof cannot be replayed.
    """

    message: bytes
    signature: str


class Register(msgspec.Struct, frozen=True, kw_only=True):
    manifest: Manifest
    reply: Reply[Session | HandshakeRefused]
    invalid: str | None = None
    """Why the wall refused the manifest as given (``manifest`` then holds its clipped ids)."""
    credential: str | CredentialProof | None = None
    """The secret the operator provisioned for the agent, or a proof of holding it (over the
    bus); checked against its verifier."""
    require_credential: bool = False
    """Refuse the handshake unless a credential is provisioned and shown (over the bus)."""
    hosted: bool = False
    """The agent id is hosted in this process: a handshake that replaces its session ends
    the flows waiting on the agent (their reasoning ends with the crew that held them)."""


class SetStatus(msgspec.Struct, frozen=True, kw_only=True):
    agent_id: str
    status: AgentStatus
    operator: str
    reason: str
    reply: Reply[ReasonCode | None]
    inbox_id: int | None = None


class IssueCredential(msgspec.Struct, frozen=True, kw_only=True):
    """Provision or rotate the credential ``agent_id`` must show (only its verifier travels)."""

    agent_id: str
    verifier: str
    operator: str
    reason: str
    reply: Reply[ReasonCode | None]
    inbox_id: int | None = None


# --- to the context compiler -------------------------------------------------


class FireTrigger(msgspec.Struct, frozen=True, kw_only=True):
    topic: str
    facts: dict[str, Any]
    source: str
    parent_dfid: str | None
    reply: Reply[list[str]]
    traceparent: str = ""


class Compile(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    dfid: str
    attempt: int
    feedback: Feedback | None = None


class Open(msgspec.Struct, frozen=True, kw_only=True):
    """Open flow ``dfid`` for ``agent_id``, whose proposal the caller brings (Kernel.propose).

    No trigger fires and no agent host is woken: the compiler records the flow and
    the context its proposal is judged against, and answers the context's reference,
    or why no flow was opened (an unknown or inactive agent, a DFID already taken).
    """

    dfid: str
    agent_id: str
    topic: str
    reply: Reply[str | Feedback]
    parent_dfid: str | None = None
    root_dfid: str | None = None
    traceparent: str = ""
    conversation_id: str = ""
    tool_call_id: str = ""
    on_behalf: OnBehalf | None = None
    """Whom the flow acts for (recorded on its FlowCreated; kernel.dim._principal)."""
    judge: Judge | None = None
    """The caller's proposal, to judge once the flow is open (one append, issue 45).

    Sent to the DIM early (``Outbox.send_early``): carried into the DIM's append with
    the flow's opening when it can be, after the compiler's own commit otherwise. An
    admitted proposal with no ``context_ref`` is judged against the context this
    opening compiles. Not sent when no flow was opened (the reply says why).
    """


# --- to the DIM (the Decision Integrity Module) -------------------------------------


class Streak(msgspec.Struct, frozen=True, kw_only=True):
    """Where a conversation stands before its next call is judged (the retry governor).

    ``refused`` calls in a row were refused; one more refusal reaching ``limit`` stops
    the conversation, recorded on its flow ``root_dfid``.
    """

    conversation_id: str
    root_dfid: str
    refused: int
    limit: int


class Judge(msgspec.Struct, frozen=True, kw_only=True):
    """A proposal to judge: from an agent (with its token) or a human modification.

    ``single``: the flow takes this one proposal (Kernel.propose): a refusal ends it
    instead of asking the agent again; ``streak`` counts it in its conversation.
    """

    dfid: str
    proposal: ProposalRecord
    token: str = ""
    by_human: bool = False
    invalid: Feedback | None = None
    reply: Reply[Verdict] | None = None
    single: bool = False
    streak: Streak | None = None
    usage: Mapping[str, int] = {}
    """The tokens the attempt's reasoning reported, by model (priced by the DIM)."""


class Recheck(msgspec.Struct, frozen=True, kw_only=True):
    """Judge an approved (or queued) action again just before it executes, and start it.

    The escalation desk sends it once a human's approval (or a quorum) is recorded; the
    execution engine for an accepted flow an earlier run left unstarted. ``via`` says
    which: ``approval`` or ``queue``.
    """

    dfid: str
    via: str = "approval"
    reply: Reply[Verdict] | None = None


class IssueGrant(msgspec.Struct, frozen=True, kw_only=True):
    """An operator's standing grant (kernel.state.grants), to record if it can be judged."""

    kind: str
    agent: str
    bounds: dict[str, dict[str, Any]]
    valid_from_ns: int | None
    valid_until_ns: int
    uses: int
    operator: str
    reason: str
    roles: tuple[str, ...] = ()
    cap: int | None = None
    currency: str = ""
    inbox_id: int | None = None
    via: str = "api"
    signer: str = ""
    reply: Reply[list[Event] | Exception] | None = None


class RecordAct(msgspec.Struct, frozen=True, kw_only=True):
    """A principals act to record in order with the verdicts (kernel.dim: their owner).

    A tenant declared or its policy changed (``TenantDeclared``, ``TenantPolicyChanged``),
    a delegation (``Delegated``): in force from the next proposal the DIM judges, in the
    same batch too, so replay judges every verdict against the acts before it.
    """

    payload: Any
    reply: Reply[list[Event] | Exception] | None = None


class VoteGrant(msgspec.Struct, frozen=True, kw_only=True):
    """An operator's vote on a grant that waits for its quorum."""

    grant: str
    vote: str
    operator: str
    reason: str
    roles: tuple[str, ...] = ()
    inbox_id: int | None = None
    via: str = "api"
    signer: str = ""
    reply: Reply[list[Event] | Exception] | None = None


class RevokeGrant(msgspec.Struct, frozen=True, kw_only=True):
    """An operator takes a grant out of force."""

    grant: str
    operator: str
    reason: str
    inbox_id: int | None = None
    via: str = "api"
    signer: str = ""
    reply: Reply[list[Event] | Exception] | None = None


class Withdraw(msgspec.Struct, frozen=True, kw_only=True):
    """An agent gives up on a flow: it declined to act, or its reasoning failed."""

    dfid: str
    token: str
    attempt: int
    reason_code: ReasonCode
    detail: str = ""
    usage: Mapping[str, int] = {}
    """The tokens the attempt's reasoning reported before it gave up, by model."""


class Carry(msgspec.Struct, frozen=True, kw_only=True):
    """The compiler's batch, carried into the DIM's append with what its agents answered.

    Two commits per flow instead of three (issue 35, lever 4): a synchronous agent
    reasons on its context before that context is durable, and its proposal (or
    withdrawal) is judged in the same append that records the compiler's events
    (trigger, flows, contexts), its verdict and its intent. Nothing acts before that
    append; a crash before it loses only reasoning, never an effect.

    ``done`` is answered with the compiler's events as committed, or None when
    nothing of it was recorded (the compiler then records its batch itself).
    """

    drafts: tuple[Draft, ...]
    flows: Mapping[str, tuple[FlowState, int]]
    """The flows the drafts open, as the compiler staged them, with their last draft's index."""
    messages: tuple[Judge | Withdraw, ...]
    done: Reply[list[Event] | None]


class AmendLimit(msgspec.Struct, frozen=True, kw_only=True):
    """An operator's request to set ``limit`` of ``agent_id`` to ``value`` for ``ttl_s``."""

    agent_id: str
    limit: str
    value: Any
    ttl_s: Any
    operator: str
    reason: str
    inbox_id: int | None = None
    reply: Reply[LimitAmended | AmendmentRefused] | None = None


class LoadPack(msgspec.Struct, frozen=True, kw_only=True):
    """Replace the loaded version of ``pack`` (by name), or add it."""

    pack: Any
    adapters: frozenset[str]
    operator: str = ""
    reason: str = ""
    reply: Reply[PackRef | PackError | None] | None = None


class LoadShadow(msgspec.Struct, frozen=True, kw_only=True):
    """Judge by ``pack`` beside the enforced version of its name (kernel.dim._shadow)."""

    pack: Any
    adapters: frozenset[str]
    operator: str = ""
    reason: str = ""
    inbox_id: int | None = None
    reply: Reply[Any] | None = None


class RetireShadow(msgspec.Struct, frozen=True, kw_only=True):
    """Stop the shadow of pack ``name`` (of ``version``, when given)."""

    name: str
    version: str = ""
    operator: str = ""
    reason: str = ""
    inbox_id: int | None = None
    reply: Reply[Any] | None = None


class PromoteShadow(msgspec.Struct, frozen=True, kw_only=True):
    """Make the shadow of pack ``name`` the enforced version, with its report's digest."""

    name: str
    report: str
    as_of_seq: int
    version: str = ""
    judged: int = 0
    differed: int = 0
    operator: str = ""
    reason: str = ""
    inbox_id: int | None = None
    reply: Reply[Any] | None = None


class SubmitRule(msgspec.Struct, frozen=True, kw_only=True):
    """A rule proposal for the rulebook's owner, recorded with the promoter's decision.

    From an operator (``override``: put in force at once, with ``operator`` and
    ``reason``) or an agent's accepted ``memory.propose_rule`` (the memory
    executor sends it with the intent's flow, its ExecutionStarted as
    ``caused_by`` and the agent). The reply is the recorded RuleProposed and
    RuleDecided, ``[]`` when the proposal's key was recorded before, or the
    exception that refused it.
    """

    proposal: RuleProposed
    override: bool = False
    operator: str = ""
    reason: str = ""
    inbox_id: int | None = None
    flow: str | None = None
    caused_by: int | None = None
    agent_id: str | None = None
    reply: Reply[list[Event] | Exception] | None = None


class DecideRule(msgspec.Struct, frozen=True, kw_only=True):
    """An operator's override or skip of the deferred rule proposal ``proposal_seq``."""

    proposal_seq: int
    decision: str
    operator: str
    reason: str
    inbox_id: int | None = None
    reply: Reply[list[Event] | Exception] | None = None


class RetractRule(msgspec.Struct, frozen=True, kw_only=True):
    """An operator's retraction of rule ``rule`` of namespace ``ns`` (out of force; its
    history stays)."""

    rule: str
    operator: str
    reason: str
    inbox_id: int | None = None
    reply: Reply[list[Event] | Exception] | None = None
    ns: str = "default"


# --- to the escalation desk -----------------------------------------------


class Decision(StrEnum):
    """What a human may decide about an escalated flow.

    APPROVE, REJECT and MODIFY are the operator's words; OVERRIDE and ABORT are
    the older words for approve and reject, still accepted and recorded as given.
    RECONCILE and RETRY are the only decisions on an intent whose outcome is
    unknown: reconcile records what the system shows (``params`` ``{"outcome":
    "done", "external_id": ...}`` or ``{"outcome": "not_done"}``), retry calls
    the adapter again with the same key.
    """

    APPROVE = "approve"
    REJECT = "reject"
    MODIFY = "modify"
    OVERRIDE = "override"
    ABORT = "abort"
    RECONCILE = "reconcile"
    RETRY = "retry"


class Escalate(msgspec.Struct, frozen=True, kw_only=True):
    """Tell the escalation desk a flow now waits for a human."""

    dfid: str


class Decide(msgspec.Struct, frozen=True, kw_only=True):
    """A human decision; from the embedding API, or from the operator inbox (``inbox_id``)."""

    dfid: str
    decision: Decision
    operator: str
    reason: str
    params: dict[str, Any] | None = None
    action_hash: str | None = None
    inbox_id: int | None = None
    reply: Reply[Verdict] | None = None
    via: str = "api"
    """How it reached the kernel: ``api`` (embedding code) or ``inbox`` (a signed request)."""
    signer: str = ""
    """The key that signed an inbox request (the operator's own, or a door's)."""
    roles: tuple[str, ...] = ()
    """The operator's roles in the kernel's keyring (what a quorum counts)."""


class Tick(msgspec.Struct, frozen=True, kw_only=True):
    """Time passed: expire approvals, and wake the silence watchdog."""


class Withdrawal(msgspec.Struct, frozen=True, kw_only=True):
    """The flow's own agent withdraws a request that waits for a human (an MCP task cancelled).

    Taken only while no human has decided: the flow is aborted (AGENT_DECLINED), so a
    decision that comes later is refused (FLOW_NOT_ACTIVE) and nothing executes.
    """

    dfid: str
    agent_id: str
    detail: str
    reply: Reply[Verdict] | None = None


# --- to the execution engine -------------------------------------------------


class Execute(msgspec.Struct, frozen=True, kw_only=True):
    """Carry out the accepted intent of a flow."""

    dfid: str
    reply: Reply[Verdict] | None = None


class Dispatch(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """An intent's start is recorded: call its adapter (attempt 1, key ``key``)."""

    dfid: str
    key: str


class AdapterDone(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """An adapter call (attempt ``attempt`` of ``key``) finished, one way or another."""

    dfid: str
    key: str
    attempt: int = 1
    receipt: Receipt | None = None
    found: bool = False
    violation: Violation | None = None
    error: str = ""
    transient: bool = False
    unknown: bool = False
    """The call may have taken effect (its answer is missing or unclassified)."""
    looked_up: bool = False
    """The lookup asked before escalating answered: None (no receipt) means no effect exists."""


class Recover(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """Resume every execution an earlier run left unfinished (sent once at start)."""


class Resolve(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A human's reconcile or retry of an unknown outcome is recorded: go on from there."""

    dfid: str


# --- to the async guards -----------------------------------------------------


class Screen(msgspec.Struct, frozen=True, kw_only=True):
    """Run the guards of a proposal's kind over it (sent once its verdict is recorded)."""

    dfid: str
    proposal: ProposalRecord
    state: Mapping[str, Any]
    """The state the DIM judged the proposal against."""


class Found(msgspec.Struct, frozen=True, kw_only=True):
    """What one async guard concluded (or how it failed), to be recorded."""

    dfid: str
    guard: str
    flag_above: float
    finding: Any = None
    error: str = ""


# --- one union per receiving actor --------------------------------------------

RegistryMessage: TypeAlias = Register | SetStatus | IssueCredential
CompilerMessage: TypeAlias = FireTrigger | Compile | Open
DimMessage: TypeAlias = (
    Judge
    | Withdraw
    | Carry
    | AmendLimit
    | LoadPack
    | LoadShadow
    | RetireShadow
    | PromoteShadow
    | SubmitRule
    | DecideRule
    | RetractRule
    | Recheck
    | IssueGrant
    | VoteGrant
    | RevokeGrant
    | RecordAct
)
GrantMessage: TypeAlias = IssueGrant | VoteGrant | RevokeGrant
"""What the DIM receives as the owner of standing grants."""
RuleMessage: TypeAlias = SubmitRule | DecideRule | RetractRule
"""What the DIM receives as the rulebook's owner."""
EscalationMessage: TypeAlias = Escalate | Decide | Tick | Withdrawal
ExecutionMessage: TypeAlias = Execute | Dispatch | AdapterDone | Recover | Resolve
GuardMessage: TypeAlias = Screen | Found
AgentMessage: TypeAlias = WorkingContext
"""What an agent's crew receives: the context of one step of reasoning."""
