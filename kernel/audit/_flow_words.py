"""The narrative's words for a flow's own events and the kernel's: from its trigger to its end."""

from __future__ import annotations

import json

from kernel.audit._words import count, count_of, says
from kernel.core import events as ev


@says(ev.ContextCompiled)
def _context_compiled(payload: ev.ContextCompiled) -> str:
    attempt = payload.attempt
    ref = payload.context_ref
    state = payload.state
    feedback = payload.feedback
    seen = ", ".join(f"{k}={v}" for k, v in list(state.items())[:6])
    more = f" (+{len(state) - 6} more)" if len(state) > 6 else ""
    after = f"; feedback {feedback.reason_code}" if feedback else ""
    return f"attempt {attempt}, context {ref[:12]}: {seen}{more}{after}"


@says(ev.ProposalSubmitted)
def _proposal_submitted(payload: ev.ProposalSubmitted) -> str:
    attempt = payload.attempt
    p = payload.proposal
    by_human = payload.by_human
    who = "human modification" if by_human else f"attempt {attempt}"
    params = json.dumps(p.params, sort_keys=True)
    explain = f"\n{'':40}explain: {p.explain!r}"
    return f"{who}: {p.kind} {params} confidence {p.confidence:g}{explain}"


@says(ev.ProposalRejected)
def _proposal_rejected(payload: ev.ProposalRejected) -> str:
    f = payload.feedback
    where = f" at {f.field}" if f.field else ""
    return f"REJECTED {f.reason_code} ({f.layer}{where}): {f.detail}"


@says(ev.ProposalAccepted)
def _proposal_accepted(payload: ev.ProposalAccepted) -> str:
    by_human = payload.by_human
    return "ACCEPTED" + (" by a human" if by_human else " by the DIM")


@says(ev.FlowEscalated)
def _flow_escalated(payload: ev.FlowEscalated) -> str:
    code = payload.reason_code
    detail = payload.detail
    impact = payload.impact
    h = payload.action_hash
    action = f", action {h[:10]}" if h else ", nothing to approve"
    return f"ESCALATED {code} ({impact}{action}): {detail}"


@says(ev.ApprovalExpired)
def _approval_expired(payload: ev.ApprovalExpired) -> str:
    detail = payload.detail
    return f"approval EXPIRED: {detail}"


@says(ev.DecisionRefused)
def _decision_refused(payload: ev.DecisionRefused) -> str:
    code = payload.reason_code
    decision = payload.decision
    operator = payload.operator
    d = payload.detail
    return f"{decision} by {operator} refused {code}: {d}"


@says(ev.HumanDecided)
def _human_decided(payload: ev.HumanDecided) -> str:
    decision = payload.decision
    operator = payload.operator
    reason = payload.reason
    params = payload.params
    changed = f" params {json.dumps(params, sort_keys=True)}" if params else ""
    return f"{decision} by {operator}: {reason!r}{changed}"


@says(ev.ExecutionStarted)
def _execution_started(payload: ev.ExecutionStarted) -> str:
    intent = payload.intent
    return f"intent {intent.kind} via {intent.adapter}, key {intent.key}"


@says(ev.ExecutionSucceeded)
def _execution_succeeded(payload: ev.ExecutionSucceeded) -> str:
    key = payload.key
    external_id = payload.external_id
    return f"effect recorded: external id {external_id} (key {key})"


@says(ev.ExecutionFailed)
def _execution_failed(payload: ev.ExecutionFailed) -> str:
    error = payload.error
    transient = payload.transient
    return f"{'transient' if transient else 'terminal'} failure: {error}"


@says(ev.DuplicateSuppressed)
def _duplicate_suppressed(payload: ev.DuplicateSuppressed) -> str:
    source = payload.source
    return f"duplicate {source} answered from the record; no second effect"


@says(ev.FlowClosed)
def _flow_closed(payload: ev.FlowClosed) -> str:
    return "CLOSED"


@says(ev.FlowAborted)
def _flow_aborted(payload: ev.FlowAborted) -> str:
    code = payload.reason_code
    detail = payload.detail
    return f"ABORTED {code}: {detail}"


@says(ev.SubmissionRefused)
def _submission_refused(payload: ev.SubmissionRefused) -> str:
    code = payload.reason_code
    detail = payload.detail
    return f"submission refused {code}: {detail}"


