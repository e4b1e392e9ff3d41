"""The Decision Intelligence Runtime kernel.

Agents propose; this kernel, with no LLM inside, compiles their context,
validates every proposal deterministically, escalates to a human when it must,
executes accepted intents exactly once, and records every step in a
hash-chained journal.
"""

from kernel.actors import MailboxClosed, RestartIntensityExceeded
from kernel.adapters import Quote, RetryPolicy, SagaStep
from kernel.amendments import AmendmentInvalid
from kernel.approvals import Approval, ApprovalStatus, EscalationBudget
from kernel.boot import open_kernel
from kernel.contracts import (
    HandshakeRefused,
    Outcome,
    Proposal,
    Session,
    ValidationFeedback,
    Verdict,
    WorkingContext,
)
from kernel.counterfactual import whatif
from kernel.errors import KernelFault, KernelShutdown
from kernel.escalation import EscalationPolicy
from kernel.events import Event, ExecutionIntent, Manifest, ProposalRecord, RuleSource
from kernel.execution import Adapter, AdapterError, Receipt, idempotency_key
from kernel.flow import TERMINAL, FlowState, FlowStatus, IllegalTransition
from kernel.guards import Guard, GuardFinding, SoftGuard
from kernel.journal import (
    JournalError,
    JournalFaults,
    open_journal,
)
from kernel.kernel import Kernel
from kernel.memory import MemoryState
from kernel.memory_pack import MEMORY_PACK
from kernel.messages import Decision, EscalateOperational
from kernel.packs import (
    Consume,
    Impact,
    LimitSpec,
    NeedsHuman,
    PackError,
    PolicyKind,
    PolicyPack,
    Threshold,
)
from kernel.ports import Clock, IdSource, ManualClock, RandomIds, SeededIds, SystemClock
from kernel.projection import AgentStatus, Projections, fold
from kernel.reasons import ReasonCode, StopReason
from kernel.replay import state_at, verify_projections
from kernel.reverify import rejudge
from kernel.rulebook import LexicalSearch, RuleNotPending, RuleSearch
from kernel.rules import (
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
from kernel.verify import verify_journal
from kernel.wall import InputInvalid

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
    "EscalateOperational",
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
