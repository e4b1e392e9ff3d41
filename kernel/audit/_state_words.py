"""The narrative's words for the records beside the flows: resources, memory, packs, keys,
beliefs, grants, artifacts."""

from __future__ import annotations

from kernel.audit._words import count, says
from kernel.core import events as ev
from kernel.policy.money import POOL_PREFIX, format_money


@says(ev.ResourceReserved)
def _resource_reserved(payload: ev.ResourceReserved) -> str:
    pool = payload.pool
    amount = payload.amount
    if pool.startswith(POOL_PREFIX):
        return f"holds {format_money(amount, pool.split(':')[1])} of {pool}"
    return f"reserved {amount} of {pool}"


@says(ev.ResourceReleased)
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


@says(ev.ProjectionCheckpoint)
def _projection_checkpoint(payload: ev.ProjectionCheckpoint) -> str:
    seq = payload.seq
    digest = payload.digest
    return f"checkpoint of the state up to #{seq} (digest {digest[:12]})"


@says(ev.FactAdded)
def _fact_added(payload: ev.FactAdded) -> str:
    name = payload.name
    value = payload.value
    confidence = payload.confidence
    sure = f" (confidence {confidence})" if confidence else ""
    return f"fact {name} = {value!r}{sure}"


@says(ev.ConstraintAdded)
def _constraint_added(payload: ev.ConstraintAdded) -> str:
    text = payload.text
    priority = payload.priority
    cause = payload.triggered_by
    why = f", triggered by #{cause}" if cause else ""
    return f"constraint ({priority}{why}): {text!r}"


@says(ev.ConstraintDeactivated)
def _constraint_deactivated(payload: ev.ConstraintDeactivated) -> str:
    constraint = payload.constraint
    reason = payload.reason
    return f"constraint #{constraint} deactivated: {reason!r}"


@says(ev.DecisionMade)
def _decision_made(payload: ev.DecisionMade) -> str:
    text = payload.text
    rationale = payload.rationale
    return f"decision recorded: {text!r}" + (f" because {rationale!r}" if rationale else "")


@says(ev.MemoryQueried)
def _memory_queried(payload: ev.MemoryQueried) -> str:
    topic = payload.topic
    facts = payload.facts
    constraints = payload.constraints
    found = f"{count(facts, 'fact')}, {count(constraints, 'constraint')}"
    return f"memory queried on {topic!r}: {found}"


@says(ev.PackLoaded)
def _pack_loaded(payload: ev.PackLoaded) -> str:
    pack = payload.pack
    previous = payload.previous
    operator = payload.operator
    reason = payload.reason
    was = f" (was {previous})" if previous else ""
    return f"pack {pack.name} {pack.version} loaded{was} by {operator}: {reason!r}"


@says(ev.LimitAmended)
def _limit_amended(payload: ev.LimitAmended) -> str:
    limit = payload.limit
    value = payload.value
    operator = payload.operator
    reason = payload.reason
    return f"limit {limit} amended to {value} by {operator}: {reason!r}"


@says(ev.AmendmentRefused)
def _amendment_refused(payload: ev.AmendmentRefused) -> str:
    code = payload.reason_code
    limit = payload.limit
    operator = payload.operator
    d = payload.detail
    return f"amendment of {limit} by {operator} refused {code}: {d}"


@says(ev.InputRefused)
def _input_refused(payload: ev.InputRefused) -> str:
    code = payload.reason_code
    entry = payload.entry
    field = payload.field
    detail = payload.detail
    where = f" at {field}" if field else ""
    return f"input refused at the {entry} {code}{where}: {detail}"


@says(ev.RuleRetracted)
def _rule_retracted(payload: ev.RuleRetracted) -> str:
    rule = payload.rule
    operator = payload.operator
    reason = payload.reason
    version = payload.version
    return f"rule {rule} v{version} retracted by {operator}: {reason!r}"


@says(ev.CredentialIssued)
def _credential_issued(payload: ev.CredentialIssued) -> str:
    operator = payload.operator
    reason = payload.reason
    return f"credential issued by {operator}: {reason!r}"


