"""Why a human decision or a vote cannot be taken: the desk's checks, one rule a step.

Pure functions of the decision and what it is made on, kept apart from the desk's
actor so each rule reads alone and the order they are tried in stays in one place.
"""

from __future__ import annotations

import unicodedata

from kernel.core.events import ExecutionIntent
from kernel.core.flow import RESOLVE_WORDS, FlowState
from kernel.core.reasons import ReasonCode
from kernel.policy.quorums import eligible
from kernel.policy.quorums import waiting as waiting_text
from kernel.runtime.messages import Decide, Decision
from kernel.state.approvals import RECONCILE, REJECT_WORDS, Approval, reconcile_problem
from kernel.state.quorums import Ballot

Problem = tuple[ReasonCode, str, str]
"""A refusal: its reason code, its detail and the field of the decision it is about."""


def same_principal(operator: str, agent_id: str) -> bool:
    """Tell whether an operator's name and an agent's id name one principal.

    Operators and agents share one namespace (the keyring names both), so an MCP
    principal acting as agent ``ana`` and as operator ``ana`` is one principal. Names
    compare as a reader sees them: NFKC-normalized and case-folded, so ``Ana``, ``ana``
    and ``ana`` in full-width letters are one name, and surrounding blanks do not count.
    """

    def seen(name: str) -> str:
        return unicodedata.normalize("NFKC", name).casefold().strip()

    return bool(operator) and seen(operator) == seen(agent_id)


def decision_problem(msg: Decide, approval: Approval, flow: FlowState) -> Problem | None:
    """Return why ``msg`` cannot be applied to ``approval`` (code, detail, field), or None."""
    problem = _form_problem(msg, approval)
    if problem is not None:
        return problem
    if flow.pending is not None:
        return _unknown_outcome_problem(msg, flow.pending)
    return _settled_problem(msg, approval)


def _form_problem(msg: Decide, approval: Approval) -> Problem | None:
    """The decision's own form: who, why, and the action it names."""
    if not msg.operator or not msg.reason:
        field = "operator" if not msg.operator else "reason"
        return (
            ReasonCode.SCHEMA_INVALID,
            "a human decision needs an operator and a reason",
            field,
        )
    if msg.action_hash is not None and not approval.names(msg.action_hash):
        detail = (
            f"the decision names action {msg.action_hash[:16]!r}, but the flow waits"
            f" for a decision on action {approval.short_hash!r}"
        )
        return ReasonCode.ACTION_MISMATCH, detail, "action_hash"
    if msg.inbox_id is not None and msg.action_hash is None:
        detail = "a decision from the operator inbox must name the action it was made on"
        return ReasonCode.ACTION_MISMATCH, detail, "action_hash"
    return None


def _unknown_outcome_problem(msg: Decide, pending: ExecutionIntent) -> Problem | None:
    """An effect that may have happened takes only reconcile or retry."""
    if msg.decision not in RESOLVE_WORDS:
        detail = (
            f"the effect of this flow may have happened (key {pending.key});"
            f" {msg.decision} would leave the world and the record apart:"
            " reconcile (done with the external id, or not done) or retry"
        )
        return ReasonCode.OUTCOME_UNKNOWN, detail, "decision"
    if msg.decision == RECONCILE:
        problem = reconcile_problem(msg.params)
        if problem is not None:
            return ReasonCode.SCHEMA_INVALID, problem, "params"
    return None


def _settled_problem(msg: Decide, approval: Approval) -> Problem | None:
    """An escalation whose outcome is known takes approve, modify or reject."""
    if msg.decision in RESOLVE_WORDS:
        detail = (
            f"{msg.decision} applies only to an intent whose outcome is unknown;"
            f" this flow escalated for {approval.reason_code}"
        )
        return ReasonCode.SCHEMA_INVALID, detail, "decision"
    if msg.decision not in REJECT_WORDS and not approval.action_hash:
        detail = f"there is no proposed action to {msg.decision} ({approval.reason_code})"
        return ReasonCode.SCHEMA_INVALID, detail, "decision"
    if msg.decision is Decision.MODIFY and msg.params is None:
        return ReasonCode.SCHEMA_INVALID, "a modification needs the new parameters", "params"
    return None


def excluded_voter(msg: Decide, ballot: Ballot) -> tuple[ReasonCode, str] | None:
    """Refuse the proposer or a modifier of the action a vote on it (code, detail)."""
    excluded = next((who for who in ballot.excluded if same_principal(msg.operator, who)), None)
    if excluded is None:
        return None
    role = "proposed" if excluded == ballot.excluded[0] else "modified"
    return (
        ReasonCode.SELF_APPROVAL_FORBIDDEN,
        f"{msg.operator} {role} this action and may not vote on it"
        f" ({ballot.waiting or waiting_text(ballot.quorum, [])})",
    )


def role_refusal(msg: Decide, ballot: Ballot) -> tuple[ReasonCode, str] | None:
    """Refuse a vote from an operator without a role the quorum names (code, detail)."""
    rule = ballot.quorum
    if msg.decision in REJECT_WORDS and rule.on_reject != "vote":
        # A rejection that ends the flow is anyone's to make, whatever the roles.
        return None
    if eligible(rule, msg.roles):
        return None
    return (
        ReasonCode.UNAUTHORIZED,
        f"this approval is voted by {' or '.join(rule.roles)};"
        f" {msg.operator} holds {', '.join(msg.roles) or 'no role'}",
    )
