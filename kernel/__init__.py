"""The Decision Intelligence Runtime kernel.

Agents propose; this kernel, with no LLM inside, compiles their context,
validates every proposal deterministically, escalates to a human when it must,
executes accepted intents exactly once, and records every step in a
hash-chained journal.
"""

from kernel.adapters.contract import (
    Adapter,
    AdapterError,
    Quote,
    Receipt,
    RetryPolicy,
    SagaStep,
    idempotency_key,
)
from kernel.api import Kernel
from kernel.audit.counterfactual import whatif
from kernel.audit.reverify import rejudge
from kernel.boot import open_kernel
from kernel.core.errors import KernelFault, KernelShutdown
from kernel.core.events import Event, ExecutionIntent, Manifest, ProposalRecord, RuleSource
from kernel.core.flow import TERMINAL, FlowState, FlowStatus, IllegalTransition
from kernel.core.ports import Clock, IdSource, ManualClock, RandomIds, SeededIds, SystemClock
from kernel.core.reasons import ReasonCode, StopReason
from kernel.core.wall import InputInvalid
from kernel.escalation import EscalationPolicy
from kernel.journal.store import (
    JournalError,
    JournalFaults,
    open_journal,
)
from kernel.journal.verify import verify_journal
from kernel.memory import MEMORY_PACK
from kernel.policy.contracts import (
    HandshakeRefused,
    Outcome,
    Proposal,
    Session,
    ValidationFeedback,
    Verdict,
    WorkingContext,
)
from kernel.policy.guards import Guard, GuardFinding, SoftGuard
from kernel.policy.kinds import Impact, NeedsHuman, PolicyKind
from kernel.policy.packs import Consume, LimitSpec, PackError, PolicyPack, Threshold
from kernel.policy.rules import (
    ALLOW,
    DecimalStr,
    OneOf,
    Range,
    Rule,
    RuleVerdict,
    StateMatch,
    View,
    deny,
    rule,
)
from kernel.runtime.actors import MailboxClosed, RestartIntensityExceeded
from kernel.runtime.messages import Decision
from kernel.state.amendments import AmendmentInvalid
from kernel.state.approvals import Approval, ApprovalStatus, EscalationBudget
from kernel.state.memory import MemoryState
from kernel.state.projections import AgentStatus, Projections, fold
from kernel.state.rulebook import LexicalSearch, RuleNotPending, RuleSearch
from kernel.state.snapshots import state_at, verify_projections

__all__ = [
    "ALLOW",
    "MEMORY_PACK",
    "TERMINAL",
    "Adapter",
    "AdapterError",
    "AgentStatus",
    "AmendmentInvalid",
    "Approval",
    "ApprovalStatus",
    "Clock",
    "Consume",
    "DecimalStr",
    "Decision",
    "EscalationBudget",
    "EscalationPolicy",
    "Event",
    "ExecutionIntent",
    "FlowState",
    "FlowStatus",
    "Guard",
    "GuardFinding",
    "HandshakeRefused",
    "IdSource",
    "IllegalTransition",
    "Impact",
    "InputInvalid",
    "JournalError",
    "JournalFaults",
    "Kernel",
    "KernelFault",
    "KernelShutdown",
    "LexicalSearch",
    "LimitSpec",
    "MailboxClosed",
    "Manifest",
    "ManualClock",
    "MemoryState",
    "NeedsHuman",
    "OneOf",
    "Outcome",
    "PackError",
    "PolicyKind",
    "PolicyPack",
    "Projections",
    "Proposal",
    "ProposalRecord",
    "Quote",
    "RandomIds",
    "Range",
    "ReasonCode",
    "Receipt",
    "RestartIntensityExceeded",
    "RetryPolicy",
    "Rule",
    "RuleNotPending",
    "RuleSearch",
    "RuleSource",
    "RuleVerdict",
    "SagaStep",
    "SeededIds",
    "Session",
    "SoftGuard",
    "StateMatch",
    "StopReason",
    "SystemClock",
    "Threshold",
    "ValidationFeedback",
    "Verdict",
    "View",
    "WorkingContext",
    "deny",
    "fold",
    "idempotency_key",
    "open_journal",
    "open_kernel",
    "rejudge",
    "rule",
    "state_at",
    "verify_journal",
    "verify_projections",
    "whatif",
]
