"""A flow's narrative in plain words: what ``dirk show`` prints and the console shows.

One line per event, the same words everywhere a person reads a flow.
"""

from __future__ import annotations

import json

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


def narrate(event: Event) -> str:
    """Return what one event of a flow says, in one line (two for a proposal's explanation)."""
    line = _narrate_approval(event.payload)
    if line is None:
        line = _narrate_grant(event.payload)
    if line is None:
        line = _narrate_record(event.payload)
    if line is not None:
        return line
    match event.payload:
        case ev.FlowCreated(topic=topic):
            return f"trigger {topic!r}" + (
                f" (caused by #{event.caused_by})" if event.caused_by else ""
            )
        case ev.ContextCompiled(attempt=attempt, context_ref=ref, state=state, feedback=feedback):
            seen = ", ".join(f"{k}={v}" for k, v in list(state.items())[:6])
            more = f" (+{len(state) - 6} more)" if len(state) > 6 else ""
            after = f"; feedback {feedback.reason_code}" if feedback else ""
            return f"attempt {attempt}, context {ref[:12]}: {seen}{more}{after}"
        case ev.ProposalSubmitted(attempt=attempt, proposal=p, by_human=by_human):
            who = "human modification" if by_human else f"attempt {attempt}"
            params = json.dumps(p.params, sort_keys=True)
            explain = f"\n{'':40}explain: {p.explain!r}"
            return f"{who}: {p.kind} {params} confidence {p.confidence:g}{explain}"
        case ev.ProposalRejected(feedback=f):
            where = f" at {f.field}" if f.field else ""
            return f"REJECTED {f.reason_code} ({f.layer}{where}): {f.detail}"
        case ev.ProposalAccepted(by_human=by_human):
            return "ACCEPTED" + (" by a human" if by_human else " by the DIM")
        case ev.FlowEscalated(reason_code=code, detail=detail, impact=impact, action_hash=h):
            action = f", action {h[:10]}" if h else ", nothing to approve"
            return f"ESCALATED {code} ({impact}{action}): {detail}"
        case ev.ApprovalExpired(detail=detail):
            return f"approval EXPIRED: {detail}"
        case ev.DecisionRefused(reason_code=code, decision=decision, operator=operator, detail=d):
            return f"{decision} by {operator} refused {code}: {d}"
        case ev.HumanDecided(decision=decision, operator=operator, reason=reason, params=params):
            changed = f" params {json.dumps(params, sort_keys=True)}" if params else ""
            return f"{decision} by {operator}: {reason!r}{changed}"
        case ev.ExecutionStarted(intent=intent):
            return f"intent {intent.kind} via {intent.adapter}, key {intent.key}"
        case ev.ExecutionSucceeded(key=key, external_id=external_id):
            return f"effect recorded: external id {external_id} (key {key})"
        case ev.ExecutionFailed(error=error, transient=transient):
            return f"{'transient' if transient else 'terminal'} failure: {error}"
        case ev.DuplicateSuppressed(source=source):
            return f"duplicate {source} answered from the record; no second effect"
        case ev.FlowClosed():
            return "CLOSED"
        case ev.FlowAborted(reason_code=code, detail=detail):
            return f"ABORTED {code}: {detail}"
        case ev.SubmissionRefused(reason_code=code, detail=detail):
            return f"submission refused {code}: {detail}"
        case ev.FlowFlagged(guard=guard, reason=reason, confidence=confidence):
            sure = f" (confidence {confidence})" if confidence else ""
            return f"NEEDS_REVIEW by guard {guard}{sure}: {reason}"
        case ev.CitationsChecked(correct=correct, incorrect=incorrect):
            wrong = "; ".join(f"{ref} {why}" for ref, why in incorrect.items())
            return f"citations: correct [{', '.join(correct)}]" + (
                f", INCORRECT {wrong}" if wrong else ""
            )
        case ev.ConstraintAdvisory(detail=detail):
            return f"ADVISORY (not refused) {detail}"
        case ev.RuleProposed(rule=rule, title=title, proposer=proposer):
            return f"rule {rule} proposed by {proposer}: {title!r}"
        case ev.RuleDecided(rule=rule, decision=d, actor=actor, reason=reason, version=v):
            return f"rule {rule}: {d} by {actor} ({reason})" + (f" -> v{v}" if v else "")
        case _:
            return _more(event)


