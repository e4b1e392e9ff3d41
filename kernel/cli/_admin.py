"""``dirk agent`` and ``dirk rules``: an operator's hand on agents and on the rulebook.

Both read the journal to show what is, and change it only through the operator
inbox (see kernel.inbox): a request signed with the operator's key, checked here
as the kernel will check it (kernel.inbox.prepare); the running kernel applies
each once and records who did it and why (AgentStatusChanged, RuleDecided, each
naming the row).
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from kernel.cli._agents import add_commands as add_agents_commands
from kernel.cli._credential import issue_credential
from kernel.cli._init import add_commands as add_init_commands
from kernel.cli._operator import (
    add_key_argument,
    error,
    fold_journal,
    post_request,
    refused,
    wait_seconds,
)
from kernel.cli._read import print_json, say
from kernel.core.events import RuleProposed
from kernel.core.reasons import CliError, ExitCode, ReasonCode
from kernel.inbox import RequestRefused
from kernel.inbox.prepare import rule_change, rule_decision, status_change
from kernel.state.drift import Drift
from kernel.state.projections import AgentStatus, Projections
from kernel.state.rulebook import Rulebook, RuleItem

_WAIT_HELP = "wait this long for the kernel to apply it and report the outcome"


def add_commands(commands: Any) -> None:
    """Add ``agent``, ``agents``, ``init`` and ``rules`` to the ``dirk`` parser's subcommands."""
    add_agents_commands(commands)
    add_init_commands(commands)
    agent = commands.add_parser("agent", help="show an agent, or set its status (via the inbox)")
    agent.add_argument("agent_id", metavar="AGENT_ID", help="the agent")
    agent.add_argument(
        "--set",
        choices=[s.value for s in AgentStatus],
        help="the new status (ACTIVE restores an agent demoted to PASSIVE)",
    )
    agent.add_argument(
        "--issue-credential",
        action="store_true",
        help="provision (or rotate) the agent's credential: printed once, only its hash is queued",
    )
    agent.add_argument("--operator", help="who changes it (recorded; required with --set)")
    agent.add_argument("--reason", help="why (recorded; required with --set)")
    agent.add_argument("--wait", type=wait_seconds, default=0.0, metavar="SECONDS", help=_WAIT_HELP)
    add_key_argument(agent)
    agent.add_argument("--db", required=True, help="the journal file")
    agent.add_argument(
        "--json", action="store_true", help="the agent as one JSON object (not with --set)"
    )
    agent.set_defaults(run=_agent)

    rules = commands.add_parser(
        "rules", help="list rules and deferred proposals, or decide one (via the inbox)"
    )
    choice = rules.add_mutually_exclusive_group()
    choice.add_argument("--override", type=int, metavar="SEQ", help="put proposal SEQ in force")
    choice.add_argument("--skip", type=int, metavar="SEQ", help="drop proposal SEQ")
    choice.add_argument("--add", metavar="RULE", help="put new rule RULE in force")
    choice.add_argument("--edit", metavar="RULE", help="put a new version of RULE in force")
    choice.add_argument(
        "--retract", metavar="RULE", help="take RULE out of force (its history stays)"
    )
    rules.add_argument("--title", help="with --add/--edit: the rule's title")
    rules.add_argument("--content", help="with --add/--edit: the rule's text")
    rules.add_argument(
        "--label", action="append", default=[], help="with --add/--edit: a label (repeatable)"
    )
    rules.add_argument("--operator", help="who decides (recorded; required to decide)")
    rules.add_argument("--reason", help="why (recorded; required to decide)")
    rules.add_argument("--wait", type=wait_seconds, default=0.0, metavar="SECONDS", help=_WAIT_HELP)
    add_key_argument(rules)
    rules.add_argument("--db", required=True, help="the journal file")
    rules.add_argument("--ns", default="default", help="the rulebook namespace (default: default)")
    rules.add_argument(
        "--json",
        action="store_true",
        help="the rules and deferred proposals as one JSON object (not with a decision)",
    )
    rules.set_defaults(run=_rules)


def _who_and_why(args: argparse.Namespace) -> str | None:
    if not args.operator or not args.reason:
        return "a change names the --operator and a --reason"
    return None


def _breaches(projections: Projections, agent_id: str) -> dict[str, dict[str, Any]]:
    """The agent's last breach of each drift monitor (kernel.state.drift), by monitor."""
    found = projections.domain(Drift).breaches.get(agent_id, {})
    return {name: msgspec.to_builtins(b) for name, b in sorted(found.items())}


