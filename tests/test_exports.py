"""The public names of the kernel are pinned: changing them is a decision, not an accident."""

import agents_sdk
import kernel


def test_kernel_exports():
    assert sorted(kernel.__all__) == sorted(
        [
            "ALLOW",
            "MEMORY_PACK",
            "TERMINAL",
            "Consume",
            "LimitSpec",
            "OneOf",
            "Range",
            "Rule",
            "RuleVerdict",
            "StateMatch",
            "Threshold",
            "View",
            "deny",
            "rule",
            "DecimalStr",
            "Adapter",
            "AdapterError",
            "Approval",
            "ApprovalStatus",
            "EscalateOperational",
            "EscalationBudget",
            "EscalationPolicy",
            "Impact",
            "NeedsHuman",
            "AgentStatus",
            "Clock",
            "Decision",
            "Event",
            "ExecutionIntent",
            "FlowState",
            "FlowStatus",
            "AmendmentInvalid",
            "Guard",
            "GuardFinding",
            "HandshakeRefused",
            "SoftGuard",
            "IdSource",
            "IllegalTransition",
            "JournalError",
            "JournalFaults",
            "Kernel",
            "KernelFault",
            "LexicalSearch",
            "RuleNotPending",
            "RuleSearch",
            "RuleSource",
            "rejudge",
            "KernelShutdown",
            "MailboxClosed",
            "MemoryState",
            "Manifest",
            "ManualClock",
            "Outcome",
            "PackError",
            "PolicyKind",
            "PolicyPack",
            "Projections",
            "Proposal",
            "ProposalRecord",
            "Quote",
            "RandomIds",
            "Receipt",
            "ReasonCode",
            "RestartIntensityExceeded",
            "RetryPolicy",
            "SagaStep",
            "SeededIds",
            "Session",
            "SystemClock",
            "ValidationFeedback",
            "Verdict",
            "WorkingContext",
            "fold",
            "idempotency_key",
            "open_journal",
            "open_kernel",
            "state_at",
            "verify_journal",
            "verify_projections",
            "whatif",
        ]
    )
    for name in kernel.__all__:
        assert getattr(kernel, name) is not None


def test_sdk_exports_only_kernel_public_names():
    for name in agents_sdk.__all__:
        if name != "Agent":
            assert getattr(agents_sdk, name) is getattr(kernel, name)