def _more(event: Event) -> str:
    """The kernel's own, memory's and beliefs' events, in words (flows' are above)."""
    match event.payload:
        case ev.KernelStarted(kernel_version=version, packs=packs, head_seq=head):
            names = ", ".join(f"{p.name} {p.version}" for p in packs) or "no packs"
            return f"kernel {version} started at #{head} with {names}"
        case ev.KernelStopped(reason=reason, detail=detail, head_seq=head):
            return f"kernel stopped ({reason}) at #{head}" + (f": {detail}" if detail else "")
        case ev.ActorRestarted(actor=actor, error=error, restarts=restarts):
            return f"actor {actor} restarted (restart {restarts}) after: {error}"
        case ev.MessageDeadLettered(actor=actor, message=message, error=error):
            return f"a {message} message crashed {actor} twice and was set aside: {error}"
        case ev.AgentRegistered(manifest=manifest):
            return f"agent {manifest.agent_id} {manifest.version} registered"
        case ev.AgentRefused(reason_code=code, detail=detail, version=version):
            return (
                f"agent refused {code}"
                + (f" (version {version})" if version else "")
                + (f": {detail}" if detail else "")
            )
        case ev.AgentStatusChanged(status=status, operator=operator, reason=reason):
            return f"agent status set to {status} by {operator or 'the kernel'}: {reason!r}"
        case ev.TriggerFired(topic=topic, facts=facts, source=source):
            origin = source or "the application"
            return f"trigger {topic!r} from {origin} with {_count(facts, 'fact')}"
        case ev.ExecutionRetried(key=key, attempt=attempt, error=error, delay_ns=delay):
            return f"call {attempt} failed ({error}); trying again in {delay / 1e9:g} s (key {key})"
        case ev.ExecutionRefused(reason_code=code, bound=bound, detail=detail):
            return f"not executed {code}: {detail}" + (f" (bound {bound})" if bound else "")
        case ev.FlowDirty(step=step, reason_code=code, detail=detail):
            return f"DIRTY at step {step} {code}: {detail}; what was done is to be undone"
        case ev.CompensationStarted(intent=intent):
            what = f"{intent.kind} via {intent.adapter}"
            return f"undoing step {intent.step}: {what}, key {intent.key}"
        case ev.CompensationSucceeded(step=step, external_id=external_id):
            return f"step {step} undone: external id {external_id or '-'}"
        case ev.CompensationFailed(step=step, error=error, transient=transient):
            how = "transient" if transient else "terminal"
            return f"undoing step {step} failed ({how}): {error}"
        case ev.FlowCompensated(steps=steps):
            return f"COMPENSATED: {_count_of(steps, 'step')} undone"
        case ev.ResourceReserved(pool=pool, amount=amount):
            return f"reserved {amount} of {pool}"
        case ev.ResourceReleased(pool=pool, amount=amount, reason=reason):
            return f"released {amount} of {pool}" + (f" ({reason})" if reason else "")
        case ev.ProjectionCheckpoint(seq=seq, digest=digest):
            return f"checkpoint of the state up to #{seq} (digest {digest[:12]})"
        case ev.FactAdded(name=name, value=value, confidence=confidence):
            sure = f" (confidence {confidence})" if confidence else ""
            return f"fact {name} = {value!r}{sure}"
        case ev.ConstraintAdded(text=text, priority=priority, triggered_by=cause):
            why = f", triggered by #{cause}" if cause else ""
            return f"constraint ({priority}{why}): {text!r}"
        case ev.ConstraintDeactivated(constraint=constraint, reason=reason):
            return f"constraint #{constraint} deactivated: {reason!r}"
        case ev.DecisionMade(text=text, rationale=rationale):
            return f"decision recorded: {text!r}" + (f" because {rationale!r}" if rationale else "")
        case ev.MemoryQueried(topic=topic, facts=facts, constraints=constraints):
            found = f"{_count(facts, 'fact')}, {_count(constraints, 'constraint')}"
            return f"memory queried on {topic!r}: {found}"
        case ev.PackLoaded(pack=pack, previous=previous, operator=operator, reason=reason):
            was = f" (was {previous})" if previous else ""
            return f"pack {pack.name} {pack.version} loaded{was} by {operator}: {reason!r}"
        case ev.LimitAmended(limit=limit, value=value, operator=operator, reason=reason):
            return f"limit {limit} amended to {value} by {operator}: {reason!r}"
        case ev.AmendmentRefused(reason_code=code, limit=limit, operator=operator, detail=d):
            return f"amendment of {limit} by {operator} refused {code}: {d}"
        case ev.InputRefused(reason_code=code, entry=entry, field=field, detail=detail):
            where = f" at {field}" if field else ""
            return f"input refused at the {entry} {code}{where}: {detail}"
        case ev.RuleRetracted(rule=rule, operator=operator, reason=reason, version=version):
            return f"rule {rule} v{version} retracted by {operator}: {reason!r}"
        case ev.CredentialIssued(operator=operator, reason=reason):
            return f"credential issued by {operator}: {reason!r}"
        case ev.OperatorKeyTrusted(name=name, role=role, fingerprint=fingerprint):
            return f"key {fingerprint} of {name} ({role}) trusted"
        case ev.OperatorKeyRevoked(name=name, fingerprint=fingerprint, detail=detail):
            return f"key {fingerprint} of {name} revoked" + (f": {detail}" if detail else "")
        case ev.RequestVerified(inbox_id=row, request=request, principal=who, signer=signer):
            by = f", signed by {signer}" if signer and signer != who else ""
            return f"inbox row {row}: {request} by {who}{by}, signature verified"
        case ev.SourceRegistered(source=source, source_type=kind, reliability=reliability):
            return f"source {source} ({kind}) registered, reliability {reliability}"
        case ev.ObservationRecorded(observation=observation, source=source, ingest_status=status):
            return f"observation {observation} from {source}: {status}"
        case ev.EntityCandidateRecorded(entity=entity, name=name, entity_type=kind):
            return f"entity {entity} {name!r} ({kind}) recorded"
        case ev.PropositionProposed(proposition=proposition, text=text):
            return f"proposition {proposition} proposed: {text!r}"
        case ev.EvidenceAttached(proposition=proposition, stance=stance, source=source):
            return f"evidence {stance} proposition {proposition} from {source}"
        case ev.TestResultIngested(test=test, proposition=proposition, outcome=result):
            return f"test {test} of proposition {proposition}: {result}"
        case ev.PropositionTransitioned(proposition=p, from_state=a, to_state=b, cause=cause):
            return f"proposition {p}: {a} -> {b} ({cause})"
        case ev.ConsolidationRecorded(promoted=promoted, archived=archived, discarded=gone):
            return (
                f"consolidation: {_count(promoted, 'promoted')}, {_count(archived, 'archived')},"
                f" {_count(gone, 'discarded')}"
            )
        case ev.EpisodeArchived(episode=episode, summary=summary):
            return f"episode {episode} archived: {summary!r}"
        case payload:
            # An event type this module does not know yet (a domain's): its fields, in words.
            fields = msgspec.structs.asdict(payload) if isinstance(payload, msgspec.Struct) else {}
            shown = ", ".join(f"{k}={v!r}" for k, v in list(fields.items())[:6])
            return f"{event.type}: {shown}"[:300]


