"""The escalation manager: flows that need a human wait here for one.

A flow reaches ESCALATED when the DIM judges a proposal beyond what the
kernel may decide alone (below the confidence threshold, for now). A human
then overrides (the proposal executes as it is), modifies (the changed
proposal goes through the DIM again before anything executes) or aborts.
Every decision records who made it and why.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import msgspec

from kernel.actors import Mailbox, Outbox, Reply
from kernel.contracts import Outcome, Verdict
from kernel.events import Feedback, FlowAborted, HumanDecided, ProposalAccepted
from kernel.flow import FlowStatus
from kernel.integrity import Escalate, Execute, Validate
from kernel.reasons import ReasonCode


class Decision(StrEnum):
    """What a human may decide about an escalated flow."""

    OVERRIDE = "override"
    MODIFY = "modify"
    ABORT = "abort"


class Decide(msgspec.Struct, frozen=True, kw_only=True):
    dfid: str
    decision: Decision
    operator: str
    reason: str
    params: dict[str, Any] | None = None
    reply: Reply[Verdict] | None = None


class EscalationManager:
    """The escalation manager actor."""

    def __init__(self, integrity: Mailbox[Any], execution: Mailbox[Any]) -> None:
        self._integrity = integrity
        self._execution = execution

    async def handle(self, msg: Escalate | Decide, out: Outbox) -> None:
        match msg:
            case Escalate():
                # The flow is already recorded as ESCALATED; it waits for a Decide.
                return
            case Decide():
                self._decide(msg, out)

    def _decide(self, msg: Decide, out: Outbox) -> None:
        flow = out.flow(msg.dfid)
        if flow is None or flow.status is not FlowStatus.ESCALATED or flow.proposal is None:
            status = flow.status if flow else "unknown"
            feedback = Feedback(
                reason_code=ReasonCode.FLOW_NOT_ACTIVE,
                detail=f"flow {msg.dfid} is {status}, not waiting for a human decision",
                layer="escalation",
            )
            out.reply(msg.reply, Verdict(outcome=Outcome.REFUSED, dfid=msg.dfid, feedback=feedback))
            return
        if not msg.operator or not msg.reason:
            feedback = Feedback(
                reason_code=ReasonCode.SCHEMA_INVALID,
                detail="a human decision needs an operator and a reason",
                layer="escalation",
                field="operator" if not msg.operator else "reason",
            )
            out.reply(msg.reply, Verdict(outcome=Outcome.REFUSED, dfid=msg.dfid, feedback=feedback))
            return
        if msg.decision is Decision.MODIFY and msg.params is None:
            feedback = Feedback(
                reason_code=ReasonCode.SCHEMA_INVALID,
                detail="a modification needs the new parameters",
                layer="escalation",
                field="params",
            )
            out.reply(msg.reply, Verdict(outcome=Outcome.REFUSED, dfid=msg.dfid, feedback=feedback))
            return
        decided = out.emit(
            HumanDecided(
                decision=msg.decision, operator=msg.operator, reason=msg.reason, params=msg.params
            ),
            dfid=msg.dfid,
        )
        match msg.decision:
            case Decision.OVERRIDE:
                out.emit(
                    ProposalAccepted(attempt=flow.attempts, by_human=True),
                    dfid=msg.dfid,
                    after=decided,
                )
                out.send(self._execution, Execute(dfid=msg.dfid))
                out.reply(
                    msg.reply,
                    Verdict(outcome=Outcome.ACCEPTED, dfid=msg.dfid, attempt=flow.attempts),
                )
            case Decision.ABORT:
                out.emit(
                    FlowAborted(
                        reason_code=ReasonCode.HUMAN_REJECTED,
                        detail=f"{msg.operator}: {msg.reason}",
                    ),
                    dfid=msg.dfid,
                    after=decided,
                )
                feedback = Feedback(
                    reason_code=ReasonCode.HUMAN_REJECTED, detail=msg.reason, layer="escalation"
                )
                out.reply(
                    msg.reply,
                    Verdict(
                        outcome=Outcome.ABORTED,
                        dfid=msg.dfid,
                        attempt=flow.attempts,
                        feedback=feedback,
                    ),
                )
            case Decision.MODIFY:
                modified = msgspec.structs.replace(flow.proposal, params=msg.params or {})
                out.send(
                    self._integrity,
                    Validate(dfid=msg.dfid, proposal=modified, by_human=True, reply=msg.reply),
                )
