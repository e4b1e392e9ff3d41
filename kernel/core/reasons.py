"""The closed sets of codes: one enum per idea, each value spelled the same everywhere.

``ReasonCode`` says why a decision went the way it did (events, feedback,
spans); ``StopReason`` why a kernel stopped (``KernelStopped``,
``KernelShutdown``); ``CliError`` names what ``dirk`` reports that is not a
reason code, and ``ExitCode`` is ``dirk``'s exit status.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class ReasonCode(StrEnum):
    """Why a proposal, a handshake or a flow ended the way it did.

    The set is closed: every refusal anywhere in the kernel names one of these,
    so logs, dashboards and tests can match on them without parsing prose.
    Members are never removed or respelled: recorded journals hold them.
    """

    SCHEMA_INVALID = "SCHEMA_INVALID"
    VERSION_MISMATCH = "VERSION_MISMATCH"
    UNKNOWN_AGENT = "UNKNOWN_AGENT"
    INVALID_SESSION = "INVALID_SESSION"
    UNAUTHORIZED = "UNAUTHORIZED"
    AGENT_PASSIVE = "AGENT_PASSIVE"
    AGENT_SUSPENDED = "AGENT_SUSPENDED"
    AGENT_RETIRED = "AGENT_RETIRED"
    AGENT_ERROR = "AGENT_ERROR"
    AGENT_DECLINED = "AGENT_DECLINED"
    FLOW_NOT_ACTIVE = "FLOW_NOT_ACTIVE"
    EXPIRED = "EXPIRED"
    STALE_CONTEXT = "STALE_CONTEXT"
    RESOURCE_CONTENTION = "RESOURCE_CONTENTION"
    INSUFFICIENT_RESOURCES = "INSUFFICIENT_RESOURCES"
    RISK_LIMIT_EXCEEDED = "RISK_LIMIT_EXCEEDED"
    CONSTRAINT_VIOLATION = "CONSTRAINT_VIOLATION"
    VERIFICATION_REQUIRED = "VERIFICATION_REQUIRED"
    LOW_CONFIDENCE = "LOW_CONFIDENCE"
    APPROVAL_REQUIRED = "APPROVAL_REQUIRED"
    """An escalation threshold of the pack (e.g. notional above a limit) wants a human."""
    REASONING_EXHAUSTION = "REASONING_EXHAUSTION"
    TOKEN_BUDGET_EXHAUSTED = "TOKEN_BUDGET_EXHAUSTED"
    ESCALATION_BUDGET_EXHAUSTED = "ESCALATION_BUDGET_EXHAUSTED"
    HUMAN_REJECTED = "HUMAN_REJECTED"
    EXECUTION_CONSTRAINT_VIOLATED = "EXECUTION_CONSTRAINT_VIOLATED"
    EXECUTION_FAILED = "EXECUTION_FAILED"
    COMPENSATED = "COMPENSATED"
    KERNEL_FAULT = "KERNEL_FAULT"
    KERNEL_STOPPING = "KERNEL_STOPPING"
    """Reserved: this kernel never records it (a stopping kernel raises KernelShutdown)."""
    INTERRUPTED = "INTERRUPTED"
    ACTION_MISMATCH = "ACTION_MISMATCH"
    AMBIGUOUS = "AMBIGUOUS"
    """For packs: a policy trigger cannot tell what was meant and asks a human."""
    AGENT_SILENT = "AGENT_SILENT"
    REASONING_TIMEOUT = "REASONING_TIMEOUT"
    UNKNOWN_LIMIT = "UNKNOWN_LIMIT"
    """An amendment names a limit no loaded pack declares amendable."""
    LIMIT_OUT_OF_BOUNDS = "LIMIT_OUT_OF_BOUNDS"
    """An amendment's value lies outside the floor and ceiling its pack allows."""
    GUARD_EMERGENCY = "GUARD_EMERGENCY"
    """A soft guard's emergency rule blocked the proposal (confidence above its threshold)."""
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    """An adapter call may have taken effect and no answer says so: reconcile or retry."""
    CREDENTIAL_INVALID = "CREDENTIAL_INVALID"
    """A handshake without the agent's provisioned credential, or with another (kernel.registry)."""
    MISSING_PROVENANCE = "MISSING_PROVENANCE"
    """A belief write names no observation, or one that was never recorded (kernel.beliefs)."""
    DIRECT_CANONICAL_WRITE_FORBIDDEN = "DIRECT_CANONICAL_WRITE_FORBIDDEN"
    """A proposal asserts a belief state or writes the canonical graph itself (kernel.beliefs)."""
    SIGNATURE_INVALID = "SIGNATURE_INVALID"
    """An inbox request without valid proof: unsigned, a signature that does not verify, a key
    the kernel does not trust (or no longer), or signed for another journal (kernel.inbox)."""
    REQUEST_REPLAYED = "REQUEST_REPLAYED"
    """An inbox request whose id another row already carried: a copy is never taken twice."""
    REQUEST_EXPIRED = "REQUEST_EXPIRED"
    """An inbox request taken later than its validity window (its signing time plus the
    window it names, bounded by the keyring's policy), or signed with no time at all."""
    REQUEST_NOT_YET_VALID = "REQUEST_NOT_YET_VALID"
    """An inbox request signed at a time later than the kernel's clock (by more than the
    keyring's policy tolerates): future-dated, so it could be held and used later."""
    SELF_APPROVAL_FORBIDDEN = "SELF_APPROVAL_FORBIDDEN"
    """The operator deciding on a flow is its proposer, and its pack does not allow that."""
    AGENT_IN_SESSION = "AGENT_IN_SESSION"
    """A proposal from the inbox for an agent hosted in the kernel or holding a session."""
    CONSTRAINT_CONFLICT = "CONSTRAINT_CONFLICT"
    """A new constraint contradicts an active one (one requires what the other prohibits in
    the same scope, or the same constraint at another priority); the detail names both."""
    ARTIFACT_MISSING = "ARTIFACT_MISSING"
    """A referenced artifact's bytes are not in the store, or no longer hash to the reference."""
    APPROVAL_SUPERSEDED = "APPROVAL_SUPERSEDED"
    """An approved (or granted, or queued) action judged again when it is about to execute no
    longer passes the packs, limits and budgets in force (kernel.dim): refused, or escalated
    again, as its pack says (``PolicyPack.on_superseded``)."""
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"
    """A money ceiling of the pack (per decision, per flow tree, rolling per agent, session
    or desk) has no room for the proposal's amount: refused, or escalated, as the pack says."""
    DUPLICATE_VOTE = "DUPLICATE_VOTE"
    """An operator voted on this approval (or grant) already: a quorum counts each once."""
    GRANT_NOT_LIVE = "GRANT_NOT_LIVE"
    """A grant act names a grant that is unknown, revoked, expired or (for a vote) no longer
    waiting for its quorum."""
    PRINCIPAL_MISSING = "PRINCIPAL_MISSING"
    """A call on behalf of nobody: no principal came with it and the kernel was opened with no
    default principal its host vouches for (docs/identity.md)."""
    PRINCIPAL_INVALID = "PRINCIPAL_INVALID"
    """A principal's credential did not verify: a user token unsigned, expired, for another
    audience, or signed by a key the kernel does not trust."""
    TENANT_NOT_MEMBER = "TENANT_NOT_MEMBER"
    """The principal is not a member of the tenant the call names (or the tenant is not
    declared in a kernel that declares tenants)."""
    CROSS_TENANT = "CROSS_TENANT"
    """A read or an act on another tenant's records than the caller's own."""
    SCOPE_MISSING = "SCOPE_MISSING"
    """The principal lacks a scope the kind requires (all of them are required)."""
    SCOPE_NOT_DELEGATED = "SCOPE_NOT_DELEGATED"
    """A scope the kind requires was not handed on by every hop of the delegation chain."""
    POLICY_DENIED = "POLICY_DENIED"
    """The tenant's policy denies the kind to this tier or user (the most specific layer)."""
    RATE_LIMITED = "RATE_LIMITED"
    """The user's calls at this tier within the last minute reached the tenant's limit."""
    GOVERNANCE_UNAVAILABLE = "GOVERNANCE_UNAVAILABLE"
    """The journal's store cannot be reached and the tenant fails closed for this kind."""
    DELEGATION_INVALID = "DELEGATION_INVALID"
    """A delegation names an agent, a parent or a principal that does not fit: the parent is
    another principal's, or its agent is not the delegating one."""
    SHADOW_NOT_LOADED = "SHADOW_NOT_LOADED"
    """A shadow act names a pack that has no shadow judging (none loaded, or retired,
    promoted, or ended by a restart), or a shadow whose version is not the one named."""
    SHADOW_INVALID = "SHADOW_INVALID"
    """A candidate pack cannot shadow: it does not validate, shadows no enforced pack of its
    name, drops a kind the enforced version defines, or is the enforced version itself."""
    SHADOW_REPORT_CHANGED = "SHADOW_REPORT_CHANGED"
    """A promotion names the digest of the report it was reviewed on, and the shadow's report
    over the journal now has another (differences recorded since): review it again."""