@says(ev.OperatorKeyTrusted)
def _operator_key_trusted(payload: ev.OperatorKeyTrusted) -> str:
    name = payload.name
    role = payload.role
    fingerprint = payload.fingerprint
    return f"key {fingerprint} of {name} ({role}) trusted"


@says(ev.OperatorKeyRevoked)
def _operator_key_revoked(payload: ev.OperatorKeyRevoked) -> str:
    name = payload.name
    fingerprint = payload.fingerprint
    detail = payload.detail
    return f"key {fingerprint} of {name} revoked" + (f": {detail}" if detail else "")


@says(ev.RequestVerified)
def _request_verified(payload: ev.RequestVerified) -> str:
    row = payload.inbox_id
    request = payload.request
    who = payload.principal
    signer = payload.signer
    by = f", signed by {signer}" if signer and signer != who else ""
    return f"inbox row {row}: {request} by {who}{by}, signature verified"


@says(ev.SourceRegistered)
def _source_registered(payload: ev.SourceRegistered) -> str:
    source = payload.source
    kind = payload.source_type
    reliability = payload.reliability
    return f"source {source} ({kind}) registered, reliability {reliability}"


@says(ev.ObservationRecorded)
def _observation_recorded(payload: ev.ObservationRecorded) -> str:
    observation = payload.observation
    source = payload.source
    status = payload.ingest_status
    return f"observation {observation} from {source}: {status}"


@says(ev.EntityCandidateRecorded)
def _entity_candidate_recorded(payload: ev.EntityCandidateRecorded) -> str:
    entity = payload.entity
    name = payload.name
    kind = payload.entity_type
    return f"entity {entity} {name!r} ({kind}) recorded"


@says(ev.PropositionProposed)
def _proposition_proposed(payload: ev.PropositionProposed) -> str:
    proposition = payload.proposition
    text = payload.text
    return f"proposition {proposition} proposed: {text!r}"


@says(ev.EvidenceAttached)
def _evidence_attached(payload: ev.EvidenceAttached) -> str:
    proposition = payload.proposition
    stance = payload.stance
    source = payload.source
    return f"evidence {stance} proposition {proposition} from {source}"


@says(ev.TestResultIngested)
def _test_result_ingested(payload: ev.TestResultIngested) -> str:
    test = payload.test
    proposition = payload.proposition
    result = payload.outcome
    return f"test {test} of proposition {proposition}: {result}"


@says(ev.PropositionTransitioned)
def _proposition_transitioned(payload: ev.PropositionTransitioned) -> str:
    p = payload.proposition
    a = payload.from_state
    b = payload.to_state
    cause = payload.cause
    return f"proposition {p}: {a} -> {b} ({cause})"


@says(ev.ConsolidationRecorded)
def _consolidation_recorded(payload: ev.ConsolidationRecorded) -> str:
    promoted = payload.promoted
    archived = payload.archived
    gone = payload.discarded
    return (
        f"consolidation: {count(promoted, 'promoted')}, {count(archived, 'archived')},"
        f" {count(gone, 'discarded')}"
    )


@says(ev.EpisodeArchived)
def _episode_archived(payload: ev.EpisodeArchived) -> str:
    episode = payload.episode
    summary = payload.summary
    return f"episode {episode} archived: {summary!r}"


@says(ev.ApprovalVoted)
def _approval_voted(payload: ev.ApprovalVoted) -> str:
    vote = payload.vote
    operator = payload.operator
    reason = payload.reason
    w = payload.waiting
    met = payload.met
    stands = "quorum met" if met else w
    return f"{vote} vote by {operator}: {reason!r}" + (f" ({stands})" if stands else "")


@says(ev.ApprovalSuperseded)
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


@says(ev.GrantUsed)
def _grant_used(p: ev.GrantUsed) -> str:
    grant = p.grant
    uses = p.uses
    amount = p.amount
    currency = p.currency
    money = f", {format_money(amount, currency)}" if currency else ""
    instead = f" instead of {p.escalation}" if p.escalation else ""
    return f"proceeds under grant {grant} (use {uses}{money}){instead}"


