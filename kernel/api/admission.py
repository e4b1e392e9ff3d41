"""The operator's acts at the wall: every field checked before an act reaches an actor.

An act of the embedding code (``Kernel.decide``, ``Kernel.grant``...) is built as
its typed inbox request holding what the caller passed, of any type; before
kernel.api.acts applies it, :meth:`Admission.admit` checks it with the wall's specs
and records a refusal there (DecisionRefused, InputRefused). A request decoded
from the inbox was checked as it was decoded, and is not admitted again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from kernel.api.calls import Calls, Flows
from kernel.core import wall
from kernel.core.events import DecisionRefused, Draft, Event, Feedback, InputRefused
from kernel.core.reasons import ReasonCode
from kernel.core.wall import InputInvalid, clip
from kernel.inbox import (
    AgentStatusRequest,
    AmendRequest,
    CollectArtifactsRequest,
    DecideRequest,
    InboxRequest,
    RuleChangeRequest,
    RuleDecisionRequest,
)
from kernel.inbox.requests import normalized
from kernel.journal.store import Journal
from kernel.policy.contracts import Outcome, Verdict
from kernel.policy.kinds import Impact
from kernel.runtime.messages import Decision
from kernel.state.amendments import AmendmentInvalid
from kernel.state.approvals import APPROVE_WORDS
from kernel.state.projections import AgentStatus, Projections

T = TypeVar("T")


class Admission:
    """Checks the embedding code's acts at the wall, and records what it refuses.

    Args:
        journal: where refusals at the wall are recorded.
        projections: what the checks read (approvals, flows).
        calls: refuses once the kernel stopped.
        flows: recalls the flow a decision names (its approval is checked).
    """

    def __init__(
        self, journal: Journal, projections: Projections, calls: Calls, flows: Flows
    ) -> None:
        self._journal = journal
        self._projections = projections
        self._calls = calls
        self._flows = flows

    async def admit(self, request: InboxRequest) -> InboxRequest | Verdict:
        """Return an act of the embedding code checked at the wall; record a refusal there.

        A request decoded from the inbox was checked as it was decoded; one the Kernel's
        method built holds what the caller passed, of any type.
        """
        match request:
            case DecideRequest(dfid=dfid, decision=decision, operator=operator):
                if isinstance(dfid, str) and len(dfid) <= wall.MAX_ID:
                    await self._flows.recall(dfid)
                try:
                    return self._check_decision(request)
                except InputInvalid as exc:
                    return await self._refuse_decision(dfid, decision, operator, exc)
            case AgentStatusRequest(agent_id=agent_id, operator=operator):
                try:
                    checked = self._check_status(
                        wall.fields(
                            agent_id=agent_id,
                            status=request.status,
                            operator=operator,
                            reason=request.reason,
                        )
                    )
                except InputInvalid as exc:
                    await self.record_refusal("agent_status", exc, operator, target=agent_id)
                    raise
                return AgentStatusRequest(
                    agent_id=checked.agent_id,
                    status=AgentStatus(checked.status),
                    operator=checked.operator,
                    reason=checked.reason,
                )
            case AmendRequest(agent_id=agent_id):
                try:
                    # The agent names the event's envelope; kernel.state.amendments checks
                    # the rest.
                    agent_id = wall.admit({"agent_id": agent_id}, wall.AgentSpec).agent_id
                except InputInvalid as exc:
                    await self.record_refusal("amend", exc, request.operator, target=agent_id)
                    raise AmendmentInvalid(exc.reason_code, f"{exc.field}: {exc.detail}") from None
                return msgspec.structs.replace(request, agent_id=agent_id)
            case RuleDecisionRequest(proposal_seq=seq, operator=operator):
                self._calls.raise_if_stopped()
                await self.admit_act(
                    wall.fields(
                        proposal_seq=seq,
                        decision=request.decision,
                        operator=operator,
                        reason=request.reason,
                    ),
                    wall.RuleDecisionSpec,
                    "rule",
                    operator,
                    target=f"#{seq}",
                )
                return request
            case RuleChangeRequest(action="retract", rule=rule, operator=operator):
                self._calls.raise_if_stopped()
                act = await self.admit_act(
                    wall.fields(rule=rule, operator=operator, reason=request.reason, ns=request.ns),
                    wall.RuleRetractionSpec,
                    "rule",
                    operator,
                    target=rule,
                )
                return msgspec.structs.replace(
                    request, rule=act.rule, operator=act.operator, reason=act.reason, ns=act.ns
                )
            case CollectArtifactsRequest(operator=operator):
                self._calls.raise_if_stopped()
                await self.admit_act(
                    wall.fields(operator=operator, reason=request.reason),
                    wall.HumanActSpec,
                    "artifacts",
                    operator,
                    target="gc",
                )
                return request
            case _:
                # The inbox's request is the API's spec too: one set of bounds for both doors.
                return normalized(request)

    def _check_decision(self, request: DecideRequest) -> DecideRequest:
        """Return a human decision checked at the wall, or raise InputInvalid."""
        params = request.params
        checked = wall.admit(
            wall.fields(
                dfid=request.dfid,
                decision=request.decision,
                operator=request.operator,
                reason=request.reason,
                params=dict(params) if isinstance(params, Mapping) else params,
                action_hash=request.action_hash,
            ),
            wall.DecisionSpec,
        )
        try:
            word = Decision(checked.decision)
        except ValueError:
            words = ", ".join(d.value for d in Decision)
            raise InputInvalid("decision", f"a decision is one of {words}") from None
        approval = self._projections.approvals.get(checked.dfid)
        flow = self._projections.flows.get(checked.dfid)
        if (
            word in APPROVE_WORDS
            and not checked.action_hash
            # A flow whose effect may have happened refuses approval anyway, and says why.
            and (flow is None or flow.pending is None)
            and approval is not None
            and approval.action_hash  # else there is nothing to approve (escalation says so)
            and approval.impact is Impact.HIGH_IMPACT
        ):
            raise InputInvalid(
                "action_hash",
                "approving a HIGH_IMPACT action takes its action hash (as dirk decide --confirm)",
            )
        return DecideRequest(
            dfid=checked.dfid,
            decision=word,
            operator=checked.operator,
            reason=checked.reason,
            params=checked.params,
            action_hash=checked.action_hash,
        )

    async def admit_act(
        self, value: Mapping[str, Any], spec: type[T], entry: str, operator: Any, *, target: Any
    ) -> T:
        """Return a human act checked at the wall; record the refusal and raise if it fails."""
        try:
            return wall.admit(value, spec)
        except InputInvalid as exc:
            await self.record_refusal(entry, exc, operator, target=target)
            raise

    def _check_status(self, request: Mapping[str, Any]) -> wall.AgentStatusSpec:
        """Return an agent status change checked at the wall, or raise InputInvalid."""
        checked = wall.admit(request, wall.AgentStatusSpec)
        try:
            AgentStatus(checked.status)
        except ValueError:
            words = ", ".join(s.value for s in AgentStatus)
            raise InputInvalid("status", f"a status is one of {words}") from None
        return checked

    async def _refuse_decision(
        self, dfid: Any, decision: Any, operator: Any, exc: InputInvalid
    ) -> Verdict:
        """Record a decision the wall refused (on its flow when it names one) and answer it."""
        known = isinstance(dfid, str) and dfid in self._projections.flows
        detail = clip(f"{exc.field}: {exc.detail}", wall.MAX_DETAIL)
        refused = DecisionRefused(
            reason_code=exc.reason_code,
            decision=clip(decision, 32),
            operator=clip(operator) if operator is not None else "",
            detail=detail,
            target="" if known else clip(dfid),
        )
        self._calls.raise_if_stopped()
        await self._journal.append([Draft(payload=refused, dfid=dfid if known else None)])
        feedback = Feedback(
            reason_code=exc.reason_code, detail=detail, layer="schema", field=exc.field
        )
        return Verdict(outcome=Outcome.REFUSED, dfid=clip(dfid), feedback=feedback)

    async def record_refusal(
        self,
        entry: str,
        exc: Exception,
        operator: Any = "",
        *,
        target: Any = "",
        inbox_id: int | None = None,
    ) -> Event:
        """Record an act or an inbox row refused at the wall (every string clipped)."""
        refused = InputRefused(
            reason_code=getattr(exc, "reason_code", ReasonCode.SCHEMA_INVALID),
            entry=clip(entry, 32),
            field=clip(getattr(exc, "field", "$"), 64),
            detail=clip(getattr(exc, "detail", str(exc)), wall.MAX_DETAIL),
            operator=clip(operator) if operator is not None else "",
            target=clip(target) if target is not None else "",
            inbox_id=inbox_id,
        )
        self._calls.raise_if_stopped()
        [event] = await self._journal.append([Draft(payload=refused)])
        return event
