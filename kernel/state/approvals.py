"""Approvals: what a human is asked to approve, as a durable state machine folded from events.

An escalation opens an approval bound to the hash of the exact action (the
DFID, the policy kind and its version, the parameters, the pack's content
hash), so a decision made on what the operator was shown can never approve
anything else::

    PENDING -> APPROVED -> CONSUMED (executed)
            -> MODIFIED (judged by the DIM again)
            -> REJECTED | EXPIRED
            -> RESOLVED (an unknown outcome reconciled or retried)

An escalation with reason OUTCOME_UNKNOWN (an adapter call may have taken
effect, and neither its answer nor ``lookup`` says whether) takes only
``reconcile`` (the human records what the system shows: done with its external
id, or not done) or ``retry`` (call again with the same key), never an
approval or a rejection, and it does not expire: the world may hold an effect
the journal does not, and only a human who looked may close that gap.

Like every projection, the fold reads no clock: expiry is a fact the
escalation desk records (ApprovalExpired) when it notices it.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any

import msgspec

from kernel.core.events import (
    ApprovalExpired,
    CompensationFailed,
    CompensationSucceeded,
    Event,
    ExecutionFailed,
    ExecutionStarted,
    ExecutionSucceeded,
    FlowAborted,
    FlowDirty,
    FlowEscalated,
    HumanDecided,
    Payload,
    ProposalRecord,
    digest,
)
from kernel.core.flow import RESOLVE_WORDS, FlowState
from kernel.core.reasons import ReasonCode
from kernel.policy.escalations import EscalationBudget
from kernel.policy.kinds import Impact
from kernel.policy.packs import PolicyCatalog

SHORT_HASH = 10
"""Characters of the action hash an operator reads and types back to approve."""

MIN_HASH = 8
"""The shortest prefix of an action hash a decision may name."""

APPROVE_WORDS = frozenset({"approve", "override"})
REJECT_WORDS = frozenset({"reject", "abort"})
RECONCILE = "reconcile"
RETRY = "retry"
DONE = "done"
NOT_DONE = "not_done"
"""The two outcomes a reconcile records (``params={"outcome": ..., "external_id": ...}``)."""


class ApprovalStatus(StrEnum):
    """Where an approval is in its lifecycle."""

    PENDING = "PENDING"
    APPROVED = "APPROVED"
    MODIFIED = "MODIFIED"
    REJECTED = "REJECTED"
    EXPIRED = "EXPIRED"
    CONSUMED = "CONSUMED"
    RESOLVED = "RESOLVED"


class Approval(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """The approval an escalation opened, as of the last event that touched it."""

    dfid: str
    agent_id: str
    action_hash: str
    impact: Impact
    reason_code: ReasonCode
    detail: str
    escalated_seq: int
    escalated_ts: int
    status: ApprovalStatus = ApprovalStatus.PENDING
    operator: str = ""
    reason: str = ""
    decided_ts: int = 0

    @property
    def short_hash(self) -> str:
        """The part of the action hash shown to (and typed back by) the operator."""
        return self.action_hash[:SHORT_HASH]

    def names(self, action_hash: str) -> bool:
        """Whether ``action_hash`` (whole, or a prefix of MIN_HASH or more) names this action."""
        return (
            bool(self.action_hash)
            and len(action_hash) >= MIN_HASH
            and self.action_hash.startswith(action_hash.lower())
        )


def action_hash(dfid: str, proposal: ProposalRecord, catalog: PolicyCatalog) -> str:
    """Return the hash an approval of ``proposal`` in flow ``dfid`` is bound to."""
    pack = catalog.pack_of.get(proposal.kind)
    return digest(
        {
            "dfid": dfid,
            "kind": proposal.kind,
            "version": proposal.version,
            "params": proposal.params,
            "pack": pack.hash if pack else "",
        }
    )


def impact_of(kind: str, catalog: PolicyCatalog) -> Impact:
    """Return the impact the pack declares for ``kind``; HIGH_IMPACT when it is unknown."""
    policy_kind = catalog.kinds.get(kind)
    return policy_kind.impact if policy_kind is not None else Impact.HIGH_IMPACT


def escalated_event(
    dfid: str,
    proposal: ProposalRecord | None,
    catalog: PolicyCatalog,
    reason_code: ReasonCode,
    detail: str,
) -> FlowEscalated:
    """Build the event that escalates a flow, with its impact and action hash."""
    if proposal is None:
        return FlowEscalated(reason_code=reason_code, detail=detail)
    return FlowEscalated(
        reason_code=reason_code,
        detail=detail,
        impact=impact_of(proposal.kind, catalog),
        action_hash=action_hash(dfid, proposal, catalog),
    )


def apply(approvals: dict[str, Approval], event: Event) -> None:
    """Fold one flow event into the approvals (events of other types are ignored)."""
    fold = _FOLDS.get(type(event.payload))
    if fold is not None:
        fold(approvals, event)


def _opened(approvals: dict[str, Approval], event: Event) -> None:
    payload: FlowEscalated = event.payload  # type: ignore[assignment]
    dfid = event.dfid or ""
    approvals[dfid] = Approval(
        dfid=dfid,
        agent_id=event.agent_id or "",
        action_hash=payload.action_hash,
        impact=Impact(payload.impact),
        reason_code=payload.reason_code,
        detail=payload.detail,
        escalated_seq=event.seq,
        escalated_ts=event.ts,
    )


def _pending(approvals: dict[str, Approval], event: Event) -> Approval | None:
    current = approvals.get(event.dfid or "")
    return current if current is not None and current.status is ApprovalStatus.PENDING else None


def _decided(approvals: dict[str, Approval], event: Event) -> None:
    current = _pending(approvals, event)
    if current is None:
        return
    payload: HumanDecided = event.payload  # type: ignore[assignment]
    approvals[current.dfid] = msgspec.structs.replace(
        current,
        status=_status_of(payload.decision),
        operator=payload.operator,
        reason=payload.reason,
        decided_ts=event.ts,
    )


def _status_of(decision: str) -> ApprovalStatus:
    """Return the status a human's decision word leaves a pending approval in."""
    if decision in APPROVE_WORDS:
        return ApprovalStatus.APPROVED
    if decision in REJECT_WORDS:
        return ApprovalStatus.REJECTED
    if decision in RESOLVE_WORDS:
        return ApprovalStatus.RESOLVED
    return ApprovalStatus.MODIFIED