@says(ev.FlowFlagged)
def _flow_flagged(payload: ev.FlowFlagged) -> str:
    guard = payload.guard
    reason = payload.reason
    confidence = payload.confidence
    sure = f" (confidence {confidence})" if confidence else ""
    return f"NEEDS_REVIEW by guard {guard}{sure}: {reason}"


@says(ev.CitationsChecked)
def _citations_checked(payload: ev.CitationsChecked) -> str:
    correct = payload.correct
    incorrect = payload.incorrect
    wrong = "; ".join(f"{ref} {why}" for ref, why in incorrect.items())
    return f"citations: correct [{', '.join(correct)}]" + (f", INCORRECT {wrong}" if wrong else "")


@says(ev.ConstraintAdvisory)
def _constraint_advisory(payload: ev.ConstraintAdvisory) -> str:
    detail = payload.detail
    return f"ADVISORY (not refused) {detail}"


@says(ev.RuleProposed)
def _rule_proposed(payload: ev.RuleProposed) -> str:
    rule = payload.rule
    title = payload.title
    proposer = payload.proposer
    return f"rule {rule} proposed by {proposer}: {title!r}"


@says(ev.RuleDecided)
def _rule_decided(payload: ev.RuleDecided) -> str:
    rule = payload.rule
    d = payload.decision
    actor = payload.actor
    reason = payload.reason
    v = payload.version
    return f"rule {rule}: {d} by {actor} ({reason})" + (f" -> v{v}" if v else "")


@says(ev.KernelStarted)
def _kernel_started(payload: ev.KernelStarted) -> str:
    version = payload.kernel_version
    packs = payload.packs
    head = payload.head_seq
    names = ", ".join(f"{p.name} {p.version}" for p in packs) or "no packs"
    return f"kernel {version} started at #{head} with {names}"


@says(ev.KernelStopped)
def _kernel_stopped(payload: ev.KernelStopped) -> str:
    reason = payload.reason
    detail = payload.detail
    head = payload.head_seq
    return f"kernel stopped ({reason}) at #{head}" + (f": {detail}" if detail else "")


@says(ev.ActorRestarted)
def _actor_restarted(payload: ev.ActorRestarted) -> str:
    actor = payload.actor
    error = payload.error
    restarts = payload.restarts
    return f"actor {actor} restarted (restart {restarts}) after: {error}"


@says(ev.MessageDeadLettered)
def _message_dead_lettered(payload: ev.MessageDeadLettered) -> str:
    actor = payload.actor
    message = payload.message
    error = payload.error
    return f"a {message} message crashed {actor} twice and was set aside: {error}"


@says(ev.AgentRegistered)
def _agent_registered(payload: ev.AgentRegistered) -> str:
    manifest = payload.manifest
    return f"agent {manifest.agent_id} {manifest.version} registered"


@says(ev.AgentRefused)
def _agent_refused(payload: ev.AgentRefused) -> str:
    code = payload.reason_code
    detail = payload.detail
    version = payload.version
    return (
        f"agent refused {code}"
        + (f" (version {version})" if version else "")
        + (f": {detail}" if detail else "")
    )


@says(ev.AgentStatusChanged)
def _agent_status_changed(payload: ev.AgentStatusChanged) -> str:
    status = payload.status
    operator = payload.operator
    reason = payload.reason
    return f"agent status set to {status} by {operator or 'the kernel'}: {reason!r}"


@says(ev.DriftBreached)
def _drift_breached(payload: ev.DriftBreached) -> str:
    return (
        f"drift monitor {payload.monitor} breached for {payload.by} {payload.subject}: "
        f"{payload.metric} {payload.value:g} crossed {payload.bound:g} over "
        f"{payload.samples} samples (seq {payload.first_seq}..{payload.last_seq}), "
        f"action {payload.action}"
    )


@says(ev.ShadowLoaded)
def _shadow_loaded(p: ev.ShadowLoaded) -> str:
    return (
        f"pack {p.pack.name} {p.pack.version} shadows {p.enforced.version} by {p.operator}:"
        f" {p.reason!r} (it judges {', '.join(p.kinds) or 'nothing'}, decides nothing)"
    )


@says(ev.ShadowDiffered)
def _shadow_differed(p: ev.ShadowDiffered) -> str:
    return f"the shadow pack judged {p.kind} otherwise: {p.enforced.words()}, {p.judged.would()}"


@says(ev.ShadowRetired)
def _shadow_retired(p: ev.ShadowRetired) -> str:
    return f"shadow {p.pack.name} {p.pack.version} retired by {p.operator}: {p.reason!r}"