def _narrate_approval(payload: object) -> str | None:
    """Return the line for a vote, a re-judged approval, a grant's use or a price; else None."""
    match payload:
        case ev.ApprovalVoted(vote=vote, operator=operator, reason=reason, waiting=w, met=met):
            stands = "quorum met" if met else w
            return f"{vote} vote by {operator}: {reason!r}" + (f" ({stands})" if stands else "")
        case ev.ApprovalSuperseded(approved=approved, current=current, outcome=outcome) as p:
            then = f"{approved.name} {approved.version}" if approved else "an earlier pack"
            now = f"{current.name} {current.version}" if current else "no pack"
            return (
                f"{p.via} judged again before executing: approved under {then}, {outcome}"
                f" under {now}: {p.reason_code} ({p.layer}): {p.detail}"
            )
        case ev.GrantUsed(grant=grant, uses=uses, amount=amount, currency=currency) as p:
            money = f", {format_money(amount, currency)}" if currency else ""
            instead = f" instead of {p.escalation}" if p.escalation else ""
            return f"proceeds under grant {grant} (use {uses}{money}){instead}"
        case ev.ReasoningCharged(tokens=tokens, amount=amount, currency=currency, unpriced=u):
            used = ", ".join(f"{n} {model}" for model, n in sorted(tokens.items()))
            unknown = f"; no price for {', '.join(u)}" if u else ""
            return f"reasoning {format_money(amount, currency)} ({used} tokens){unknown}"
        case ev.ResourceReserved(pool=pool, amount=amount) if pool.startswith(POOL_PREFIX):
            return f"holds {format_money(amount, pool.split(':')[1])} of {pool}"
        case ev.ResourceReleased(pool=pool, amount=amount, reason=why) if pool.startswith(
            POOL_PREFIX
        ):
            money = format_money(amount, pool.split(":")[1])
            # A closed flow spends what it held of a money pool; any other end gives it back.
            if why == "CLOSED":
                return f"spends {money} of {pool}"
            return f"gives back {money} of {pool} ({why})"
        case ev.WebhookDelivered(hook=hook, notice=notice, status=status, attempts=attempts):
            return f"webhook {hook} took the {notice} (HTTP {status}, attempt {attempts})"
        case ev.WebhookFailed(hook=hook, notice=notice, error=error, attempts=attempts):
            return f"webhook {hook} did not take the {notice} after {attempts} tries: {error}"
        case _:
            return None