def _expired(approvals: dict[str, Approval], event: Event) -> None:
    current = _pending(approvals, event)
    if current is not None:
        approvals[current.dfid] = msgspec.structs.replace(
            current, status=ApprovalStatus.EXPIRED, decided_ts=event.ts
        )


def _consumed(approvals: dict[str, Approval], event: Event) -> None:
    current = approvals.get(event.dfid or "")
    if current is not None and current.status is ApprovalStatus.APPROVED:
        approvals[current.dfid] = msgspec.structs.replace(current, status=ApprovalStatus.CONSUMED)


_FOLDS: dict[type[Payload], Callable[[dict[str, Approval], Event], None]] = {
    FlowEscalated: _opened,
    HumanDecided: _decided,
    ApprovalExpired: _expired,
    ExecutionStarted: _consumed,
}
"""What each event type does to the approval of its flow."""


def reconcile_problem(params: dict[str, Any] | None) -> str | None:
    """Return what is wrong with a reconcile's parameters, or None."""
    params = params or {}
    outcome = params.get("outcome")
    external_id = params.get("external_id")
    if outcome == DONE:
        if not isinstance(external_id, str) or not external_id.strip():
            return "a reconcile as done needs the external id the system shows"
        return None
    if outcome == NOT_DONE:
        return None if external_id in (None, "") else "a reconcile as not done has no external id"
    return f"a reconcile needs outcome {DONE!r} (with external_id) or {NOT_DONE!r}"


def reconciliation(
    flow: FlowState, catalog: PolicyCatalog, params: dict[str, Any], operator: str
) -> list[Payload]:
    """Return the events that record a human's reconcile of the flow's pending intent.

    Recorded in the same append as the decision, so a crash can never leave a
    reconciled flow to be called again. What follows (closing the flow, the
    next saga step, the next compensation) the execution engine does, as on
    recovery; a compensation found not done escalates with the partial state.
    """
    intent = flow.pending
    assert intent is not None
    detail = {"reconciled_by": operator}
    if params.get("outcome") == DONE:
        external_id = str(params["external_id"])
        if intent.compensation:
            return [
                CompensationSucceeded(
                    key=intent.key,
                    step=intent.step,
                    external_id=external_id,
                    detail=detail,
                    reconciled=True,
                )
            ]
        return [
            ExecutionSucceeded(
                key=intent.key, external_id=external_id, detail=detail, reconciled=True
            )
        ]
    error = f"not done (reconciled by {operator})"
    if intent.compensation:
        in_effect = list(range(1, intent.step + 1))
        undone = list(range(flow.done, intent.step, -1))
        event = escalated_event(
            flow.dfid,
            flow.proposal,
            catalog,
            ReasonCode.EXECUTION_FAILED,
            f"compensation of step {intent.step} ({intent.action}) {error};"
            f" steps {in_effect} are still in effect, steps {undone} were undone",
        )
        partial = {
            "in_effect": in_effect,
            "undone": undone,
            "failed_step": flow.done + 1,
            "failed_compensation": intent.step,
        }
        return [
            CompensationFailed(key=intent.key, step=intent.step, error=error),
            msgspec.structs.replace(event, partial=partial),
        ]
    failed = ExecutionFailed(key=intent.key, error=error)
    code = ReasonCode.EXECUTION_FAILED
    if flow.done > 0:
        # Earlier saga steps are in effect: the engine compensates them next.
        return [failed, FlowDirty(step=intent.step, reason_code=code, detail=error)]
    return [failed, FlowAborted(reason_code=code, detail=error)]


def over_budget(history: list[tuple[str, int]], bucket: EscalationBudget) -> set[str]:
    """Return the DFIDs whose escalation found the bucket empty.

    ``history`` holds (dfid, ts) of one agent's escalations since its bucket was
    last filled (registration or restoration), oldest first. The bucket is
    replayed over them, so the answer depends only on recorded times; an
    escalation over budget takes no token (its flow is aborted instead).
    """
    capacity = bucket.capacity
    # Tokens in units of 1/period ns, so the refill is exact integer arithmetic.
    unit = int(bucket.period_s * 1e9)
    full = capacity * unit
    tokens, last, over = full, None, set()
    for dfid, ts in history:
        if last is not None:
            tokens = min(full, tokens + (ts - last) * capacity)
        last = ts
        if tokens >= unit:
            tokens -= unit
        else:
            over.add(dfid)
    return over
