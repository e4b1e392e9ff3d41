"""The Decision Intelligence Runtime kernel.

Agents propose; this kernel, with no LLM inside, compiles their context,
validates every proposal deterministically, escalates to a human when it must,
executes accepted intents exactly once, and records every step in a
hash-chained journal.

This namespace is for the code that embeds a kernel. Pack authors use
:mod:`kernel.policy`, adapter authors :mod:`kernel.adapters`, tools
:mod:`kernel.audit`, tests and simulations :mod:`kernel.testing`, and agent
authors :mod:`agents_sdk`.
"""

from kernel.api import Kernel
from kernel.api.approving import action_hash
from kernel.api.decisions import Decision, DecisionVerdict
from kernel.boot import open_kernel
from kernel.config import KernelConfig, Limits, Ports, Storage, Supervision
from kernel.core.errors import KernelFault, KernelShutdown
from kernel.core.events import Feedback, Manifest, PackRef, Principal, ProposalRecord
from kernel.core.fetching import ArtifactSlice, FetchRefused
from kernel.core.flow import TERMINAL, FlowState, FlowStatus
from kernel.core.ports import Clock, IdSource, RandomIds, SystemClock
from kernel.core.reasons import ReasonCode, StopReason
from kernel.core.wall import InputInvalid
from kernel.escalation import EscalationPolicy
from kernel.inbox.keyring import keyring_problem
from kernel.journal.store import JournalError
from kernel.memory import MEMORY_PACK
from kernel.policy.contracts import (
    HandshakeRefused,
    Outcome,
    Proposal,
    Session,
    Verdict,
    WorkingContext,
)
from kernel.policy.escalations import EscalationBudget
from kernel.policy.packs import PackError
from kernel.proofs.signing import Signing, write_signing_key
from kernel.registry import credential_verifier
from kernel.runtime.messages import Decision as HumanDecision
from kernel.state.amendments import AmendmentInvalid
from kernel.state.approvals import Approval, ApprovalStatus
from kernel.state.projections import AgentStatus
from kernel.state.rulebook import LexicalSearch, RuleNotPending, RuleSearch

__all__ = [
    "MEMORY_PACK",
    "TERMINAL",
    "AgentStatus",
    "AmendmentInvalid",
    "Approval",
    "ApprovalStatus",
    "ArtifactSlice",
    "Clock",
    "Decision",
    "DecisionVerdict",
    "EscalationBudget",
    "EscalationPolicy",
    "Feedback",
    "FetchRefused",
    "FlowState",
    "FlowStatus",
    "HandshakeRefused",
    "HumanDecision",
    "IdSource",
    "InputInvalid",
    "JournalError",
    "Kernel",
    "KernelConfig",
    "KernelFault",
    "KernelShutdown",
    "LexicalSearch",
    "Limits",
    "Manifest",
    "Outcome",
    "PackError",
    "PackRef",
    "Ports",
    "Principal",
    "Proposal",
    "ProposalRecord",
    "RandomIds",
    "ReasonCode",
    "RuleNotPending",
    "RuleSearch",
    "Session",
    "Signing",
    "StopReason",
    "Storage",
    "Supervision",
    "SystemClock",
    "Verdict",
    "WorkingContext",
    "action_hash",
    "credential_verifier",
    "keyring_problem",
    "open_kernel",
    "write_signing_key",
]
