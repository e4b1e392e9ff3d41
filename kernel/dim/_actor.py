"""The Decision Integrity Module: the deterministic gate every proposal passes.

The verdict is a pure function of (proposal, projected state, time, policy
packs), computed by :func:`kernel.dim.verdict.verdict`, the function replay calls
too; :func:`kernel.dim._gate.judge`'s docstring lists the layers in their fixed
order. Before them, the boundary checks the session token
(INVALID_SESSION) and the flow (FLOW_NOT_ACTIVE); refusals there touch no flow
and count no attempt.

Acceptance and escalation reserve what the proposal consumes (ResourceReserved,
in the same append as the verdict); whoever records the end of the flow
releases it (see ``Outbox.emit``). This actor is the only one that reserves,
and it counts what the current batch staged, so two proposals racing for the
last unit cannot both win.

A rejection with attempts left hands the agent its feedback through a fresh
context; the intent retry governor ends the flow with REASONING_EXHAUSTION
once the agent's attempts are spent. There is no default-allow path.

A flow opened with its proposal given (``Kernel.propose``: one tool call) takes
that one proposal: a refusal ends it with the refusal's own reason. Its calls'
conversation is the unit the governor counts in then: the call that makes its
conversation's refusals in a row reach the agent's ``max_attempts`` ends with
REASONING_EXHAUSTION, and the conversation's stop is recorded on the
conversation's flow (SubmissionRefused), where the kernel finds it again.

The DIM times each rule it runs (a :class:`~kernel.policy.rules.Stopwatch` on real
monotonic time) and records a rule that overran its budget as a finding right
after the verdict: FlowFlagged (guard ``"rule budget"``), which marks the flow
NEEDS_REVIEW and names the rule, its pack, the budget and the measured time.
The verdict is the same whatever the time, so replay reproduces it.

The DIM also owns the rulebook (kernel.dim._rules): rule proposals, from
operators and from agents' ``memory.propose_rule`` (through the memory
executor), and operators' rule decisions are messages to it, staged here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from kernel.core.events import (
    FlowAborted,
    LimitAmended,
    ProposalAccepted,
    ProposalRejected,
    ProposalSubmitted,
    ReasoningCharged,
)
from kernel.core.flow import FlowState, FlowStatus, IllegalTransition
from kernel.core.ports import Clock
from kernel.core.reasons import ReasonCode
from kernel.dim import _raced as raced
from kernel.dim._amend import amend
from kernel.dim._citations import notes_on
from kernel.dim._grants import handle as handle_grant
from kernel.dim._judgement import Judgement
from kernel.dim._packs import load
from kernel.dim._recheck import Rechecking
from kernel.dim._records import (
    duplicate,
    end_call,
    escalated,
    flag,
    hand_back,
    refuse,
    reserve,
    staged_of,
    use_grant,
)
from kernel.dim._resources import budget_pool
from kernel.dim._rules import handle as handle_rule
from kernel.dim._shadow import Shadows
from kernel.dim.verdict import inputs_of, verdict
from kernel.policy.contracts import Outcome, Verdict
from kernel.policy.money import ModelPrice
from kernel.policy.packs import PolicyCatalog
from kernel.policy.rules import Overrun, Stopwatch
from kernel.runtime.actors import Mailbox, Outbox
from kernel.runtime.messages import (
    AmendLimit,
    Carry,
    Compile,
    CompilerMessage,
    DecideRule,
    DimMessage,
    Dispatch,
    Escalate,
    EscalationMessage,
    ExecutionMessage,
    GuardMessage,
    IssueGrant,
    Judge,
    LoadPack,
    LoadShadow,
    PromoteShadow,
    Recheck,
    RecordAct,
    RetireShadow,
    RetractRule,
    RevokeGrant,
    Screen,
    SubmitRule,
    VoteGrant,
    Withdraw,
)
from kernel.state.amendments import folded
from kernel.state.intents import mint, stage_start
from kernel.state.projections import AgentView, Projections, session_hash

log = logging.getLogger(__name__)


class IntegrityModule:
    """The DIM actor."""

    def __init__(
        self,
        projections: Projections,
        catalog: PolicyCatalog,
        clock: Clock,
        compiler: Mailbox[CompilerMessage],
        escalation: Mailbox[EscalationMessage],
        execution: Mailbox[ExecutionMessage],
        guards: Mailbox[GuardMessage] | None = None,
        rule_clock: Callable[[], int] = time.perf_counter_ns,
        prices: Mapping[str, ModelPrice] | None = None,
        shadows: Shadows | None = None,
    ) -> None:
        self._prices = dict(prices or {})
        # Built beside the actor (kernel.api.wiring), so a restarted DIM keeps its shadows.
        self._shadows = Shadows() if shadows is None else shadows
        # Measures rules beside the verdict; real time is right: it decides nothing.
        self._rule_clock = rule_clock
        self._guards = guards
        self._projections = projections
        # Its verdicts are written only if nothing staged before them would change them.
        projections.verdict_check = raced.check
        self._catalog = catalog
        self._clock = clock
        self._compiler = compiler
        self._escalation = escalation
        self._execution = execution
        self._rechecking = Rechecking(projections, catalog, clock, escalation, execution)

    async def handle(self, msg: DimMessage, out: Outbox) -> None:
        if type(msg) is Carry:
            await self._carry(msg, out)
            return
        step = _STEPS.get(type(msg))
        if step is not None:
            step(self, msg, out)

    async def _carry(self, msg: Carry, out: Outbox) -> None:
        # The compiler's events first, then what its agents answered on them: one
        # append holds context, proposal, verdict and intent (two commits a flow).
        try:
            start = out.carry(msg.drafts, msg.flows)
        except IllegalTransition:
            # A flow it recompiled moved meanwhile (an operator ended it): none
            # of it is recorded here; the compiler's own append finds out.
            out.rollback()
            out.reply(msg.done, None)
            return
        staged_of(out).carried(msg.drafts, self._projections)
        for answer in msg.messages:
            await self.handle(answer, out)
        out.after_commit_with(hand_back, (out, start, len(msg.drafts), msg.done))

    def _recheck(self, msg: Recheck, out: Outbox) -> None:
        self._rechecking.recheck(msg, out)

    def _grant(self, msg: IssueGrant | VoteGrant | RevokeGrant, out: Outbox) -> None:
        # The DIM owns grants, as it owns amendments: ordered with the verdicts.
        handle_grant(msg, self._catalog, self._projections, self._clock.now_ns(), out)

    def _record_act(self, msg: RecordAct, out: Outbox) -> None:
        # The DIM orders principals acts with its verdicts, as it does grants.
        index = out.emit(msg.payload)
        staged_of(out).acted(self._projections, msg.payload)
        out.reply_events(msg.reply, [index])

    def _load_pack(self, msg: LoadPack, out: Outbox) -> None:
        load(msg, self._catalog, self._projections.packs, out)
        if self._shadows.by_name:
            self._shadows.refit(self._catalog, out)

    def _load_shadow(self, msg: LoadShadow, out: Outbox) -> None:
        self._shadows.load(msg, self._catalog, out)

    def _retire_shadow(self, msg: RetireShadow, out: Outbox) -> None:
        self._shadows.retire(msg, out)

    def _promote_shadow(self, msg: PromoteShadow, out: Outbox) -> None:
        self._shadows.promote(msg, self._catalog, self._projections.packs, out)

    def _rule(self, msg: SubmitRule | DecideRule | RetractRule, out: Outbox) -> None:
        # The DIM owns the rulebook: one serial writer of rule events.
        handle_rule(msg, self._projections, out)

    def _withdraw(self, msg: Withdraw, out: Outbox) -> None:
        flow = out.flow(msg.dfid)
        owner = self._projections.sessions.get(session_hash(msg.token))
        if (
            flow is not None
            and flow.agent_id == owner
            and flow.awaiting_proposal
            and flow.compiled == msg.attempt
        ):
            # Thought that ends in nothing cost what it cost all the same.
            self._charge(flow, msg.usage, out)
            out.emit(FlowAborted(reason_code=msg.reason_code, detail=msg.detail), dfid=msg.dfid)

    def _amend(self, msg: AmendLimit, out: Outbox) -> None:
        event = amend(msg, self._catalog, self._projections.agents, self._clock.now_ns())
        out.emit(event, agent_id=msg.agent_id or None)
        if isinstance(event, LimitAmended):
            # In force for the proposals this batch judges after it, as replay will see it.
            staged = staged_of(out).amended
            staged.setdefault(msg.agent_id, {})[event.limit] = folded(event, 0)
        out.reply(msg.reply, event)

    def _judge(self, msg: Judge, out: Outbox) -> None:
        flow = self._flow_of(msg, out)
        if flow is None or not self._ready(msg, flow, out):
            return

        agent = self._projections.agents[flow.agent_id]
        attempt = flow.attempts + (0 if msg.by_human else 1)
        submitted = out.emit(
            ProposalSubmitted(attempt=attempt, proposal=msg.proposal, by_human=msg.by_human),
            dfid=msg.dfid,
        )
        self._charge(flow, msg.usage, out, after=submitted)
        staged = staged_of(out)
        # Citations and advisory constraints are recorded, never judged (kernel.dim._citations).
        behalf = staged.on_behalf(self._projections, msg.dfid)
        tenant = behalf.principal.tenant if behalf is not None else ""
        shown = staged.shown.get(msg.dfid)
        for note in notes_on(self._projections.memory, flow, msg.proposal, tenant, shown):
            out.emit(note, dfid=msg.dfid, agent_id=flow.agent_id, after=submitted)
        stopwatch = Stopwatch(self._rule_clock)
        now = self._clock.now_ns()
        # Built once: the shadow, if one is loaded, judges against the very same state.
        inputs = inputs_of(self._projections, flow, agent, now, staged)
        if msg.invalid is not None:
            # The wall refused the proposal at the schema layer: there is nothing to judge.
            judgement = Judgement(rejection=msg.invalid)
        else:
            judgement = verdict(
                msg.proposal,
                flow,
                agent,
                self._catalog,
                now,
                self._projections,
                by_human=msg.by_human,
                staged=staged,
                stopwatch=stopwatch,
                inputs=inputs,
            )
        # The shadow judges the same proposal on the same inputs, before the enforced
        # verdict stages its reservations; its difference is recorded after that verdict.
        shadowed = None
        if self._shadows.by_name:
            shadowed = self._shadows.judge(
                msg.proposal,
                flow,
                agent,
                now,
                self._projections,
                by_human=msg.by_human,
                inputs=inputs,
            )
        self._enforce(msg, flow, agent, attempt, judgement, submitted, stopwatch, out)
        if shadowed is not None:
            self._shadows.record(
                shadowed, judgement, msg.proposal, msg.dfid, flow.agent_id, submitted, out
            )

    def _flow_of(self, msg: Judge, out: Outbox) -> FlowState | None:
        """The flow a proposal is judged on, if its session and flow let it be (else refused)."""
        flow = out.flow(msg.dfid)
        agent_id = self._projections.sessions.get(session_hash(msg.token)) if msg.token else None
        if not msg.by_human and agent_id is None:
            refuse(msg, flow, ReasonCode.INVALID_SESSION, "the session token is not valid", out)
            return None
        if flow is None or (not msg.by_human and flow.agent_id != agent_id):
            refuse(msg, None, ReasonCode.FLOW_NOT_ACTIVE, f"no flow {msg.dfid} for this agent", out)
            return None
        return flow

    def _enforce(
        self,
        msg: Judge,
        flow: FlowState,
        agent: AgentView,
        attempt: int,
        judgement: Judgement,
        submitted: int,
        stopwatch: Stopwatch,
        out: Outbox,
    ) -> None:
        """Record the enforced verdict and what follows from it: reserve, escalate, execute."""
        staged = staged_of(out)
        state = staged.state(self._projections, agent)[0]
        own = staged.own(self._projections, msg.dfid)
        overruns = stopwatch.overruns
        if judgement.rejection is not None:
            self._rejected(msg, agent, attempt, judgement, submitted, overruns, out)
            return
        escalation = judgement.escalation
        if escalation is not None:
            recorded = out.emit(
                escalated(self._catalog, msg.dfid, msg.proposal, judgement, escalation),
                dfid=msg.dfid,
                after=submitted,
            )
            flag(self._catalog, msg, judgement, overruns, recorded, out)
            reserve(msg.dfid, flow.agent_id, judgement, own, recorded, out)
            self._screen(msg, state, out)
            out.send(self._escalation, Escalate(dfid=msg.dfid))
            out.reply(
                msg.reply,
                Verdict(
                    outcome=Outcome.ESCALATED, dfid=msg.dfid, attempt=attempt, feedback=escalation
                ),
            )
            return
        acceptance = ProposalAccepted(
            attempt=attempt,
            by_human=msg.by_human,
            pack=judgement.pack,
            applied=judgement.applied,
            grant=judgement.grant.grant if judgement.grant is not None else "",
        )
        # Judged with nothing recorded since the submission: the verdict travels with it.
        carried = out.travel_with(msg.dfid, acceptance)
        if carried is None:
            recorded = out.emit(acceptance, dfid=msg.dfid, after=submitted)
        else:
            recorded = carried
        use_grant(msg.dfid, judgement, recorded, out)
        staged.count_call(self._projections, msg.dfid)
        flag(self._catalog, msg, judgement, overruns, recorded, out)
        reserve(msg.dfid, flow.agent_id, judgement, own, recorded, out)
        self._screen(msg, state, out)
        # The start of execution goes into this append too (one commit fewer per flow);
        # the engine calls the adapter only once it is recorded (kernel.state.intents).
        accepted = out.flow(msg.dfid)
        assert accepted is not None
        applied = None
        if judgement.applied is not None:
            # Transformed: the intent carries the applied form, under the submission's key.
            minted = mint(self._catalog, accepted, policy=judgement.policy)
            applied = msgspec.structs.replace(
                minted, kind=judgement.applied.kind, params=dict(judgement.applied.params)
            )
        intent = stage_start(self._catalog, accepted, out, applied, policy=judgement.policy)
        if intent is not None:
            if self._catalog.reads_only.get(intent.kind, False):
                out.commit_lazily(msg.dfid)  # nothing to record first: group commit
            out.send(self._execution, Dispatch(dfid=msg.dfid, key=intent.key))
        out.reply(msg.reply, Verdict(outcome=Outcome.ACCEPTED, dfid=msg.dfid, attempt=attempt))

    def _ready(self, msg: Judge, flow: FlowState, out: Outbox) -> bool:
        """Whether the flow awaits this proposal; if not, answer (a duplicate, or refused)."""
        ready = flow.status is FlowStatus.VALIDATING if msg.by_human else flow.awaiting_proposal
        if ready:
            return True
        if flow.proposal == msg.proposal and flow.status not in (
            FlowStatus.VALIDATING,
            FlowStatus.ACTIVE,
        ):
            duplicate(msg, flow, out)
        elif flow.status is FlowStatus.ACTIVE:
            refuse(msg, flow, ReasonCode.FLOW_NOT_ACTIVE, "the flow awaits a fresh context", out)
        else:
            refuse(msg, flow, ReasonCode.FLOW_NOT_ACTIVE, f"flow is {flow.status}", out)
        return False

    def _charge(
        self,
        flow: FlowState,
        usage: Mapping[str, int],
        out: Outbox,
        *,
        after: int | None = None,
    ) -> None:
        """Record what an attempt's reasoning cost by the price table, one event per currency.

        Spent at once in the pools of the budgets that count reasoning (their flow tree,
        agent, session or desk), so the verdict that follows already has less room.
        """
        if not self._prices or not usage:
            return
        agent = self._projections.agents.get(flow.agent_id)
        by_currency = _cost(self._prices, usage)
        unpriced = sorted(m for m in usage if m not in self._prices)
        staged = staged_of(out)
        for currency, amount in sorted(by_currency.items()) or [("", 0)]:
            pools = self._reasoning_pools(currency, agent, flow)
            out.emit(
                ReasoningCharged(
                    tokens=dict(sorted(usage.items())),
                    amount=amount,
                    currency=currency,
                    unpriced=unpriced,
                    pools=sorted(set(pools)),
                ),
                dfid=flow.dfid,
                agent_id=flow.agent_id,
                after=after,
            )
            for pool in set(pools):
                staged.spent[pool] = staged.spent.get(pool, 0) + amount

    def _reasoning_pools(
        self, currency: str, agent: AgentView | None, flow: FlowState
    ) -> list[str]:
        """The pools of the budgets that count reasoning in ``currency`` for this flow."""
        if agent is None:
            return []
        return [
            pool
            for budgets in self._catalog.reasoning_budgets.values()
            for budget in budgets
            if budget.currency == currency
            if (pool := budget_pool(budget, agent, flow.root_dfid)) is not None
        ]

    def _screen(self, msg: Judge, state: Mapping[str, Any], out: Outbox) -> None:
        """Hand a proposal let through to the soft guards, once its verdict is recorded."""
        if self._guards is not None and msg.proposal.kind in self._catalog.guards_of:
            # Its own copy: the state seen is shared by the flows of this batch.
            screen = Screen(dfid=msg.dfid, proposal=msg.proposal, state=dict(state))
            out.send(self._guards, screen)

    def _rejected(
        self,
        msg: Judge,
        agent: AgentView,
        attempt: int,
        judgement: Judgement,
        submitted: int,
        overruns: list[Overrun],
        out: Outbox,
    ) -> None:
        feedback = judgement.rejection
        assert feedback is not None
        rejected = out.emit(
            ProposalRejected(attempt=attempt, feedback=feedback, pack=judgement.pack),
            dfid=msg.dfid,
            after=submitted,
        )
        flag(self._catalog, msg, judgement, overruns, rejected, out)
        if msg.by_human:
            out.emit(
                FlowAborted(
                    reason_code=feedback.reason_code,
                    detail=f"human modification refused: {feedback.detail}",
                ),
                dfid=msg.dfid,
                after=rejected,
            )
            outcome = Outcome.ABORTED
        elif msg.single:
            outcome, feedback = end_call(msg, feedback, rejected, out)
        elif attempt >= agent.manifest.max_attempts:
            out.emit(
                FlowAborted(
                    reason_code=ReasonCode.REASONING_EXHAUSTION,
                    detail=f"{attempt} proposals rejected; last: {feedback.reason_code}",
                ),
                dfid=msg.dfid,
                after=rejected,
            )
            outcome = Outcome.ABORTED
        else:
            # Posted: the compiler may be waiting for this actor's append (Carry).
            out.post(self._compiler, Compile(dfid=msg.dfid, attempt=attempt + 1, feedback=feedback))
            outcome = Outcome.REJECTED
        out.reply(
            msg.reply, Verdict(outcome=outcome, dfid=msg.dfid, attempt=attempt, feedback=feedback)
        )


def _cost(prices: Mapping[str, ModelPrice], usage: Mapping[str, int]) -> dict[str, int]:
    """What the priced models of ``usage`` cost, by currency."""
    by_currency: dict[str, int] = {}
    for model, tokens in sorted(usage.items()):
        price = prices.get(model)
        if price is not None:
            by_currency[price.currency] = by_currency.get(price.currency, 0) + price.cost(tokens)
    return by_currency


_STEPS: dict[type[DimMessage], Callable[[IntegrityModule, Any, Outbox], None]] = {
    Judge: IntegrityModule._judge,
    Recheck: IntegrityModule._recheck,
    IssueGrant: IntegrityModule._grant,
    VoteGrant: IntegrityModule._grant,
    RevokeGrant: IntegrityModule._grant,
    AmendLimit: IntegrityModule._amend,
    RecordAct: IntegrityModule._record_act,
    LoadPack: IntegrityModule._load_pack,
    LoadShadow: IntegrityModule._load_shadow,
    RetireShadow: IntegrityModule._retire_shadow,
    PromoteShadow: IntegrityModule._promote_shadow,
    SubmitRule: IntegrityModule._rule,
    DecideRule: IntegrityModule._rule,
    RetractRule: IntegrityModule._rule,
    Withdraw: IntegrityModule._withdraw,
}
"""Each message's step but Carry's, which hands its answers back to
:meth:`IntegrityModule.handle`."""
