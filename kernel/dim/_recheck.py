"""The DIM's second look: an approved (or queued) action judged again before it executes.

:meth:`Rechecking.recheck` runs the verdict again against what is in force now; an action
that no longer passes is refused (APPROVAL_SUPERSEDED) or escalated again, as its pack says,
with both pack versions on record (ApprovalSuperseded).
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from msgspec.structs import replace

from kernel.core.events import (
    ApprovalSuperseded,
    Feedback,
    FlowAborted,
    PackRef,
    ProposalAccepted,
)
from kernel.core.flow import FlowState, FlowStatus
from kernel.core.ports import Clock
from kernel.core.reasons import ReasonCode
from kernel.dim._judgement import Judgement, reject
from kernel.dim._records import (
    answer_from_record,
    escalated,
    reserve,
    staged_of,
)
from kernel.dim.verdict import rechecked, verdict
from kernel.policy.contracts import Outcome, Verdict
from kernel.policy.packs import PolicyCatalog, PolicyPack
from kernel.runtime.actors import Mailbox, Outbox
from kernel.runtime.messages import (
    Dispatch,
    Escalate,
    EscalationMessage,
    ExecutionMessage,
    Recheck,
)
from kernel.state.approvals import Approval, ApprovalStatus
from kernel.state.intents import stage_start
from kernel.state.projections import Projections
from kernel.state.quorums import Ballot, Quorums


class Rechecking:
    """The DIM's rechecks, with what they read and where they send what passes."""

    def __init__(
        self,
        projections: Projections,
        catalog: PolicyCatalog,
        clock: Clock,
        escalation: Mailbox[EscalationMessage],
        execution: Mailbox[ExecutionMessage],
    ) -> None:
        self._projections = projections
        self._catalog = catalog
        self._clock = clock
        self._escalation = escalation
        self._execution = execution

    def recheck(self, msg: Recheck, out: Outbox) -> None:
        """Judge an approved (or queued) action again against what is in force now.

        It executes if it still passes and any escalation it now meets is one its
        approval covers; else it is refused (APPROVAL_SUPERSEDED) or escalated again,
        as its pack says, with both pack versions on record (ApprovalSuperseded).
        """
        flow = out.flow(msg.dfid)
        approval = self._projections.approvals.get(msg.dfid)
        approved = _approved(flow, approval)
        queued = _queued(flow)
        agent = self._projections.agents.get(flow.agent_id) if flow is not None else None
        if flow is None or flow.proposal is None or agent is None or not (approved or queued):
            answer_from_record(msg.dfid, flow, msg.reply, out)
            return
        staged = staged_of(out)
        own = staged.own(self._projections, msg.dfid)
        judgement = verdict(
            flow.proposal,
            flow,
            agent,
            self._catalog,
            self._clock.now_ns(),
            self._projections,
            recheck=True,
            staged=staged,
        )
        ballot = self._projections.domain(Quorums).ballots.get(msg.dfid)
        # A human's approval covers what it approved; so does an acceptance out of an
        # escalation (a human's) recorded before a restart left it unstarted.
        human = approval if approved or queued else None
        if not rechecked(judgement, ballot, human):
            self._superseded(msg, flow, judgement, ballot, own, out)
            return
        self._accept(msg, flow, judgement, own, approved, out)

    def _accept(
        self,
        msg: Recheck,
        flow: FlowState,
        judgement: Judgement,
        own: Mapping[str, int],
        approved: bool,
        out: Outbox,
    ) -> None:
        """Start an action that still passes: accepted again if a human approved it."""
        staged = staged_of(out)
        recorded: int | None = None
        if approved:
            recorded = out.emit(
                ProposalAccepted(
                    attempt=flow.attempts, by_human=True, pack=judgement.pack, rechecked=True
                ),
                dfid=msg.dfid,
            )
            staged.count_call(self._projections, msg.dfid)
        reserve(msg.dfid, flow.agent_id, judgement, own, recorded, out)
        accepted = out.flow(msg.dfid)
        assert accepted is not None
        intent = stage_start(self._catalog, accepted, out, policy=judgement.policy)
        if intent is not None:
            out.send(self._execution, Dispatch(dfid=msg.dfid, key=intent.key))
        out.reply(
            msg.reply, Verdict(outcome=Outcome.ACCEPTED, dfid=msg.dfid, attempt=flow.attempts)
        )

    def _superseded(
        self,
        msg: Recheck,
        flow: FlowState,
        judgement: Judgement,
        ballot: Ballot | None,
        own: Mapping[str, int],
        out: Outbox,
    ) -> None:
        """Record why an approved action no longer passes; refuse or escalate it again."""
        found = judgement.rejection or judgement.escalation
        assert found is not None and flow.proposal is not None
        pack = self._catalog.pack_of.get(flow.proposal.kind)
        current = pack.ref if pack is not None else None
        approved = _approved_under(pack, ballot)
        escalate = pack is not None and pack.on_superseded == "escalate"
        approval = self._projections.approvals.get(msg.dfid)
        noted = out.emit(
            ApprovalSuperseded(
                reason_code=found.reason_code,
                action_hash=approval.action_hash if approval is not None else "",
                approved=approved,
                current=current,
                detail=found.detail,
                layer=found.layer,
                rule=found.rule,
                outcome="escalated" if escalate else "refused",
                via=msg.via,
            ),
            dfid=msg.dfid,
        )
        detail = _detail(approved, current, found)
        feedback = reject("recheck", ReasonCode.APPROVAL_SUPERSEDED, detail, rule=found.rule)
        if not escalate:
            out.emit(
                FlowAborted(reason_code=ReasonCode.APPROVAL_SUPERSEDED, detail=detail),
                dfid=msg.dfid,
                after=noted,
            )
            outcome = Outcome.ABORTED
        else:
            self._escalate_again(msg, flow, judgement, own, detail, noted, out)
            outcome = Outcome.ESCALATED
        out.reply(
            msg.reply,
            Verdict(outcome=outcome, dfid=msg.dfid, attempt=flow.attempts, feedback=feedback),
        )

    def _escalate_again(
        self,
        msg: Recheck,
        flow: FlowState,
        judgement: Judgement,
        own: Mapping[str, int],
        detail: str,
        noted: int,
        out: Outbox,
    ) -> None:
        """Escalate a superseded approval again, holding what it holds, for a human."""
        found = judgement.rejection or judgement.escalation
        assert found is not None and flow.proposal is not None
        if judgement.rejection is not None:
            reason = Feedback(
                reason_code=ReasonCode.APPROVAL_SUPERSEDED, detail=detail, rule=found.rule
            )
            judgement = replace(judgement, quorum=None, reserve=own)
        else:
            reason = msgspec.structs.replace(found, detail=detail)
        recorded = out.emit(
            escalated(self._catalog, msg.dfid, flow.proposal, judgement, reason),
            dfid=msg.dfid,
            after=noted,
        )
        reserve(msg.dfid, flow.agent_id, judgement, own, recorded, out)
        out.send(self._escalation, Escalate(dfid=msg.dfid))


def _approved(flow: FlowState | None, approval: Approval | None) -> bool:
    """An escalated flow a human approved: what a recheck judges again."""
    return (
        flow is not None
        and flow.status is FlowStatus.ESCALATED
        and approval is not None
        and approval.status is ApprovalStatus.APPROVED
    )


def _queued(flow: FlowState | None) -> bool:
    """An accepted flow not yet started (a restart left it unstarted): judged again too."""
    return flow is not None and flow.status is FlowStatus.ACCEPTED and not flow.intent_key


def _approved_under(pack: PolicyPack | None, ballot: Ballot | None) -> PackRef | None:
    """The pack version the approval's ballot was cast under, if it names one."""
    if ballot is None or not ballot.pack:
        return None
    name = pack.name if pack is not None else "?"
    return PackRef(name=name, version=ballot.version or "?", hash=ballot.pack)


def _detail(approved: PackRef | None, current: PackRef | None, found: Feedback) -> str:
    then = f"{approved.name} {approved.version}" if approved is not None else "an earlier pack"
    now = f"{current.name} {current.version}" if current is not None else "no pack"
    return (
        f"approved under {then}, judged again under {now} before executing:"
        f" {found.reason_code}: {found.detail}"
    )[:1000]