RESERVED_REASONS: frozenset[ReasonCode] = frozenset(
    {ReasonCode.AMBIGUOUS, ReasonCode.KERNEL_STOPPING}
)
"""Members the kernel itself never records: for packs to name, or reserved. Kept,
as every member is: a pack may name any member and old journals must still decode."""


class StopReason(StrEnum):
    """Why a kernel stopped: recorded in ``KernelStopped``, carried by ``KernelShutdown``."""

    KERNEL_CLOSED = "KERNEL_CLOSED"
    """Its ``open_kernel`` block ended: the ordinary way to stop."""
    RESTART_INTENSITY_EXCEEDED = "RESTART_INTENSITY_EXCEEDED"
    """An actor failed more often than its supervisor allows in the period."""
    JOURNAL_FAILED = "JOURNAL_FAILED"
    """The journal could not be written: nothing more can be recorded."""
    KERNEL_FAILED = "KERNEL_FAILED"
    """A task of the kernel raised what nothing handles (a bug, or input that should have
    been refused): the detail names the exception. Never recorded as a clean close."""
    HISTORY_CORRUPT = "HISTORY_CORRUPT"
    """The chain before the latest snapshot, which a kernel checks after it opened, does not
    check: an event there is missing or altered (the detail names its seq). Opening refuses
    such a journal when the fault lies after the snapshot."""


