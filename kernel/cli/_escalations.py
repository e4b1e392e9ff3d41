"""``dirk escalations`` and ``dirk review``: the flows waiting for a human, and one of them.

Both only read the journal; ``dirk decide`` (kernel.cli._operator) writes the decision.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from kernel.audit.units import judged_by
from kernel.cli._operator import (
    describe_action,
    error,
    fold_journal_now,
    manifest_of,
    quorum_text,
)
from kernel.cli._read import (
    FlowNotFound,
    age,
    iso_time,
    print_json,
    print_rows,
    resolve_flow,
    say,
    short_ids,
)
from kernel.core import events as ev
from kernel.core.events import Event
from kernel.core.flow import FlowState, FlowStatus
from kernel.core.reasons import CliError, ExitCode
from kernel.inbox.client import queued_dfids
from kernel.journal.opening import open_journal
from kernel.policy.kinds import Impact
from kernel.state.approvals import Approval, ApprovalStatus
from kernel.state.projections import Projections
from kernel.state.quorums import Ballot, Quorums


def add_commands(commands: Any) -> None:
    """Add ``escalations`` and ``review`` to the ``dirk`` parser's subcommands."""
    escalations = commands.add_parser("escalations", help="list flows waiting for a human")
    escalations.add_argument("--db", required=True, help="the journal file")
    escalations.add_argument(
        "--json", action="store_true", help="one JSON object per line, per waiting flow"
    )
    escalations.set_defaults(run=_escalations, pages=True)

    review = commands.add_parser("review", help="everything needed to decide on one escalation")
    review.add_argument(
        "dfid", metavar="FLOW", help="the flow: its DFID, a unique prefix (as tables show it)"
    )
    review.add_argument("--db", required=True, help="the journal file")
    review.add_argument(
        "--json", action="store_true", help="the flow, its approval, proposal and context as JSON"
    )
    review.set_defaults(run=_review, pages=True)


def _spaced(action: str) -> str:
    """``kind(a=1, b=2)`` as ``kind a=1, b=2``: a place to wrap after the kind."""
    kind, paren, rest = action.partition("(")
    return f"{kind} {rest.removesuffix(')')}" if paren else action


def _pending(projections: Projections) -> list[tuple[FlowState, Approval]]:
    rows = []
    for dfid, approval in projections.approvals.items():
        flow = projections.flows.get(dfid)
        if flow is not None and flow.status is FlowStatus.ESCALATED:
            if approval.status is ApprovalStatus.PENDING:
                rows.append((flow, approval))
    return sorted(rows, key=lambda row: row[1].escalated_ts)


async def _escalations(args: argparse.Namespace) -> int:
    projections, now = await fold_journal_now(args.db)
    queued = queued_dfids(args.db)
    rows = [
        {
            "dfid": flow.dfid,
            "impact": str(approval.impact),
            "reason_code": str(approval.reason_code),
            "detail": approval.detail,
            "age": age(now - approval.escalated_ts),
            "escalated": iso_time(approval.escalated_ts),
            "waited_s": max(0, now - approval.escalated_ts) // 1_000_000_000,
            "agent_id": flow.agent_id,
            "action": describe_action(flow),
            "hash": approval.short_hash,
            "queued": flow.dfid in queued,
            "quorum": quorum_text(projections.domain(Quorums).ballots.get(flow.dfid)),
        }
        for flow, approval in _pending(projections)
    ]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return ExitCode.OK
    short = short_ids((str(row["dfid"]) for row in rows), projections.flows)
    print_rows(
        ["=DFID", "=IMPACT", "=REASON", ">=AGE", "=AGENT", "=HASH", "ACTION"],
        (
            [
                short[str(row["dfid"])],
                str(row["impact"]),
                str(row["reason_code"]),
                str(row["age"]),
                str(row["agent_id"]),
                str(row["hash"] or "-"),
                # Spaces between the parameters: a narrow terminal wraps between them.
                f"{_spaced(str(row['action']))}{'  (decision queued)' if row['queued'] else ''}"
                + (f"  [{row['quorum']}]" if row["quorum"] else ""),
            ]
            for row in rows
        ),
    )
    say(f"{len(rows)} pending escalations")
    return ExitCode.OK