@says(ev.ReasoningCharged)
def _reasoning_charged(payload: ev.ReasoningCharged) -> str:
    tokens = payload.tokens
    amount = payload.amount
    currency = payload.currency
    u = payload.unpriced
    used = ", ".join(f"{n} {model}" for model, n in sorted(tokens.items()))
    unknown = f"; no price for {', '.join(u)}" if u else ""
    return f"reasoning {format_money(amount, currency)} ({used} tokens){unknown}"


@says(ev.WebhookDelivered)
def _webhook_delivered(payload: ev.WebhookDelivered) -> str:
    hook = payload.hook
    notice = payload.notice
    status = payload.status
    attempts = payload.attempts
    return f"webhook {hook} took the {notice} (HTTP {status}, attempt {attempts})"


@says(ev.WebhookFailed)
def _webhook_failed(payload: ev.WebhookFailed) -> str:
    hook = payload.hook
    notice = payload.notice
    error = payload.error
    attempts = payload.attempts
    return f"webhook {hook} did not take the {notice} after {attempts} tries: {error}"


@says(ev.GrantIssued)
def _grant_issued(p: ev.GrantIssued) -> str:
    grant = p.grant
    kind = p.kind
    uses = p.uses
    operator = p.operator
    agent = p.agent
    cap = f", up to {format_money(p.cap, p.currency)}" if p.cap is not None else ""
    who = "any agent" if agent == "*" else agent
    return f"grant {grant} issued by {operator}: {kind} for {who}, {uses} uses{cap}"


@says(ev.GrantVoted)
def _grant_voted(payload: ev.GrantVoted) -> str:
    grant = payload.grant
    vote = payload.vote
    operator = payload.operator
    met = payload.met
    waiting = payload.waiting
    stands = "quorum met" if met else waiting
    return f"{vote} vote on grant {grant} by {operator}" + (f" ({stands})" if stands else "")


@says(ev.GrantRevoked)
def _grant_revoked(payload: ev.GrantRevoked) -> str:
    grant = payload.grant
    operator = payload.operator
    reason = payload.reason
    return f"grant {grant} revoked by {operator}: {reason!r}"


@says(ev.MeaningScored)
def _meaning_scored(payload: ev.MeaningScored) -> str:
    model = payload.model
    version = payload.version
    threshold = payload.threshold
    scores = payload.scores
    return (
        f"meaning scored by {model} {version}: {len(scores)} constraint"
        f"{'' if len(scores) == 1 else 's'} against threshold {threshold}"
    )


@says(ev.ArtifactStored)
def _artifact_stored(payload: ev.ArtifactStored) -> str:
    ref = payload.ref
    size = payload.size
    media = payload.media_type
    by = payload.by
    return f"artifact {ref[:16]} stored ({size} bytes, {media})" + (f" by {by}" if by else "")


@says(ev.ArtifactsCollected)
def _artifacts_collected(payload: ev.ArtifactsCollected) -> str:
    refs = payload.refs
    size = payload.size
    operator = payload.operator
    return f"{len(refs)} unreferenced artifact(s) collected ({size} bytes)" + (
        f" by {operator}" if operator else ""
    )


@says(ev.CheckpointKeyChanged)
def _checkpoint_key_changed(payload: ev.CheckpointKeyChanged) -> str:
    origin = payload.origin
    key = payload.key
    previous = payload.previous
    instead = f", replacing {previous}" if previous else ""
    return f"checkpoints of {origin} signed with key {key}{instead}"


@says(ev.SubjectErased)
def _subject_erased(payload: ev.SubjectErased) -> str:
    subject = payload.subject
    keys = payload.keys
    operator = payload.operator
    rule = payload.retention
    by = f" by {operator}" if operator else f" (retention {rule})" if rule else ""
    return f"data subject {subject} erased{by}: {keys} key(s) destroyed"
