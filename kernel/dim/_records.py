"""What the DIM records beside a verdict, and how it answers what it does not judge.

The escalation a verdict records, the rules that overran their budgets (FlowFlagged),
what a flow holds once judged (ResourceReserved, ResourceReleased), a standing grant's
use, and the answers at the boundary (a refusal, a duplicate, a recheck of a flow that
moved on, a one-proposal flow's end): functions of what they are given and the batch's
:class:`~kernel.runtime.actors.Outbox`, for :class:`kernel.dim._actor.IntegrityModule`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import msgspec

from kernel.core.events import (
    DuplicateSuppressed,
    Event,
    Feedback,
    FlowAborted,
    FlowEscalated,
    FlowFlagged,
    GrantUsed,
    ProposalRecord,
    ResourceReleased,
    ResourceReserved,
    SubmissionRefused,
)
from kernel.core.flow import FlowState, FlowStatus
from kernel.core.reasons import ReasonCode
from kernel.dim._judgement import Judgement, reject
from kernel.dim.verdict import Staged
from kernel.policy.contracts import Outcome, Verdict
from kernel.policy.packs import PolicyCatalog
from kernel.policy.rules import Overrun
from kernel.runtime.actors import Outbox, Reply
from kernel.runtime.messages import (
    Judge,
)
from kernel.state.approvals import escalated_event

log = logging.getLogger(__name__)

BUDGET_GUARD = "rule budget"
"""The name a rule's budget overrun is flagged under (FlowFlagged.guard)."""


def escalated(
    catalog: PolicyCatalog,
    dfid: str,
    proposal: ProposalRecord,
    judgement: Judgement,
    escalation: Feedback,
) -> FlowEscalated:
    """The escalation a verdict records: its pack (hash and version), rule and quorum."""
    event = escalated_event(dfid, proposal, catalog, escalation.reason_code, escalation.detail)
    pack = catalog.pack_of.get(proposal.kind)
    return msgspec.structs.replace(
        event,
        pack=judgement.pack,
        rule=escalation.rule,
        version=pack.version if pack is not None else "",
        quorum=judgement.quorum,
    )


def use_grant(dfid: str, judgement: Judgement, recorded: int, out: Outbox) -> None:
    """Record the use of the standing grant an acceptance stands on, and count it now."""
    use = judgement.grant
    if use is None:
        return
    out.emit(
        GrantUsed(
            grant=use.grant,
            uses=use.uses,
            amount=use.amount,
            currency=use.currency,
            escalation=use.escalation,
        ),
        dfid=dfid,
        after=recorded,
    )
    granted = staged_of(out).granted
    uses, spent = granted.get(use.grant, (0, 0))
    granted[use.grant] = (uses + 1, spent + use.amount)


def answer_from_record(
    dfid: str, flow: FlowState | None, reply: Reply[Verdict] | None, out: Outbox
) -> None:
    """Answer a recheck of a flow that moved on meanwhile: from what its record says."""
    if flow is None:
        missing = reject("boundary", ReasonCode.FLOW_NOT_ACTIVE, f"no flow {dfid}")
        out.reply(reply, Verdict(outcome=Outcome.REFUSED, dfid=dfid, feedback=missing))
        return
    outcome = {
        FlowStatus.ABORTED: Outcome.ABORTED,
        FlowStatus.ESCALATED: Outcome.ESCALATED,
    }.get(flow.status, Outcome.ACCEPTED)
    feedback = reject("boundary", flow.reason_code, flow.detail) if flow.reason_code else None
    out.reply(
        reply,
        Verdict(outcome=outcome, dfid=dfid, attempt=flow.attempts, feedback=feedback),
    )


def flag(
    catalog: PolicyCatalog,
    msg: Judge,
    judgement: Judgement,
    overruns: list[Overrun],
    recorded: int,
    out: Outbox,
) -> None:
    """Record each rule that overran its budget: the flow needs review, the verdict stands."""
    if not overruns:
        return
    pack = catalog.pack_of.get(msg.proposal.kind)
    of_pack = f" of pack {pack.name} {pack.version}" if pack is not None else ""
    for o in overruns:
        reason = (
            f"rule {o.rule}{of_pack} took {o.took_us} us, over its budget of {o.budget_us} us"
            " (the verdict does not depend on it; make the rule cheaper or raise its budget)"
        )
        log.warning("flow %s: %s", msg.dfid, reason)
        out.emit(
            FlowFlagged(
                guard=BUDGET_GUARD,
                reason=reason,
                rule=o.rule,
                budget_us=o.budget_us,
                took_us=o.took_us,
                pack=judgement.pack,
            ),
            dfid=msg.dfid,
            after=recorded,
        )