async def _agent(args: argparse.Namespace) -> int:
    if args.issue_credential:
        return await issue_credential(args)
    projections = await fold_journal(args.db)
    agent = projections.agents.get(args.agent_id)
    if agent is None:
        return error(
            ReasonCode.UNKNOWN_AGENT, f"no agent {args.agent_id!r} ever registered in {args.db}"
        )
    if args.set is None:
        manifest = agent.manifest
        if args.json:
            print_json(
                {
                    "agent_id": manifest.agent_id,
                    "version": manifest.version,
                    "status": str(agent.status),
                    "capabilities": list(manifest.capabilities),
                    "subscriptions": list(manifest.subscriptions),
                    "max_attempts": manifest.max_attempts,
                    "limits": manifest.limits,
                    "drift": _breaches(projections, manifest.agent_id),
                }
            )
            return ExitCode.OK
        say(f"{manifest.agent_id} {manifest.version}: {agent.status}")
        say(f"  capabilities  {', '.join(manifest.capabilities)}")
        say(f"  subscriptions {', '.join(manifest.subscriptions)}")
        for name, b in _breaches(projections, manifest.agent_id).items():
            crossed = f"{b['metric']} {b['value']:g} crossed {b['bound']:g}"
            say(f"  drift {name}: {crossed} (seq {b['seq']}, {b['action']})")
        return ExitCode.OK
    if args.json:
        return error(CliError.BAD_ARGUMENT, "--json reads; --set changes", ExitCode.USAGE)
    missing = _who_and_why(args)
    if missing is not None:
        return error(ReasonCode.SCHEMA_INVALID, missing, ExitCode.USAGE)
    try:
        request = status_change(
            projections.agents, args.agent_id, args.set, operator=args.operator, reason=args.reason
        )
    except RequestRefused as exc:
        return refused(exc)
    return await post_request(args, request, f"status {args.set} for {args.agent_id}")


async def _rules(args: argparse.Namespace) -> int:
    projections = await fold_journal(args.db)
    book = projections.memory.rulebook
    ns = args.ns
    space = book.space(ns)
    pending = sorted((s, p) for s, p in book.pending.items() if p.ns == ns)
    change = args.add or args.edit or args.retract
    if change is not None:
        return await _change_rule(args, book, change)
    seq = args.override if args.override is not None else args.skip
    if seq is None:
        _list_rules(space, pending, ns, as_json=args.json)
        return ExitCode.OK
    return await _decide_rule(args, book, seq)


async def _decide_rule(args: argparse.Namespace, book: Rulebook, seq: int) -> int:
    """Queue an override or skip of the deferred rule proposal ``seq``."""
    if args.json:
        return error(CliError.BAD_ARGUMENT, "--json reads; a decision changes", ExitCode.USAGE)
    missing = _who_and_why(args)
    if missing is not None:
        return error(ReasonCode.SCHEMA_INVALID, missing, ExitCode.USAGE)
    decision = "override" if args.override is not None else "skip"
    try:
        request = rule_decision(book, seq, decision, operator=args.operator, reason=args.reason)
    except RequestRefused as exc:
        if exc.code is CliError.RULE_NOT_PENDING:
            return error(exc.code, f"{exc.message} in {args.db}")
        return refused(exc)
    return await post_request(args, request, f"{decision} of rule proposal #{seq}")


def _list_rules(
    space: dict[str, RuleItem], pending: list[tuple[int, RuleProposed]], ns: str, *, as_json: bool
) -> None:
    """Print the rules of ``ns`` and its deferred proposals, as text or one JSON object."""
    if as_json:
        _print_rules_json(space, pending, ns)
        return
    for rule, item in sorted(space.items()):
        current = item.current
        shown = f"v{current.version} {current.title!r}" if current else "no version in force"
        say(f"{rule}: {shown} ({len(item.decisions)} decisions; dirk why {rule})")
    for pending_seq, proposal in pending:
        say(
            f"deferred #{pending_seq}: {proposal.rule} {proposal.title!r}"
            f" by {proposal.proposer or '?'} (--override {pending_seq} | --skip {pending_seq})"
        )
    if not space and not pending:
        say("no rules" if ns == "default" else f"no rules in namespace {ns}")


def _print_rules_json(
    space: dict[str, RuleItem], pending: list[tuple[int, RuleProposed]], ns: str
) -> None:
    print_json(
        {
            "rules": [
                {
                    "rule": rule,
                    "current": item.current,
                    "versions": len(item.versions),
                    "decisions": len(item.decisions),
                }
                for rule, item in sorted(space.items())
            ],
            "ns": ns,
            "deferred": [
                {
                    "seq": pending_seq,
                    "rule": proposal.rule,
                    "title": proposal.title,
                    "proposer": proposal.proposer,
                }
                for pending_seq, proposal in pending
            ],
        }
    )


async def _change_rule(args: argparse.Namespace, book: Rulebook, rule: str) -> int:
    """Queue an add, edit or retract of ``rule`` (an operator's act, applied by the kernel)."""
    action = "retract" if args.retract else "add" if args.add else "edit"
    missing = _who_and_why(args)
    if missing is not None:
        return error(ReasonCode.SCHEMA_INVALID, missing, ExitCode.USAGE)
    try:
        request = rule_change(
            book,
            rule,
            action,
            operator=args.operator,
            reason=args.reason,
            title=args.title or "",
            content=args.content or "",
            labels=args.label,
            ns=args.ns,
        )
    except RequestRefused as exc:
        if exc.code is CliError.UNKNOWN_RULE:
            return error(exc.code, f"{exc.message} in {args.db}")
        return refused(exc)
    return await post_request(args, request, f"{action} of rule {rule}")