async def _review(args: argparse.Namespace) -> int:
    async with open_journal(args.db, readonly=True) as journal:
        try:
            args.dfid = await resolve_flow(journal, args.dfid)
        except FlowNotFound as exc:
            unknown = exc.code is CliError.UNKNOWN_FLOW
            return error(exc.code, f"{exc.message} in {args.db}" if unknown else exc.message)
        events = await journal.flow_events(args.dfid)
        started = await journal.read(types=["KernelStarted"])
        agents = await journal.read(types=["AgentRegistered"])
        tail = await journal.read(journal.head_seq, journal.head_seq + 1)
    if not events:
        return error(CliError.UNKNOWN_FLOW, f"no flow {args.dfid} in {args.db}")
    now = tail[-1].ts if tail else events[-1].ts
    projections = Projections()
    projections.apply(events)
    flow = projections.flows[args.dfid]
    approval = projections.approvals.get(args.dfid)
    if args.json:
        ballots = projections.domain(Quorums).ballots
        print_json(_review_document(flow, approval, events, agents, started, now, ballots))
        return ExitCode.OK
    say(f"DecisionFlow {flow.dfid}: {flow.status}, agent {flow.agent_id}, topic {flow.topic!r}")
    if approval is None:
        say("  never escalated")
        return ExitCode.OK
    ballot = projections.domain(Quorums).ballots.get(args.dfid)
    _say_why(approval, ballot, now)
    loaded = [
        p for e in started if isinstance(e.payload, ev.KernelStarted) for p in e.payload.packs
    ]
    _say_action(flow, approval, judged_by(events, loaded))
    _say_context(_context_seen(events, flow.proposal.context_ref if flow.proposal else ""))
    _say_limits(approval, manifest_of(agents, flow.agent_id), started)
    _say_next(flow, approval)
    return ExitCode.OK


def _say_why(approval: Approval, ballot: Ballot | None, now: int) -> None:
    say("", "Why it escalated", f"  {approval.reason_code}: {approval.detail}")
    waited = age(now - approval.escalated_ts)
    say(f"  impact {approval.impact}, approval {approval.status}, escalated {waited} ago")
    if approval.operator:
        say(f"  decided by {approval.operator}: {approval.reason!r}")
    quorum = quorum_text(ballot)
    if ballot is not None and quorum:
        rule = ballot.quorum
        roles = f" holding {', '.join(rule.roles)}" if rule.roles else ""
        say(f"  quorum: {rule.required} operators{roles}: {quorum}")
        for vote in ballot.votes:
            held = f" ({', '.join(vote.roles)})" if vote.roles else ""
            say(f"    {vote.vote} by {vote.operator}{held} at {iso_time(vote.ts)}")
        say(f"  may not vote: {', '.join(ballot.excluded)} (proposed or modified it)")


def _say_action(flow: FlowState, approval: Approval, pack: str) -> None:
    proposal = flow.proposal
    say("", "The proposed action")
    if proposal is None or not approval.action_hash:
        say("  none: the agent proposed nothing")
        return
    say(f"  {describe_action(flow)}")
    version = f" version {proposal.version}" if proposal.version else ""
    say(f"  kind {proposal.kind}{version}" + (f" of pack {pack}" if pack else ""))
    say(f"  params {json.dumps(proposal.params, sort_keys=True)}")
    say(f"  confidence {proposal.confidence:g}")
    say(f"  action hash {approval.short_hash} (full {approval.action_hash})")
    say("", "The agent's explanation", f"  {proposal.explain or '(none given)'}")


def _say_context(context: ev.ContextCompiled | None) -> None:
    say("", "The working context the agent saw")
    if context is None:
        say("  (not recorded)")
        return
    say(f"  attempt {context.attempt}, context {context.context_ref[:12]}")
    for key, value in context.state.items():
        say(f"  {key} = {json.dumps(value)}")
    if context.feedback is not None:
        say(f"  feedback {context.feedback.reason_code}: {context.feedback.detail}")


def _say_limits(approval: Approval, manifest: ev.Manifest | None, started: list[Event]) -> None:
    say("", "The limits involved")
    say(f"  {approval.detail}")
    if manifest is not None:
        limits = json.dumps(manifest.limits, sort_keys=True) if manifest.limits else "none"
        say(f"  agent {manifest.agent_id}: capabilities {', '.join(manifest.capabilities)};")
        say(f"    max attempts {manifest.max_attempts}; declared limits {limits}")
    if started:
        boot = started[-1].payload
        assert isinstance(boot, ev.KernelStarted)
        for pack in boot.packs:
            say(f"  pack {pack.name} {pack.version} ({pack.hash[:12]})")