def reserve(
    dfid: str,
    agent_id: str,
    judgement: Judgement,
    own: Mapping[str, int],
    recorded: int | None,
    out: Outbox,
) -> None:
    """Stage what the flow now holds: new amounts reserved, pools no longer needed released."""
    want = judgement.reserve
    for pool, amount in sorted(want.items()):
        if own.get(pool) != amount:
            out.emit(
                ResourceReserved(pool=pool, amount=amount),
                dfid=dfid,
                agent_id=agent_id,
                after=recorded,
            )
    for pool, amount in sorted(own.items()):
        if pool not in want:
            out.emit(
                ResourceReleased(pool=pool, amount=amount, reason="modified"),
                dfid=dfid,
                agent_id=agent_id,
                after=recorded,
            )
    if want or own:
        staged_of(out).reserve(dfid, dict(want))


def end_call(
    msg: Judge, feedback: Feedback, rejected: int, out: Outbox
) -> tuple[Outcome, Feedback]:
    """End a flow whose one proposal was refused; stop its conversation if it must.

    Returns the outcome and the feedback to answer: the refusal's own, or the
    governor's when the conversation stops.
    """
    streak = msg.streak
    if streak is None or streak.refused + 1 < streak.limit:
        out.emit(
            FlowAborted(reason_code=feedback.reason_code, detail=feedback.detail),
            dfid=msg.dfid,
            after=rejected,
        )
        return Outcome.REJECTED, feedback
    stopped = (
        f"conversation {streak.conversation_id} stopped: {streak.refused + 1} calls in a"
        f" row refused (the agent's max_attempts is {streak.limit})"
    )
    detail = f"{stopped}; last: {feedback.reason_code}"[:500]
    ended = out.emit(
        FlowAborted(reason_code=ReasonCode.REASONING_EXHAUSTION, detail=detail),
        dfid=msg.dfid,
        after=rejected,
    )
    root = out.flow(streak.root_dfid)
    if root is not None:
        # The stop is kept on the conversation's own flow: a later call (or a
        # restarted kernel) reads it there, and is refused at the boundary.
        out.emit(
            SubmissionRefused(
                reason_code=ReasonCode.REASONING_EXHAUSTION,
                detail=detail,
                claimed_agent=root.agent_id,
            ),
            dfid=root.dfid,
            after=ended,
        )
    last = f"{stopped}; last: {feedback.reason_code}: {feedback.detail}"[:500]
    return Outcome.ABORTED, reject("governor", ReasonCode.REASONING_EXHAUSTION, last)


def refuse(msg: Judge, flow: FlowState | None, code: ReasonCode, detail: str, out: Outbox) -> None:
    out.emit(
        SubmissionRefused(
            reason_code=code, detail=detail, claimed_agent=flow.agent_id if flow else ""
        ),
        dfid=flow.dfid if flow else None,
    )
    feedback = reject("boundary", code, detail)
    out.reply(msg.reply, Verdict(outcome=Outcome.REFUSED, dfid=msg.dfid, feedback=feedback))


def duplicate(msg: Judge, flow: FlowState, out: Outbox) -> None:
    out.emit(DuplicateSuppressed(key=flow.intent_key, source="submission"), dfid=flow.dfid)
    outcome = {
        FlowStatus.CLOSED: Outcome.DUPLICATE,
        FlowStatus.ABORTED: Outcome.ABORTED,
        FlowStatus.ESCALATED: Outcome.ESCALATED,
    }.get(flow.status, Outcome.DUPLICATE)
    feedback = reject("boundary", flow.reason_code, flow.detail) if flow.reason_code else None
    out.reply(
        msg.reply,
        Verdict(
            outcome=outcome,
            dfid=flow.dfid,
            attempt=flow.attempts,
            feedback=feedback,
            external_id=flow.external_id,
        ),
    )


def hand_back(arg: tuple[Outbox, int, int, Reply[list[Event] | None]]) -> None:
    """Answer the compiler with its events as this append committed them."""
    out, start, count, done = arg
    done.set(out.committed[start : start + count])


def staged_of(out: Outbox) -> Staged:
    """Return what this batch staged and has not committed (kernel.dim.verdict counts it)."""
    staged = out.scratch.get("staged")
    if staged is None:
        staged = out.scratch["staged"] = Staged()
    assert isinstance(staged, Staged)
    return staged
