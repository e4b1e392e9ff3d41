"""The public names of each namespace are pinned: changing them is a decision, not an accident.

``kernel`` is for embedding code, ``kernel.policy`` for pack authors, ``kernel.adapters``
for adapter authors, ``kernel.audit`` for tools, ``kernel.testing`` for tests and
simulations (pinned in test_testing_exports.py), ``agents_sdk`` for agent authors.
"""

import ast
from types import ModuleType

import pytest

import agents_sdk
import kernel
import kernel.adapters
import kernel.audit
import kernel.beliefs
import kernel.frameworks
import kernel.gateway
import kernel.policy
from tests.support import ROOT

PINNED = {
    kernel: [
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
        "MEMORY_PACK",
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
        "TERMINAL",
        "Verdict",
        "WorkingContext",
        "action_hash",
        "keyring_problem",
        "credential_verifier",
        "open_kernel",
        "write_signing_key",
    ],
    kernel.policy: [
        "ALLOW",
        "Budget",
        "Consume",
        "Cost",
        "DecimalStr",
        "EscalationBudget",
        "Guard",
        "GuardFinding",
        "Impact",
        "LimitSpec",
        "ModelPrice",
        "Monitor",
        "NeedsHuman",
        "OneOf",
        "PackError",
        "PolicyKind",
        "PolicyPack",
        "Quorum",
        "Range",
        "Rule",
        "RuleVerdict",
        "SoftGuard",
        "StateMatch",
        "Threshold",
        "View",
        "deny",
        "format_money",
        "parse_money",
        "rule",
    ],
    kernel.adapters: [
        "Adapter",
        "AdapterError",
        "ExecutionIntent",
        "idempotency_key",
        "Quote",
        "Receipt",
        "RetryPolicy",
        "SagaStep",
    ],
    kernel.audit: [
        "Budgets",
        "Event",
        "Grants",
        "events",
        "fold",
        "IllegalTransition",
        "JournalError",
        "MemoryState",
        "NoShadow",
        "open_journal",
        "payload_of",
        "payloads",
        "Projections",
        "rejudge",
        "report_lines",
        "RuleSource",
        "ShadowReport",
        "state_at",
        "verify_journal",
        "verify_projections",
        "whatif",
        "copy_journal",
        "follow_journal",
        "history_report",
        "live_report",
        "check_checkpoints",
        "read_keys",
        "export_bundle",
        "verify_bundle",
        "redact",
    ],
    kernel.frameworks: ["Gate", "STOPS", "ToolSpec", "stops", "tool_spec", "tool_specs"],
    kernel.gateway: [
        "CALL_META",
        "CONVERSATION_META",
        "ConfigError",
        "Gateway",
        "GatewayConfig",
        "GatewayServer",
        "LimitDef",
        "Listing",
        "PackFailure",
        "Route",
        "ToolInfo",
        "ToolPolicy",
        "Upstream",
        "UpstreamDown",
        "UpstreamExecutor",
        "UpstreamSpec",
        "answer",
        "config_of",
        "gateway_pack",
        "open_gateway",
        "pack_of",
        "read_config",
        "write_listing",
    ],
    kernel.beliefs: [
        "BELIEFS_ADAPTER",
        "EDGE_TYPES",
        "GOVERNANCE_PACK",
        "HOUR_NS",
        "KINDS",
        "PRECEDENCE",
        "SCALE",
        "TEST_ADAPTER",
        "Applied",
        "ArchiveEpisode",
        "Archived",
        "Assessment",
        "AttachContradiction",
        "AttachSupport",
        "BeliefGraph",
        "BeliefState",
        "BeliefsExecutor",
        "Call",
        "ConsolidationRecorded",
        "Edge",
        "EntityCandidateRecorded",
        "EntityRecord",
        "EpisodeArchived",
        "Evidence",
        "EvidenceAttached",
        "Impact",
        "IngestTestResult",
        "LinkEntityCandidate",
        "ObservationRecord",
        "ObservationRecorded",
        "PropositionProposed",
        "PropositionRecord",
        "PropositionTransitioned",
        "ProposeProposition",
        "ProposeTest",
        "RecordObservation",
        "RequestConsolidation",
        "SourceRecord",
        "SourceRegistered",
        "TestRecord",
        "TestResultIngested",
        "TransitionRecord",
        "Volatility",
        "Workbench",
        "assess",
        "benefit",
        "check",
        "classify",
        "confidence",
        "diversity",
        "effects",
        "freshness",
        "group_weight",
        "micro",
        "promotable",
        "scoring",
        "show",
        "staleness",
        "suppressed",
        "transform",
        "triggers",
        "weight",
    ],
}
PUBLIC = {
    "kernel",
    "kernel.policy",
    "kernel.adapters",
    "kernel.audit",
    "kernel.testing",
    "kernel.mesh",  # hosts and executors on the bus (dir-kernel[nats])
    "kernel.beliefs",  # governed beliefs: the pure model, the governance pack, the graph
    # The agent frameworks: tools from kinds, the gate, one adapter per framework (its extra).
    "kernel.frameworks",
    "kernel.frameworks.openai_agents",
    "kernel.frameworks.pydantic_ai",
    "kernel.frameworks.langgraph",
    "kernel.gateway",  # the governing MCP gateway, `dirk mcp proxy` (dir-kernel[mcp])
}


@pytest.mark.parametrize("namespace", list(PINNED), ids=lambda m: m.__name__)
def test_each_namespace_exports_exactly_its_pinned_names(namespace: ModuleType) -> None:
    assert sorted(namespace.__all__) == sorted(PINNED[namespace])
    for name in namespace.__all__:
        assert getattr(namespace, name) is not None


def test_sdk_exports_only_kernel_public_names() -> None:
    for name in agents_sdk.__all__:
        if name != "Agent":
            assert getattr(agents_sdk, name) is getattr(kernel, name)


@pytest.mark.parametrize("tree", ["policies", "agents_sdk", "examples"])
def test_user_code_imports_only_public_namespaces(tree: str) -> None:
    """Packs, the SDK and the examples are written the way users write: public names only."""
    private = []
    for path in sorted((ROOT / tree).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                module = node.module
            elif isinstance(node, ast.Import):
                module = node.names[0].name
            else:
                continue
            if module.split(".")[0] == "kernel" and module not in PUBLIC:
                private.append(f"{path.relative_to(ROOT)}:{node.lineno} {module}")
    assert private == []
