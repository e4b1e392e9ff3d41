"""A flow's narrative in plain words: what ``dirk show`` prints and the console shows.

One line per event, the same words everywhere a person reads a flow. The words for each event
type are a small function in one table (``_WORDS``), entered with ``@_says``: a new event type
is a new entry, never a longer ``match``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from kernel.core import events as ev
from kernel.core.events import Event
from kernel.core.flow import FlowState
from kernel.policy.money import POOL_PREFIX, format_money


def outcome(flow: FlowState) -> str:
    """Return how a flow ended (or where it stands), in one line."""
    tries = f"{flow.attempts} attempt{'s' if flow.attempts != 1 else ''}"
    line = f"final status {flow.status} after {tries}"
    if flow.reason_code:
        line += f", reason {flow.reason_code}"
    if flow.external_id:
        line += f", external id {flow.external_id}"
    if flow.needs_review:
        line += "; NEEDS_REVIEW (see the flags above)"
    return line


_P = TypeVar("_P")
_WORDS: dict[type[Any], Callable[[Any], str]] = {}


def _says(kind: type[_P]) -> Callable[[Callable[[_P], str]], Callable[[_P], str]]:
    """Enter the function that words one event type into the table."""

    def enter(words: Callable[[_P], str]) -> Callable[[_P], str]:
        assert kind not in _WORDS, kind
        _WORDS[kind] = words
        return words

    return enter


def narrate(event: Event) -> str:
    """Return what one event of a flow says, in one line (two for a proposal's explanation)."""
    payload = event.payload
    if isinstance(payload, ev.FlowCreated):
        return f"trigger {payload.topic!r}" + (
            f" (caused by #{event.caused_by})" if event.caused_by else ""
        )
    line = _words_of(payload)
    if line is not None:
        return line
    # An event type this module does not know yet (a domain's): its fields, in words.
    fields = msgspec.structs.asdict(payload) if isinstance(payload, msgspec.Struct) else {}
    shown = ", ".join(f"{k}={v!r}" for k, v in list(fields.items())[:6])
    return f"{event.type}: {shown}"[:300]


def _words_of(payload: object) -> str | None:
    """Return the line the table has for this payload's type; None for a type it lacks."""
    words = _WORDS.get(type(payload))
    return None if words is None else words(payload)


def _count(items: object, word: str) -> str:
    return _count_of(len(items) if hasattr(items, "__len__") else 0, word)


def _count_of(n: int, word: str) -> str:
    if word in ("promoted", "archived", "discarded"):
        return f"{n} {word}"
    return f"{n} {word}{'' if n == 1 else 's'}"


@_says(ev.ContextCompiled)
def _context_compiled(payload: ev.ContextCompiled) -> str:
    attempt = payload.attempt
    ref = payload.context_ref
    state = payload.state
    feedback = payload.feedback
    seen = ", ".join(f"{k}={v}" for k, v in list(state.items())[:6])
    more = f" (+{len(state) - 6} more)" if len(state) > 6 else ""
    after = f"; feedback {feedback.reason_code}" if feedback else ""
    return f"attempt {attempt}, context {ref[:12]}: {seen}{more}{after}"


@_says(ev.ProposalSubmitted)
def _proposal_submitted(payload: ev.ProposalSubmitted) -> str:
    attempt = payload.attempt
    p = payload.proposal
    by_human = payload.by_human
    who = "human modification" if by_human else f"attempt {attempt}"
    params = json.dumps(p.params, sort_keys=True)
    explain = f"\n{'':40}explain: {p.explain!r}"
    return f"{who}: {p.kind} {params} confidence {p.confidence:g}{explain}"


@_says(ev.ProposalRejected)
def _proposal_rejected(payload: ev.ProposalRejected) -> str:
    f = payload.feedback
    where = f" at {f.field}" if f.field else ""
    return f"REJECTED {f.reason_code} ({f.layer}{where}): {f.detail}"


@_says(ev.ProposalAccepted)
def _proposal_accepted(payload: ev.ProposalAccepted) -> str:
    by_human = payload.by_human
    return "ACCEPTED" + (" by a human" if by_human else " by the DIM")


@_says(ev.FlowEscalated)
def _flow_escalated(payload: ev.FlowEscalated) -> str:
    code = payload.reason_code
    detail = payload.detail
    impact = payload.impact
    h = payload.action_hash
    action = f", action {h[:10]}" if h else ", nothing to approve"
    return f"ESCALATED {code} ({impact}{action}): {detail}"


@_says(ev.ApprovalExpired)
def _approval_expired(payload: ev.ApprovalExpired) -> str:
    detail = payload.detail
    return f"approval EXPIRED: {detail}"


@_says(ev.DecisionRefused)
def _decision_refused(payload: ev.DecisionRefused) -> str:
    code = payload.reason_code
    decision = payload.decision
    operator = payload.operator
    d = payload.detail
    return f"{decision} by {operator} refused {code}: {d}"


@_says(ev.HumanDecided)
def _human_decided(payload: ev.HumanDecided) -> str:
    decision = payload.decision
    operator = payload.operator
    reason = payload.reason
    params = payload.params
    changed = f" params {json.dumps(params, sort_keys=True)}" if params else ""
    return f"{decision} by {operator}: {reason!r}{changed}"


@_says(ev.ExecutionStarted)
def _execution_started(payload: ev.ExecutionStarted) -> str:
    intent = payload.intent
    return f"intent {intent.kind} via {intent.adapter}, key {intent.key}"


@_says(ev.ExecutionSucceeded)
def _execution_succeeded(payload: ev.ExecutionSucceeded) -> str:
    key = payload.key
    external_id = payload.external_id
    return f"effect recorded: external id {external_id} (key {key})"


@_says(ev.ExecutionFailed)
def _execution_failed(payload: ev.ExecutionFailed) -> str:
    error = payload.error
    transient = payload.transient
    return f"{'transient' if transient else 'terminal'} failure: {error}"


@_says(ev.DuplicateSuppressed)
def _duplicate_suppressed(payload: ev.DuplicateSuppressed) -> str:
    source = payload.source
    return f"duplicate {source} answered from the record; no second effect"


@_says(ev.FlowClosed)
def _flow_closed(payload: ev.FlowClosed) -> str:
    return "CLOSED"


@_says(ev.FlowAborted)
def _flow_aborted(payload: ev.FlowAborted) -> str:
    code = payload.reason_code
    detail = payload.detail
    return f"ABORTED {code}: {detail}"


@_says(ev.SubmissionRefused)
def _submission_refused(payload: ev.SubmissionRefused) -> str:
    code = payload.reason_code
    detail = payload.detail
    return f"submission refused {code}: {detail}"


@_says(ev.FlowFlagged)
def _flow_flagged(payload: ev.FlowFlagged) -> str:
    guard = payload.guard
    reason = payload.reason
    confidence = payload.confidence
    sure = f" (confidence {confidence})" if confidence else ""
    return f"NEEDS_REVIEW by guard {guard}{sure}: {reason}"


@_says(ev.CitationsChecked)
def _citations_checked(payload: ev.CitationsChecked) -> str:
    correct = payload.correct
    incorrect = payload.incorrect
    wrong = "; ".join(f"{ref} {why}" for ref, why in incorrect.items())
    return f"citations: correct [{', '.join(correct)}]" + (f", INCORRECT {wrong}" if wrong else "")


@_says(ev.ConstraintAdvisory)
def _constraint_advisory(payload: ev.ConstraintAdvisory) -> str:
    detail = payload.detail
    return f"ADVISORY (not refused) {detail}"


@_says(ev.RuleProposed)
def _rule_proposed(payload: ev.RuleProposed) -> str:
    rule = payload.rule
    title = payload.title
    proposer = payload.proposer
    return f"rule {rule} proposed by {proposer}: {title!r}"


@_says(ev.RuleDecided)
def _rule_decided(payload: ev.RuleDecided) -> str:
    rule = payload.rule
    d = payload.decision
    actor = payload.actor
    reason = payload.reason
    v = payload.version
    return f"rule {rule}: {d} by {actor} ({reason})" + (f" -> v{v}" if v else "")


@_says(ev.KernelStarted)
def _kernel_started(payload: ev.KernelStarted) -> str:
    version = payload.kernel_version
    packs = payload.packs
    head = payload.head_seq
    names = ", ".join(f"{p.name} {p.version}" for p in packs) or "no packs"
    return f"kernel {version} started at #{head} with {names}"


@_says(ev.KernelStopped)
def _kernel_stopped(payload: ev.KernelStopped) -> str:
    reason = payload.reason
    detail = payload.detail
    head = payload.head_seq
    return f"kernel stopped ({reason}) at #{head}" + (f": {detail}" if detail else "")


@_says(ev.ActorRestarted)
def _actor_restarted(payload: ev.ActorRestarted) -> str:
    actor = payload.actor
    error = payload.error
    restarts = payload.restarts
    return f"actor {actor} restarted (restart {restarts}) after: {error}"


@_says(ev.MessageDeadLettered)
def _message_dead_lettered(payload: ev.MessageDeadLettered) -> str:
    actor = payload.actor
    message = payload.message
    error = payload.error
    return f"a {message} message crashed {actor} twice and was set aside: {error}"


@_says(ev.AgentRegistered)
def _agent_registered(payload: ev.AgentRegistered) -> str:
    manifest = payload.manifest
    return f"agent {manifest.agent_id} {manifest.version} registered"


@_says(ev.AgentRefused)
def _agent_refused(payload: ev.AgentRefused) -> str:
    code = payload.reason_code
    detail = payload.detail
    version = payload.version
    return (
        f"agent refused {code}"
        + (f" (version {version})" if version else "")
        + (f": {detail}" if detail else "")
    )


@_says(ev.AgentStatusChanged)
def _agent_status_changed(payload: ev.AgentStatusChanged) -> str:
    status = payload.status
    operator = payload.operator
    reason = payload.reason
    return f"agent status set to {status} by {operator or 'the kernel'}: {reason!r}"


@_says(ev.DriftBreached)
def _drift_breached(payload: ev.DriftBreached) -> str:
    return (
        f"drift monitor {payload.monitor} breached for {payload.by} {payload.subject}: "
        f"{payload.metric} {payload.value:g} crossed {payload.bound:g} over "
        f"{payload.samples} samples (seq {payload.first_seq}..{payload.last_seq}), "
        f"action {payload.action}"
    )


@_says(ev.ShadowLoaded)
def _shadow_loaded(p: ev.ShadowLoaded) -> str:
    return (
        f"pack {p.pack.name} {p.pack.version} shadows {p.enforced.version} by {p.operator}:"
        f" {p.reason!r} (it judges {', '.join(p.kinds) or 'nothing'}, decides nothing)"
    )


@_says(ev.ShadowDiffered)
def _shadow_differed(p: ev.ShadowDiffered) -> str:
    return f"the shadow pack judged {p.kind} otherwise: {p.enforced.words()}, {p.judged.would()}"


@_says(ev.ShadowRetired)
def _shadow_retired(p: ev.ShadowRetired) -> str:
    return f"shadow {p.pack.name} {p.pack.version} retired by {p.operator}: {p.reason!r}"


@_says(ev.ShadowPromoted)
def _shadow_promoted(p: ev.ShadowPromoted) -> str:
    return (
        f"shadow {p.pack.name} {p.pack.version} promoted by {p.operator} on its report"
        f" {p.report[:16]} ({p.differed} of {p.judged} differ through #{p.as_of_seq}): {p.reason!r}"
    )


@_says(ev.TenantDeclared)
def _tenant_declared(p: ev.TenantDeclared) -> str:
    spec = p.tenant
    members = len(spec.members)
    return (
        f"tenant {spec.id} declared by {p.operator} ({members} member"
        f"{'' if members == 1 else 's'}, fails {spec.policy.fail_mode})"
        + (f": {p.reason!r}" if p.reason else "")
    )


@_says(ev.TenantPolicyChanged)
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


@_says(ev.Delegated)
def _delegated(p: ev.Delegated) -> str:
    who = p.principal
    scopes = ", ".join(p.scopes) or "no scopes"
    return (
        f"{p.from_agent} delegated {p.task or 'a task'!r} to {p.to_agent} for {who.user}"
        f" in {who.tenant}, handing on {scopes} (chain {' > '.join(p.chain) or p.to_agent})"
    )


@_says(ev.DecidedWithoutJournal)
def _decided_without_journal(p: ev.DecidedWithoutJournal) -> str:
    who = p.on_behalf.principal if p.on_behalf is not None else None
    whom = f" for {who.user} in {who.tenant}" if who is not None else ""
    verdict = "allowed" if p.allowed else f"refused {p.reason_code}"
    return f"{p.kind} by {p.agent_id}{whom} {verdict} while the journal's store was away"


@_says(ev.TriggerFired)
def _trigger_fired(payload: ev.TriggerFired) -> str:
    topic = payload.topic
    facts = payload.facts
    source = payload.source
    origin = source or "the application"
    return f"trigger {topic!r} from {origin} with {_count(facts, 'fact')}"


@_says(ev.ExecutionRetried)
def _execution_retried(payload: ev.ExecutionRetried) -> str:
    key = payload.key
    attempt = payload.attempt
    error = payload.error
    delay = payload.delay_ns
    return f"call {attempt} failed ({error}); trying again in {delay / 1e9:g} s (key {key})"


@_says(ev.ExecutionRefused)
def _execution_refused(payload: ev.ExecutionRefused) -> str:
    code = payload.reason_code
    bound = payload.bound
    detail = payload.detail
    return f"not executed {code}: {detail}" + (f" (bound {bound})" if bound else "")


@_says(ev.FlowDirty)
def _flow_dirty(payload: ev.FlowDirty) -> str:
    step = payload.step
    code = payload.reason_code
    detail = payload.detail
    return f"DIRTY at step {step} {code}: {detail}; what was done is to be undone"


@_says(ev.CompensationStarted)
def _compensation_started(payload: ev.CompensationStarted) -> str:
    intent = payload.intent
    what = f"{intent.kind} via {intent.adapter}"
    return f"undoing step {intent.step}: {what}, key {intent.key}"


@_says(ev.CompensationSucceeded)
def _compensation_succeeded(payload: ev.CompensationSucceeded) -> str:
    step = payload.step
    external_id = payload.external_id
    return f"step {step} undone: external id {external_id or '-'}"


@_says(ev.CompensationFailed)
def _compensation_failed(payload: ev.CompensationFailed) -> str:
    step = payload.step
    error = payload.error
    transient = payload.transient
    how = "transient" if transient else "terminal"
    return f"undoing step {step} failed ({how}): {error}"


@_says(ev.FlowCompensated)
def _flow_compensated(payload: ev.FlowCompensated) -> str:
    steps = payload.steps
    return f"COMPENSATED: {_count_of(steps, 'step')} undone"


@_says(ev.ResourceReserved)
def _resource_reserved(payload: ev.ResourceReserved) -> str:
    pool = payload.pool
    amount = payload.amount
    if pool.startswith(POOL_PREFIX):
        return f"holds {format_money(amount, pool.split(':')[1])} of {pool}"
    return f"reserved {amount} of {pool}"


@_says(ev.ResourceReleased)
def _resource_released(payload: ev.ResourceReleased) -> str:
    pool = payload.pool
    amount = payload.amount
    reason = payload.reason
    if pool.startswith(POOL_PREFIX):
        money = format_money(amount, pool.split(":")[1])
        # A closed flow spends what it held of a money pool; any other end gives it back.
        if reason == "CLOSED":
            return f"spends {money} of {pool}"
        return f"gives back {money} of {pool} ({reason})"
    return f"released {amount} of {pool}" + (f" ({reason})" if reason else "")


@_says(ev.ProjectionCheckpoint)
def _projection_checkpoint(payload: ev.ProjectionCheckpoint) -> str:
    seq = payload.seq
    digest = payload.digest
    return f"checkpoint of the state up to #{seq} (digest {digest[:12]})"


@_says(ev.FactAdded)
def _fact_added(payload: ev.FactAdded) -> str:
    name = payload.name
    value = payload.value
    confidence = payload.confidence
    sure = f" (confidence {confidence})" if confidence else ""
    return f"fact {name} = {value!r}{sure}"


@_says(ev.ConstraintAdded)
def _constraint_added(payload: ev.ConstraintAdded) -> str:
    text = payload.text
    priority = payload.priority
    cause = payload.triggered_by
    why = f", triggered by #{cause}" if cause else ""
    return f"constraint ({priority}{why}): {text!r}"


@_says(ev.ConstraintDeactivated)
def _constraint_deactivated(payload: ev.ConstraintDeactivated) -> str:
    constraint = payload.constraint
    reason = payload.reason
    return f"constraint #{constraint} deactivated: {reason!r}"


@_says(ev.DecisionMade)
def _decision_made(payload: ev.DecisionMade) -> str:
    text = payload.text
    rationale = payload.rationale
    return f"decision recorded: {text!r}" + (f" because {rationale!r}" if rationale else "")


@_says(ev.MemoryQueried)
def _memory_queried(payload: ev.MemoryQueried) -> str:
    topic = payload.topic
    facts = payload.facts
    constraints = payload.constraints
    found = f"{_count(facts, 'fact')}, {_count(constraints, 'constraint')}"
    return f"memory queried on {topic!r}: {found}"


@_says(ev.PackLoaded)
def _pack_loaded(payload: ev.PackLoaded) -> str:
    pack = payload.pack
    previous = payload.previous
    operator = payload.operator
    reason = payload.reason
    was = f" (was {previous})" if previous else ""
    return f"pack {pack.name} {pack.version} loaded{was} by {operator}: {reason!r}"


@_says(ev.LimitAmended)
def _limit_amended(payload: ev.LimitAmended) -> str:
    limit = payload.limit
    value = payload.value
    operator = payload.operator
    reason = payload.reason
    return f"limit {limit} amended to {value} by {operator}: {reason!r}"


@_says(ev.AmendmentRefused)
def _amendment_refused(payload: ev.AmendmentRefused) -> str:
    code = payload.reason_code
    limit = payload.limit
    operator = payload.operator
    d = payload.detail
    return f"amendment of {limit} by {operator} refused {code}: {d}"


@_says(ev.InputRefused)
def _input_refused(payload: ev.InputRefused) -> str:
    code = payload.reason_code
    entry = payload.entry
    field = payload.field
    detail = payload.detail
    where = f" at {field}" if field else ""
    return f"input refused at the {entry} {code}{where}: {detail}"


@_says(ev.RuleRetracted)
def _rule_retracted(payload: ev.RuleRetracted) -> str:
    rule = payload.rule
    operator = payload.operator
    reason = payload.reason
    version = payload.version
    return f"rule {rule} v{version} retracted by {operator}: {reason!r}"


@_says(ev.CredentialIssued)
def _credential_issued(payload: ev.CredentialIssued) -> str:
    operator = payload.operator
    reason = payload.reason
    return f"credential issued by {operator}: {reason!r}"


@_says(ev.OperatorKeyTrusted)
def _operator_key_trusted(payload: ev.OperatorKeyTrusted) -> str:
    name = payload.name
    role = payload.role
    fingerprint = payload.fingerprint
    return f"key {fingerprint} of {name} ({role}) trusted"


@_says(ev.OperatorKeyRevoked)
def _operator_key_revoked(payload: ev.OperatorKeyRevoked) -> str:
    name = payload.name
    fingerprint = payload.fingerprint
    detail = payload.detail
    return f"key {fingerprint} of {name} revoked" + (f": {detail}" if detail else "")


@_says(ev.RequestVerified)
def _request_verified(payload: ev.RequestVerified) -> str:
    row = payload.inbox_id
    request = payload.request
    who = payload.principal
    signer = payload.signer
    by = f", signed by {signer}" if signer and signer != who else ""
    return f"inbox row {row}: {request} by {who}{by}, signature verified"


@_says(ev.SourceRegistered)
def _source_registered(payload: ev.SourceRegistered) -> str:
    source = payload.source
    kind = payload.source_type
    reliability = payload.reliability
    return f"source {source} ({kind}) registered, reliability {reliability}"


@_says(ev.ObservationRecorded)
def _observation_recorded(payload: ev.ObservationRecorded) -> str:
    observation = payload.observation
    source = payload.source
    status = payload.ingest_status
    return f"observation {observation} from {source}: {status}"


@_says(ev.EntityCandidateRecorded)
def _entity_candidate_recorded(payload: ev.EntityCandidateRecorded) -> str:
    entity = payload.entity
    name = payload.name
    kind = payload.entity_type
    return f"entity {entity} {name!r} ({kind}) recorded"


@_says(ev.PropositionProposed)
def _proposition_proposed(payload: ev.PropositionProposed) -> str:
    proposition = payload.proposition
    text = payload.text
    return f"proposition {proposition} proposed: {text!r}"


@_says(ev.EvidenceAttached)
def _evidence_attached(payload: ev.EvidenceAttached) -> str:
    proposition = payload.proposition
    stance = payload.stance
    source = payload.source
    return f"evidence {stance} proposition {proposition} from {source}"


@_says(ev.TestResultIngested)
def _test_result_ingested(payload: ev.TestResultIngested) -> str:
    test = payload.test
    proposition = payload.proposition
    result = payload.outcome
    return f"test {test} of proposition {proposition}: {result}"


@_says(ev.PropositionTransitioned)
def _proposition_transitioned(payload: ev.PropositionTransitioned) -> str:
    p = payload.proposition
    a = payload.from_state
    b = payload.to_state
    cause = payload.cause
    return f"proposition {p}: {a} -> {b} ({cause})"


@_says(ev.ConsolidationRecorded)
def _consolidation_recorded(payload: ev.ConsolidationRecorded) -> str:
    promoted = payload.promoted
    archived = payload.archived
    gone = payload.discarded
    return (
        f"consolidation: {_count(promoted, 'promoted')}, {_count(archived, 'archived')},"
        f" {_count(gone, 'discarded')}"
    )


@_says(ev.EpisodeArchived)
def _episode_archived(payload: ev.EpisodeArchived) -> str:
    episode = payload.episode
    summary = payload.summary
    return f"episode {episode} archived: {summary!r}"


@_says(ev.ApprovalVoted)
def _approval_voted(payload: ev.ApprovalVoted) -> str:
    vote = payload.vote
    operator = payload.operator
    reason = payload.reason
    w = payload.waiting
    met = payload.met
    stands = "quorum met" if met else w
    return f"{vote} vote by {operator}: {reason!r}" + (f" ({stands})" if stands else "")


@_says(ev.ApprovalSuperseded)
def _approval_superseded(p: ev.ApprovalSuperseded) -> str:
    approved = p.approved
    current = p.current
    outcome = p.outcome
    then = f"{approved.name} {approved.version}" if approved else "an earlier pack"
    now = f"{current.name} {current.version}" if current else "no pack"
    return (
        f"{p.via} judged again before executing: approved under {then}, {outcome}"
        f" under {now}: {p.reason_code} ({p.layer}): {p.detail}"
    )


@_says(ev.GrantUsed)
def _grant_used(p: ev.GrantUsed) -> str:
    grant = p.grant
    uses = p.uses
    amount = p.amount
    currency = p.currency
    money = f", {format_money(amount, currency)}" if currency else ""
    instead = f" instead of {p.escalation}" if p.escalation else ""
    return f"proceeds under grant {grant} (use {uses}{money}){instead}"


@_says(ev.ReasoningCharged)
def _reasoning_charged(payload: ev.ReasoningCharged) -> str:
    tokens = payload.tokens
    amount = payload.amount
    currency = payload.currency
    u = payload.unpriced
    used = ", ".join(f"{n} {model}" for model, n in sorted(tokens.items()))
    unknown = f"; no price for {', '.join(u)}" if u else ""
    return f"reasoning {format_money(amount, currency)} ({used} tokens){unknown}"


@_says(ev.WebhookDelivered)
def _webhook_delivered(payload: ev.WebhookDelivered) -> str:
    hook = payload.hook
    notice = payload.notice
    status = payload.status
    attempts = payload.attempts
    return f"webhook {hook} took the {notice} (HTTP {status}, attempt {attempts})"


@_says(ev.WebhookFailed)
def _webhook_failed(payload: ev.WebhookFailed) -> str:
    hook = payload.hook
    notice = payload.notice
    error = payload.error
    attempts = payload.attempts
    return f"webhook {hook} did not take the {notice} after {attempts} tries: {error}"


@_says(ev.GrantIssued)
def _grant_issued(p: ev.GrantIssued) -> str:
    grant = p.grant
    kind = p.kind
    uses = p.uses
    operator = p.operator
    agent = p.agent
    cap = f", up to {format_money(p.cap, p.currency)}" if p.cap is not None else ""
    who = "any agent" if agent == "*" else agent
    return f"grant {grant} issued by {operator}: {kind} for {who}, {uses} uses{cap}"


@_says(ev.GrantVoted)
def _grant_voted(payload: ev.GrantVoted) -> str:
    grant = payload.grant
    vote = payload.vote
    operator = payload.operator
    met = payload.met
    waiting = payload.waiting
    stands = "quorum met" if met else waiting
    return f"{vote} vote on grant {grant} by {operator}" + (f" ({stands})" if stands else "")


@_says(ev.GrantRevoked)
def _grant_revoked(payload: ev.GrantRevoked) -> str:
    grant = payload.grant
    operator = payload.operator
    reason = payload.reason
    return f"grant {grant} revoked by {operator}: {reason!r}"


@_says(ev.MeaningScored)
def _meaning_scored(payload: ev.MeaningScored) -> str:
    model = payload.model
    version = payload.version
    threshold = payload.threshold
    scores = payload.scores
    return (
        f"meaning scored by {model} {version}: {len(scores)} constraint"
        f"{'' if len(scores) == 1 else 's'} against threshold {threshold}"
    )


@_says(ev.ArtifactStored)
def _artifact_stored(payload: ev.ArtifactStored) -> str:
    ref = payload.ref
    size = payload.size
    media = payload.media_type
    by = payload.by
    return f"artifact {ref[:16]} stored ({size} bytes, {media})" + (f" by {by}" if by else "")


@_says(ev.ArtifactsCollected)
def _artifacts_collected(payload: ev.ArtifactsCollected) -> str:
    refs = payload.refs
    size = payload.size
    operator = payload.operator
    return f"{len(refs)} unreferenced artifact(s) collected ({size} bytes)" + (
        f" by {operator}" if operator else ""
    )


@_says(ev.CheckpointKeyChanged)
def _checkpoint_key_changed(payload: ev.CheckpointKeyChanged) -> str:
    origin = payload.origin
    key = payload.key
    previous = payload.previous
    instead = f", replacing {previous}" if previous else ""
    return f"checkpoints of {origin} signed with key {key}{instead}"


@_says(ev.SubjectErased)
def _subject_erased(payload: ev.SubjectErased) -> str:
    subject = payload.subject
    keys = payload.keys
    operator = payload.operator
    rule = payload.retention
    by = f" by {operator}" if operator else f" (retention {rule})" if rule else ""
    return f"data subject {subject} erased{by}: {keys} key(s) destroyed"