def _say_next(flow: FlowState, approval: Approval) -> None:
    """What the operator may type next, if the flow waits for them."""
    if flow.status is FlowStatus.ESCALATED and flow.pending is not None:
        say("", f"The effect may have happened: look up key {flow.pending.key} in the system")
        say(
            "",
            f"To decide: dirk decide {flow.dfid} --reconcile done:EXTERNAL_ID"
            " | --reconcile not-done | --retry --operator NAME --reason TEXT",
        )
    elif approval.status is ApprovalStatus.PENDING and flow.status is FlowStatus.ESCALATED:
        confirm = (
            f" --confirm {approval.short_hash}" if approval.impact is Impact.HIGH_IMPACT else ""
        )
        say(
            "",
            f"To decide: dirk decide {flow.dfid} --approve{confirm} | --reject | --modify JSON"
            " --operator NAME --reason TEXT",
        )


def _review_document(
    flow: FlowState,
    approval: Approval | None,
    events: list[Event],
    agents: list[Event],
    started: list[Event],
    now: int,
    ballots: dict[str, Ballot] | None = None,
) -> dict[str, Any]:
    """``dirk review --json``: what the text shows, as one object with fixed keys."""
    ballots = ballots or {}
    proposal = flow.proposal
    context = _context_seen(events, proposal.context_ref if proposal else "")
    boot = started[-1].payload if started else None
    packs = boot.packs if isinstance(boot, ev.KernelStarted) else []
    document: dict[str, Any] = {
        "dfid": flow.dfid,
        "status": str(flow.status),
        "agent_id": flow.agent_id,
        "topic": flow.topic,
        "approval": None,
        "proposal": _proposal_document(proposal),
        "context": None,
        "agent": _agent_document(manifest_of(agents, flow.agent_id)),
        "packs": [{"name": p.name, "version": p.version, "hash": p.hash} for p in packs],
        "pending_key": flow.pending.key if flow.pending is not None else None,
    }
    if approval is not None:
        document["approval"] = _approval_document(approval, ballots.get(flow.dfid), now)
    if context is not None:
        document["context"] = _context_document(context)
    return document


def _proposal_document(proposal: ev.ProposalRecord | None) -> dict[str, Any] | None:
    if proposal is None:
        return None
    return {
        "kind": proposal.kind,
        "version": proposal.version,
        "params": proposal.params,
        "confidence": proposal.confidence,
        "explain": proposal.explain,
    }


def _agent_document(manifest: ev.Manifest | None) -> dict[str, Any] | None:
    if manifest is None:
        return None
    return {
        "agent_id": manifest.agent_id,
        "capabilities": list(manifest.capabilities),
        "max_attempts": manifest.max_attempts,
        "limits": manifest.limits,
    }


def _approval_document(approval: Approval, ballot: Ballot | None, now: int) -> dict[str, Any]:
    """The review's approval: what waits, since when, and the quorum's votes if it takes votes."""
    document: dict[str, Any] = {
        "status": str(approval.status),
        "impact": str(approval.impact),
        "reason_code": str(approval.reason_code),
        "detail": approval.detail,
        "escalated": iso_time(approval.escalated_ts),
        "waited_s": max(0, now - approval.escalated_ts) // 1_000_000_000,
        "action_hash": approval.action_hash,
        "short_hash": approval.short_hash,
        "operator": approval.operator,
        "reason": approval.reason,
        "quorum": None,
    }
    if ballot is not None and quorum_text(ballot):
        document["quorum"] = {
            "required": ballot.quorum.required,
            "roles": ballot.quorum.roles,
            "waiting": quorum_text(ballot),
            "counted": ballot.counted,
            "excluded": ballot.excluded,
            "votes": [
                {"operator": v.operator, "vote": v.vote, "roles": v.roles, "at": iso_time(v.ts)}
                for v in ballot.votes
            ],
        }
    return document


def _context_document(context: ev.ContextCompiled) -> dict[str, Any]:
    feedback = context.feedback
    return {
        "attempt": context.attempt,
        "context_ref": context.context_ref,
        "state": context.state,
        "feedback": None
        if feedback is None
        else {"reason_code": str(feedback.reason_code), "detail": feedback.detail},
    }


def _context_seen(events: list[Event], ref: str) -> ev.ContextCompiled | None:
    """The context the proposal reasoned on (the latest, if none matches its reference)."""
    contexts = [e.payload for e in events if isinstance(e.payload, ev.ContextCompiled)]
    for context in reversed(contexts):
        if context.context_ref == ref:
            return context
    return contexts[-1] if contexts else None