def _count(items: object, word: str) -> str:
    return _count_of(len(items) if hasattr(items, "__len__") else 0, word)


def _count_of(n: int, word: str) -> str:
    if word in ("promoted", "archived", "discarded"):
        return f"{n} {word}"
    return f"{n} {word}{'' if n == 1 else 's'}"


def _narrate_grant(payload: object) -> str | None:
    """Return the line for a standing grant's issue, vote or revocation; else None."""
    match payload:
        case ev.GrantIssued(grant=grant, kind=kind, uses=uses, operator=operator, agent=agent) as p:
            cap = f", up to {format_money(p.cap, p.currency)}" if p.cap is not None else ""
            who = "any agent" if agent == "*" else agent
            return f"grant {grant} issued by {operator}: {kind} for {who}, {uses} uses{cap}"
        case ev.GrantVoted(grant=grant, vote=vote, operator=operator, met=met, waiting=waiting):
            stands = "quorum met" if met else waiting
            return f"{vote} vote on grant {grant} by {operator}" + (
                f" ({stands})" if stands else ""
            )
        case ev.GrantRevoked(grant=grant, operator=operator, reason=reason):
            return f"grant {grant} revoked by {operator}: {reason!r}"
        case _:
            return None


def _narrate_record(payload: object) -> str | None:
    """Return the line for meaning scores, artifacts, checkpoint keys or erasure; else None."""
    match payload:
        case ev.MeaningScored(model=model, version=version, threshold=threshold, scores=scores):
            return (
                f"meaning scored by {model} {version}: {len(scores)} constraint"
                f"{'' if len(scores) == 1 else 's'} against threshold {threshold}"
            )
        case ev.ArtifactStored(ref=ref, size=size, media_type=media, by=by):
            return f"artifact {ref[:16]} stored ({size} bytes, {media})" + (
                f" by {by}" if by else ""
            )
        case ev.ArtifactsCollected(refs=refs, size=size, operator=operator):
            return f"{len(refs)} unreferenced artifact(s) collected ({size} bytes)" + (
                f" by {operator}" if operator else ""
            )
        case ev.CheckpointKeyChanged(origin=origin, key=key, previous=previous):
            instead = f", replacing {previous}" if previous else ""
            return f"checkpoints of {origin} signed with key {key}{instead}"
        case ev.SubjectErased(subject=subject, keys=keys, operator=operator, retention=rule):
            by = f" by {operator}" if operator else f" (retention {rule})" if rule else ""
            return f"data subject {subject} erased{by}: {keys} key(s) destroyed"
        case _:
            return None