class CliError(StrEnum):
    """What ``dirk`` prints as ``error: CODE: ...`` (or in a FAILED line) when no reason code fits.

    Where an operator's command meets a condition the kernel itself would
    refuse for (``UNKNOWN_AGENT``, ``FLOW_NOT_ACTIVE``, ...), ``dirk`` prints
    that ``ReasonCode`` instead; the two sets never share a spelling.
    """

    BAD_ARGUMENT = "BAD_ARGUMENT"
    """Flags that do not go together, or a flag value that does not parse."""
    UNKNOWN_FLOW = "UNKNOWN_FLOW"
    """No flow with that DFID in the journal."""
    UNKNOWN_RULE = "UNKNOWN_RULE"
    """No rule with that id in the journal."""
    UNKNOWN_SEQ = "UNKNOWN_SEQ"
    """No event with that seq in the journal."""
    RULE_NOT_PENDING = "RULE_NOT_PENDING"
    """No deferred rule proposal with that seq to override or skip."""
    DECISION_QUEUED = "DECISION_QUEUED"
    """A decision on that flow already waits in the inbox for the kernel."""
    CONFIRMATION_REQUIRED = "CONFIRMATION_REQUIRED"
    """Approving a HIGH_IMPACT action takes its short hash typed back (``--confirm``)."""
    NOT_TAKEN = "NOT_TAKEN"
    """The kernel did not take the inbox row within ``--wait``."""
    NOT_APPLIED = "NOT_APPLIED"
    """The kernel took the inbox row but recorded nothing the command knows."""
    NO_EXPORTER = "NO_EXPORTER"
    """``traces export`` has no OTLP endpoint to send to."""
    EXPORT_TIMEOUT = "EXPORT_TIMEOUT"
    """The collector did not take the spans in time."""
    EXPORT_FAILED = "EXPORT_FAILED"
    """The collector refused some spans."""
    PACK_MISMATCH = "PACK_MISMATCH"
    """``verify --verdicts``: a given pack is not the one the verdicts were recorded under."""
    BAD_PACK_PATH = "BAD_PACK_PATH"
    """A ``--pack`` names no loadable pack (``PackPathError.code``)."""
    JOURNAL_ERROR = "JOURNAL_ERROR"
    """The file is not a readable journal (``JournalError.code`` and its subclasses' below)."""
    JOURNAL_CORRUPT = "JOURNAL_CORRUPT"
    JOURNAL_KEY = "JOURNAL_KEY"
    JOURNAL_FOREIGN = "JOURNAL_FOREIGN"
    JOURNAL_VERSION = "JOURNAL_VERSION"
    JOURNAL_CLOSED = "JOURNAL_CLOSED"
    JOURNAL_WRITE_FAILED = "JOURNAL_WRITE_FAILED"
    JOURNAL_FENCED = "JOURNAL_FENCED"
    """Another kernel moved the journal's head: this writer lost its lease and stopped writing."""
    JOURNAL_UNREACHABLE = "JOURNAL_UNREACHABLE"
    """The journal's store cannot be reached (a PostgreSQL server down): nothing can be read or
    recorded until it is back."""
    AMBIGUOUS_FLOW = "AMBIGUOUS_FLOW"
    """A DFID prefix (or trace id prefix) given to ``dirk show`` fits more than one flow."""
    EXTRA_MISSING = "EXTRA_MISSING"
    """The command needs an optional extra that is not installed (``dir-kernel[console]``)."""
    SIGN_IN_THROTTLED = "SIGN_IN_THROTTLED"
    """``dirk console``: too many failed sign-ins under that name or from that address."""
    KEY_UNUSABLE = "KEY_UNUSABLE"
    """A private or public key file (or key text) cannot be read or is not an Ed25519 key."""
    NO_CHECKPOINT = "NO_CHECKPOINT"
    """No signed checkpoint covers the events asked for (``dirk checkpoint`` signs one)."""
    PROOF_FAILED = "PROOF_FAILED"
    """A checkpoint, a proof or an evidence bundle does not verify against the keys given."""
    WITNESS_REFUSED = "WITNESS_REFUSED"
    """``dirk witness`` refused a checkpoint: not signed, or not consistent with the last it
    cosigned (a truncated, rewritten or forked history)."""


class ExitCode(IntEnum):
    """``dirk``'s exit status."""

    OK = 0
    """The command did its work (a decision was queued, a journal verified)."""
    FAILED = 1
    """It ran and the answer is no: a check failed, something named is unknown, a change
    is refused, the collector did not take the spans."""
    USAGE = 2
    """It could not run as given: bad flags or flag values, an unreadable journal, no exporter."""
    INTERRUPTED = 130
    """Ctrl-C (128 + SIGINT)."""
    CLOSED_PIPE = 141
    """Its reader went away (``dirk flows | head -1``): quiet, as SIGPIPE would be (128 + 13)."""