@says(ev.ShadowPromoted)
def _shadow_promoted(p: ev.ShadowPromoted) -> str:
    return (
        f"shadow {p.pack.name} {p.pack.version} promoted by {p.operator} on its report"
        f" {p.report[:16]} ({p.differed} of {p.judged} differ through #{p.as_of_seq}): {p.reason!r}"
    )


@says(ev.TenantDeclared)
def _tenant_declared(p: ev.TenantDeclared) -> str:
    spec = p.tenant
    members = len(spec.members)
    return (
        f"tenant {spec.id} declared by {p.operator} ({members} member"
        f"{'' if members == 1 else 's'}, fails {spec.policy.fail_mode})"
        + (f": {p.reason!r}" if p.reason else "")
    )


@says(ev.TenantPolicyChanged)
def _tenant_policy_changed(p: ev.TenantPolicyChanged) -> str:
    target = " x ".join(t for t in (f"user {p.user}" if p.user else "", p.kind) if t) or "default"
    return (
        f"tenant {p.tenant}'s policy for {target} (tier {p.tier}) set by {p.operator}:"
        f" {_layer_set(p)}"
    )


def _layer_set(p: ev.TenantPolicyChanged) -> str:
    parts = []
    if p.permission is not None:
        parts.append(f"permission {p.permission}")
    if p.rate_per_minute is not None:
        parts.append(f"{p.rate_per_minute} calls a minute")
    if p.scopes is not None:
        parts.append(f"scopes {', '.join(p.scopes) or 'none'}")
    return "; ".join(parts) or "nothing"


@says(ev.Delegated)
def _delegated(p: ev.Delegated) -> str:
    who = p.principal
    scopes = ", ".join(p.scopes) or "no scopes"
    return (
        f"{p.from_agent} delegated {p.task or 'a task'!r} to {p.to_agent} for {who.user}"
        f" in {who.tenant}, handing on {scopes} (chain {' > '.join(p.chain) or p.to_agent})"
    )


@says(ev.DecidedWithoutJournal)
def _decided_without_journal(p: ev.DecidedWithoutJournal) -> str:
    who = p.on_behalf.principal if p.on_behalf is not None else None
    whom = f" for {who.user} in {who.tenant}" if who is not None else ""
    verdict = "allowed" if p.allowed else f"refused {p.reason_code}"
    return f"{p.kind} by {p.agent_id}{whom} {verdict} while the journal's store was away"


@says(ev.TriggerFired)
def _trigger_fired(payload: ev.TriggerFired) -> str:
    topic = payload.topic
    facts = payload.facts
    source = payload.source
    origin = source or "the application"
    return f"trigger {topic!r} from {origin} with {count(facts, 'fact')}"


@says(ev.ExecutionRetried)
def _execution_retried(payload: ev.ExecutionRetried) -> str:
    key = payload.key
    attempt = payload.attempt
    error = payload.error
    delay = payload.delay_ns
    return f"call {attempt} failed ({error}); trying again in {delay / 1e9:g} s (key {key})"


@says(ev.ExecutionRefused)
def _execution_refused(payload: ev.ExecutionRefused) -> str:
    code = payload.reason_code
    bound = payload.bound
    detail = payload.detail
    return f"not executed {code}: {detail}" + (f" (bound {bound})" if bound else "")


@says(ev.FlowDirty)
def _flow_dirty(payload: ev.FlowDirty) -> str:
    step = payload.step
    code = payload.reason_code
    detail = payload.detail
    return f"DIRTY at step {step} {code}: {detail}; what was done is to be undone"


@says(ev.CompensationStarted)
def _compensation_started(payload: ev.CompensationStarted) -> str:
    intent = payload.intent
    what = f"{intent.kind} via {intent.adapter}"
    return f"undoing step {intent.step}: {what}, key {intent.key}"


@says(ev.CompensationSucceeded)
def _compensation_succeeded(payload: ev.CompensationSucceeded) -> str:
    step = payload.step
    external_id = payload.external_id
    return f"step {step} undone: external id {external_id or '-'}"


@says(ev.CompensationFailed)
def _compensation_failed(payload: ev.CompensationFailed) -> str:
    step = payload.step
    error = payload.error
    transient = payload.transient
    how = "transient" if transient else "terminal"
    return f"undoing step {step} failed ({how}): {error}"


@says(ev.FlowCompensated)
def _flow_compensated(payload: ev.FlowCompensated) -> str:
    steps = payload.steps
    return f"COMPENSATED: {count_of(steps, 'step')} undone"
