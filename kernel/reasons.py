"""The closed set of reason codes shared by events, feedback, the CLI and spans."""

from __future__ import annotations

from enum import StrEnum


class ReasonCode(StrEnum):
    """Why a proposal, a handshake or a flow ended the way it did.

    The set is closed: every refusal anywhere in the kernel names one of these,
    so logs, dashboards and tests can match on them without parsing prose.
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
    INTERRUPTED = "INTERRUPTED"
    ACTION_MISMATCH = "ACTION_MISMATCH"
    AMBIGUOUS = "AMBIGUOUS"
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
