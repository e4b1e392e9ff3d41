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
    approval = _narrate_approval(event.payload)
    if approval is not None:
        return approval
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
        case payload:
            return msgspec.json.encode(payload).decode()[:200]


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
