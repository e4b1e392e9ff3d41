"""The escalation desk: flows that need a human wait here for one.

Governance by exception: the kernel acts alone inside its bounds and asks a
human only when a trigger fires. The triggers, each recorded with its reason:

- model uncertainty and authority or ambiguity rules of the policy kind (the
  DIM escalates, then tells this actor with :class:`Escalate`);
- operational failure: the execution engine records its own escalation
  (EXECUTION_FAILED, OUTCOME_UNKNOWN) in the batch that records the failure, and
  tells this actor with :class:`Escalate`;
- a silent agent (the watchdog, on :class:`Tick`).

Each escalation opens an approval bound to the action's hash
(:mod:`kernel.state.approvals`). A human then approves (the action executes as it
is), modifies (the changed proposal goes through the DIM again) or rejects;
every decision records who made it and why. An escalation whose outcome is
unknown (OUTCOME_UNKNOWN: the effect may have happened) takes only reconcile
or retry, refuses every other decision with OUTCOME_UNKNOWN, never expires
and is never aborted for the agent's escalation budget. An approval nobody decides on in
time expires (noticed on a tick, or when a decision arrives late), and an
agent that escalates more often than its budget allows is demoted to PASSIVE.
"""

from __future__ import annotations

import msgspec

from kernel.core.events import (
    AgentStatusChanged,
    ApprovalExpired,
    ApprovalVoted,
    DecisionRefused,
    Feedback,
    FlowAborted,
    HumanDecided,
    QuorumRule,
)
from kernel.core.flow import RESOLVE_WORDS, FlowState, FlowStatus
from kernel.core.ports import Clock
from kernel.core.reasons import ReasonCode
from kernel.escalation._checks import (
    Problem,
    decision_problem,
    excluded_voter,
    role_refusal,
    same_principal,
)
from kernel.policy.contracts import Outcome, Verdict
from kernel.policy.escalations import EscalationBudget
from kernel.policy.packs import PolicyCatalog
from kernel.policy.quorums import Tally, tally
from kernel.policy.quorums import waiting as waiting_text
from kernel.runtime.actors import Mailbox, Outbox
from kernel.runtime.messages import (
    Decide,
    DimMessage,
    Escalate,
    EscalationMessage,
    ExecutionMessage,
    Judge,
    Recheck,
    Resolve,
    Tick,
    Withdrawal,
)
from kernel.state.approvals import (
    APPROVE_WORDS,
    RECONCILE,
    REJECT_WORDS,
    Approval,
    ApprovalStatus,
    escalated_event,
    over_budget,
    reconciliation,
)
from kernel.state.projections import AgentStatus, Projections
from kernel.state.quorums import Ballot, Quorums

KERNEL_OPERATOR = "kernel"
"""The operator named on status changes the kernel makes by itself (a demotion)."""


def _counts(rule: QuorumRule) -> bool:
    """Whether an approval takes votes: more than one operator, or operators of a role."""
    return rule.required > 1 or bool(rule.roles)


def _counted(msg: Decide, rule: QuorumRule, withdraw: bool) -> bool:
    """Whether a decision is a vote the quorum counts: an approval, or a rejection it votes on.

    A modification (judged again by the DIM) or a rejection that ends the flow is not.
    """
    if msg.decision in APPROVE_WORDS:
        return True
    return msg.decision in REJECT_WORDS and rule.on_reject == "vote" and not withdraw


def _own(msg: Decide, flow: FlowState) -> bool:
    """Whether the flow's proposer approves or modifies its own flow."""
    return msg.decision not in REJECT_WORDS and same_principal(msg.operator, flow.agent_id)


class EscalationPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How the escalation desk governs.

    Attributes:
        approval_ttl_s: an approval nobody decides on within this time expires (None: never).
        budget: escalations allowed per agent (a token bucket); None: unlimited.
        silence_s: escalate a flow whose agent has not proposed within this time (None: off).
    """

    approval_ttl_s: float | None = 3600.0
    budget: EscalationBudget | None = EscalationBudget()
    silence_s: float | None = None


class EscalationDesk:
    """The escalation desk actor."""

    def __init__(
        self,
        projections: Projections,
        catalog: PolicyCatalog,
        clock: Clock,
        dim: Mailbox[DimMessage],
        execution: Mailbox[ExecutionMessage],
        policy: EscalationPolicy | None = None,
    ) -> None:
        self._projections = projections
        self._catalog = catalog
        self._clock = clock
        self._dim = dim
        self._execution = execution
        self._policy = policy or EscalationPolicy()

    async def handle(self, msg: EscalationMessage, out: Outbox) -> None:
        match msg:
            case Escalate():
                flow = out.flow(msg.dfid)
                if flow is not None and flow.status is FlowStatus.ESCALATED:
                    self._charge(flow, out, staged=False)
            case Decide():
                self._decide(msg, out)
            case Tick():
                self._tick(out)
            case Withdrawal():
                self._withdraw(msg, out)

    # --- budgets, expiry, the watchdog ----------------------------------------

    def _charge(self, flow: FlowState, out: Outbox, *, staged: bool) -> None:
        """Spend one escalation of the agent's budget; demote and abort when it is empty."""
        bucket = self._budget(flow)
        if bucket is None or flow.pending is not None:
            # An intent of unknown outcome waits for a human whatever the budget says.
            return
        history = list(self._projections.escalations.get(flow.agent_id, ()))
        # Escalations staged by this batch are not folded yet, but they spent tokens.
        pending: dict[str, list[tuple[str, int]]] = out.scratch.setdefault("escalated", {})
        history += pending.get(flow.agent_id, [])
        if staged:
            entry = (flow.dfid, self._clock.now_ns())
            history.append(entry)
            pending.setdefault(flow.agent_id, []).append(entry)
        if flow.dfid not in over_budget(history, bucket):
            return
        detail = (
            f"agent {flow.agent_id} escalated more than {bucket.capacity} times"
            f" per {bucket.period_s:g} s"
        )
        demoted: set[str] = out.scratch.setdefault("demoted", set())
        agent = self._projections.agents.get(flow.agent_id)
        if (
            agent is not None
            and agent.status is AgentStatus.ACTIVE
            and flow.agent_id not in demoted
        ):
            demoted.add(flow.agent_id)
            out.emit(
                AgentStatusChanged(
                    status=AgentStatus.PASSIVE,
                    reason=f"{ReasonCode.ESCALATION_BUDGET_EXHAUSTED}: {detail}",
                    operator=KERNEL_OPERATOR,
                ),
                agent_id=flow.agent_id,
            )
        out.emit(
            FlowAborted(reason_code=ReasonCode.ESCALATION_BUDGET_EXHAUSTED, detail=detail),
            dfid=flow.dfid,
        )

    def _budget(self, flow: FlowState) -> EscalationBudget | None:
        """The budget ``flow`` spends: its pack's when the pack sets one, else the kernel's."""
        kind = flow.proposal.kind if flow.proposal is not None else None
        pack = self._catalog.pack_of.get(kind) if kind is not None else None
        if pack is not None and pack.escalation_budget is not None:
            return pack.escalation_budget
        return self._policy.budget

    def _tick(self, out: Outbox) -> None:
        now = self._clock.now_ns()
        if self._policy.approval_ttl_s is not None:
            self._expire_due(now, out)
        silence = self._policy.silence_s
        if silence is not None:
            for dfid in sorted(self._projections.moving):
                self._watch(dfid, now, silence, out)

    def _expire_due(self, now: int, out: Outbox) -> None:
        """Expire every pending approval past its time (an unknown outcome never expires)."""
        for dfid in sorted(self._projections.waiting):
            approval = self._projections.approvals.get(dfid)
            if approval is None or approval.status is not ApprovalStatus.PENDING:
                continue
            flow = out.flow(approval.dfid)
            if flow is None or flow.status is not FlowStatus.ESCALATED:
                continue
            if flow.pending is None and self._expired(approval, now):
                self._expire(approval, out)

    def _watch(self, dfid: str, now: int, silence: float, out: Outbox) -> None:
        """Escalate a flow whose agent has been silent longer than the watchdog allows."""
        flow = out.flow(dfid)
        if flow is None or not flow.awaiting_proposal:
            return
        quiet_s = (now - flow.updated_ts) / 1e9
        if quiet_s < silence:
            return
        detail = (
            f"agent {flow.agent_id} has not proposed for {quiet_s:g} s"
            f" (the watchdog allows {silence:g} s)"
        )
        out.emit(
            escalated_event(dfid, None, self._catalog, ReasonCode.AGENT_SILENT, detail),
            dfid=dfid,
        )
        self._charge(out.flow(dfid) or flow, out, staged=True)

    def _expired(self, approval: Approval, now: int) -> bool:
        ttl = self._policy.approval_ttl_s
        return ttl is not None and now - approval.escalated_ts > int(ttl * 1e9)

    def _expire(self, approval: Approval, out: Outbox) -> None:
        detail = f"no human decision within {self._policy.approval_ttl_s:g} s"
        expired = out.emit(
            ApprovalExpired(action_hash=approval.action_hash, detail=detail), dfid=approval.dfid
        )
        out.emit(
            FlowAborted(reason_code=ReasonCode.EXPIRED, detail=detail),
            dfid=approval.dfid,
            after=expired,
        )

    # --- human decisions ------------------------------------------------------

    def _decide(self, msg: Decide, out: Outbox) -> None:
        if self._duplicate(msg, out):
            return
        flow = out.flow(msg.dfid)
        approval = self._projections.approvals.get(msg.dfid)
        if flow is None or flow.status is not FlowStatus.ESCALATED or approval is None:
            self._refuse_not_waiting(msg, flow, out)
            return
        problem = self._closed(msg, flow, approval, out) or decision_problem(msg, approval, flow)
        if problem is not None:
            code, detail, field = problem
            self._refuse(msg, flow, code, detail, out, field)
            return
        ballot = self._ballot(msg, flow)
        if ballot is not None:
            self._vote(msg, flow, approval, ballot, out)
            return
        own = _own(msg, flow)
        if own and not self._self_approval(flow):
            detail = (
                f"{msg.operator} proposed this flow (as agent {flow.agent_id}) and may not"
                f" {msg.decision} it: another operator decides (its pack does not allow"
                " self-approval)"
            )
            self._refuse(msg, flow, ReasonCode.SELF_APPROVAL_FORBIDDEN, detail, out, "operator")
            return
        decided = out.emit(
            HumanDecided(
                decision=msg.decision,
                operator=msg.operator,
                reason=msg.reason,
                params=msg.params,
                action_hash=approval.action_hash,
                inbox_id=msg.inbox_id,
                via=msg.via,
                signer=msg.signer,
                self_approved=own,
            ),
            dfid=msg.dfid,
        )
        self._carry_out(msg, flow, decided, out)

    def _withdraw(self, msg: Withdrawal, out: Outbox) -> None:
        """Abort a flow its own agent withdraws, while no human has decided it yet."""
        flow = out.flow(msg.dfid)
        approval = self._projections.approvals.get(msg.dfid)
        waiting = (
            flow is not None
            and flow.agent_id == msg.agent_id
            and flow.status is FlowStatus.ESCALATED
            and approval is not None
            and approval.status is ApprovalStatus.PENDING
            and msg.dfid not in out.scratch.get("decided", ())
        )
        if not waiting:
            status = flow.status if flow is not None else "unknown"
            feedback = Feedback(
                reason_code=ReasonCode.FLOW_NOT_ACTIVE,
                detail=f"flow {msg.dfid} is {status}, not waiting for a human decision",
                layer="escalation",
            )
            out.reply(
                msg.reply, Verdict(outcome=Outcome.REJECTED, dfid=msg.dfid, feedback=feedback)
            )
            return
        assert flow is not None
        out.scratch.setdefault("decided", set()).add(msg.dfid)
        out.emit(
            FlowAborted(reason_code=ReasonCode.AGENT_DECLINED, detail=msg.detail), dfid=msg.dfid
        )
        feedback = Feedback(reason_code=ReasonCode.AGENT_DECLINED, detail=msg.detail)
        out.reply(
            msg.reply,
            Verdict(
                outcome=Outcome.ABORTED, dfid=msg.dfid, attempt=flow.attempts, feedback=feedback
            ),
        )

    def _refuse_not_waiting(self, msg: Decide, flow: FlowState | None, out: Outbox) -> None:
        status = flow.status if flow else "unknown"
        detail = f"flow {msg.dfid} is {status}, not waiting for a human decision"
        self._refuse(msg, flow, ReasonCode.FLOW_NOT_ACTIVE, detail, out)

    def _ballot(self, msg: Decide, flow: FlowState) -> Ballot | None:
        """The ballot the decision is a vote on, when the approval takes votes."""
        ballot = self._projections.domain(Quorums).ballots.get(msg.dfid)
        if ballot is not None and flow.pending is None and _counts(ballot.quorum):
            return ballot
        return None

    def _duplicate(self, msg: Decide, out: Outbox) -> bool:
        """Answer DUPLICATE for an inbox row already taken; else mark it taken."""
        if msg.inbox_id is None:
            return False
        # The durable dedupe: an inbox row is taken by exactly one recorded event.
        taken: set[int] = out.scratch.setdefault("inbox", set())
        if msg.inbox_id in self._projections.inbox_taken or msg.inbox_id in taken:
            out.reply(msg.reply, Verdict(outcome=Outcome.DUPLICATE, dfid=msg.dfid))
            return True
        taken.add(msg.inbox_id)
        return False

    def _closed(
        self, msg: Decide, flow: FlowState, approval: Approval, out: Outbox
    ) -> Problem | None:
        """Why the approval takes no decision any more (code, detail, field), or None.

        An approval found past its time expires here, before the refusal is recorded.
        """
        if approval.status is not ApprovalStatus.PENDING or msg.dfid in out.scratch.get(
            "decided", ()
        ):
            # Approved: the DIM judges it again before it executes; nothing more to decide.
            detail = f"flow {msg.dfid} was {str(approval.status).lower()}: it is being judged again"
            return ReasonCode.FLOW_NOT_ACTIVE, detail, ""
        if flow.pending is None and self._expired(approval, self._clock.now_ns()):
            self._expire(approval, out)
            detail = f"the approval expired: no decision within {self._policy.approval_ttl_s:g} s"
            return ReasonCode.EXPIRED, detail, ""
        return None

    def _carry_out(self, msg: Decide, flow: FlowState, decided: int, out: Outbox) -> None:
        """Act on a recorded decision: resolve, approve, reject, or judge the modification."""
        if msg.decision in RESOLVE_WORDS:
            self._resolve(msg, flow, decided, out)
        elif msg.decision in APPROVE_WORDS:
            self._approved(msg, out)
        elif msg.decision in REJECT_WORDS:
            self._rejected(msg, flow, decided, out)
        else:
            # _problem refused a modification of nothing (an escalation with no action).
            assert flow.proposal is not None
            modified = msgspec.structs.replace(flow.proposal, params=msg.params or {})
            out.send(
                self._dim,
                Judge(dfid=msg.dfid, proposal=modified, by_human=True, reply=msg.reply),
            )

    def _approved(self, msg: Decide, out: Outbox) -> None:
        """Hand an approved action to the DIM: it is judged again before it executes."""
        out.scratch.setdefault("decided", set()).add(msg.dfid)
        out.send(self._dim, Recheck(dfid=msg.dfid, via="approval", reply=msg.reply))

    def _rejected(self, msg: Decide, flow: FlowState, decided: int, out: Outbox) -> None:
        out.emit(
            FlowAborted(
                reason_code=ReasonCode.HUMAN_REJECTED, detail=f"{msg.operator}: {msg.reason}"
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
                outcome=Outcome.ABORTED, dfid=msg.dfid, attempt=flow.attempts, feedback=feedback
            ),
        )

    # --- quorums ------------------------------------------------------------------

    def _vote(
        self, msg: Decide, flow: FlowState, approval: Approval, ballot: Ballot, out: Outbox
    ) -> None:
        """Count one operator's vote on an approval that needs a quorum.

        The proposer and every modifier may not vote (the proposer may still withdraw
        the flow); an operator without a role the quorum names may not either; nobody
        votes twice. A vote that meets the quorum is recorded with the approval it
        completes (HumanDecided), and the action goes to the DIM to be judged again;
        a rejection ends the flow, or counts against it, as the pack said.
        """
        rule = ballot.quorum
        withdraw = msg.decision in REJECT_WORDS and same_principal(msg.operator, flow.agent_id)
        refused = None if withdraw else self._ineligible(msg, ballot)
        if refused is not None:
            code, detail = refused
            self._refuse(msg, flow, code, detail, out, "operator")
            return
        if not _counted(msg, rule, withdraw):
            # A modification (judged again by the DIM) or a rejection that ends it.
            self._decided_alone(msg, flow, approval, out)
            return
        vote = "approve" if msg.decision in APPROVE_WORDS else "reject"
        counted, voted = self._record_vote(msg, approval, ballot, vote, out)
        if (vote == "approve" and counted.met) or counted.ended:
            self._decided_alone(msg, flow, approval, out, after=voted, inbox=False)
            return
        waiting = Feedback(
            reason_code=approval.reason_code,
            detail=counted.waiting,
            layer="escalation",
            rule=rule.name,
        )
        out.reply(
            msg.reply,
            Verdict(
                outcome=Outcome.ESCALATED,
                dfid=msg.dfid,
                attempt=flow.attempts,
                feedback=waiting,
            ),
        )

    def _record_vote(
        self, msg: Decide, approval: Approval, ballot: Ballot, vote: str, out: Outbox
    ) -> tuple[Tally, int]:
        """Count ``vote`` with the votes still standing and record it (ApprovalVoted)."""
        rule = ballot.quorum
        now = self._clock.now_ns()
        approvals = [(v.operator, v.roles) for v in ballot.standing(now)]
        against = [v.operator for v in ballot.standing(now, "reject")]
        if vote == "approve":
            approvals.append((msg.operator, list(msg.roles)))
        else:
            against.append(msg.operator)
        counted = tally(rule, approvals, against)
        voted = out.emit(
            ApprovalVoted(
                vote=vote,
                operator=msg.operator,
                roles=list(msg.roles),
                reason=msg.reason,
                action_hash=approval.action_hash,
                counted=counted.counted,
                against=counted.against,
                required=rule.required,
                met=counted.met and vote == "approve",
                waiting=counted.waiting,
                inbox_id=msg.inbox_id,
                via=msg.via,
                signer=msg.signer,
            ),
            dfid=msg.dfid,
        )
        return counted, voted

    def _ineligible(self, msg: Decide, ballot: Ballot) -> tuple[ReasonCode, str] | None:
        """Why ``msg``'s operator may not vote on ``ballot`` (code, detail), or None."""
        rule = ballot.quorum
        refused = excluded_voter(msg, ballot) or role_refusal(msg, ballot)
        if refused is not None:
            return refused
        now = self._clock.now_ns()
        ttl = rule.vote_ttl_s
        if ballot.voted(msg.operator, now - ttl * 1_000_000_000 if ttl else 0) is not None:
            return (
                ReasonCode.DUPLICATE_VOTE,
                f"{msg.operator} voted on this approval already"
                f" ({ballot.waiting or waiting_text(rule, [])})",
            )
        return None

    def _decided_alone(
        self,
        msg: Decide,
        flow: FlowState,
        approval: Approval,
        out: Outbox,
        *,
        after: int | None = None,
        inbox: bool = True,
    ) -> None:
        """Record a decision that settles the approval (the last vote, a modification...)."""
        decided = out.emit(
            HumanDecided(
                decision=msg.decision,
                operator=msg.operator,
                reason=msg.reason,
                params=msg.params,
                action_hash=approval.action_hash,
                # The vote took the inbox row already: a row is taken by one event.
                inbox_id=msg.inbox_id if inbox else None,
                via=msg.via,
                signer=msg.signer,
            ),
            dfid=msg.dfid,
            after=after,
        )
        if msg.decision in APPROVE_WORDS:
            self._approved(msg, out)
        elif msg.decision in REJECT_WORDS:
            self._rejected(msg, flow, decided, out)
        else:
            assert flow.proposal is not None
            modified = msgspec.structs.replace(flow.proposal, params=msg.params or {})
            out.send(
                self._dim,
                Judge(dfid=msg.dfid, proposal=modified, by_human=True, reply=msg.reply),
            )

    def _self_approval(self, flow: FlowState) -> bool:
        """Whether the pack of the flow's proposal lets its proposer decide on it."""
        kind = flow.proposal.kind if flow.proposal is not None else None
        pack = self._catalog.pack_of.get(kind) if kind is not None else None
        return pack is not None and pack.self_approval

    def _resolve(self, msg: Decide, flow: FlowState, decided: int, out: Outbox) -> None:
        """Record a reconcile's result with the decision; the engine goes on from there."""
        outcome = Outcome.ACCEPTED
        if msg.decision == RECONCILE:
            assert msg.params is not None
            results = reconciliation(flow, self._catalog, msg.params, msg.operator)
            for payload in results:
                out.emit(payload, dfid=msg.dfid, after=decided)
            if isinstance(results[-1], FlowAborted):
                outcome = Outcome.ABORTED
        out.send(self._execution, Resolve(dfid=msg.dfid))
        out.reply(msg.reply, Verdict(outcome=outcome, dfid=msg.dfid, attempt=flow.attempts))

    def _refuse(
        self,
        msg: Decide,
        flow: FlowState | None,
        code: ReasonCode,
        detail: str,
        out: Outbox,
        field: str = "",
    ) -> None:
        out.emit(
            DecisionRefused(
                reason_code=code,
                decision=msg.decision,
                operator=msg.operator,
                detail=detail,
                inbox_id=msg.inbox_id,
                target="" if flow is not None else msg.dfid,
                via=msg.via,
                signer=msg.signer,
            ),
            dfid=flow.dfid if flow is not None else None,
        )
        feedback = Feedback(reason_code=code, detail=detail, layer="escalation", field=field)
        out.reply(msg.reply, Verdict(outcome=Outcome.REFUSED, dfid=msg.dfid, feedback=feedback))
