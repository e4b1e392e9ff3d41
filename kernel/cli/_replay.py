"""``dirk state``, ``whatif`` and ``why``: time travel, counterfactuals and rule history.

All only read the journal. ``state`` prints the whole projected state after
any event; ``whatif`` prints the recorded verdicts another history would
change (see :mod:`kernel.audit.counterfactual`); ``why`` prints a rule's versions,
the promoter's and operators' decisions, and where each version comes from.
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from kernel.audit.counterfactual import whatif
from kernel.audit.reverify import PackPathError, Rejudged, load_packs, rejudge
from kernel.cli._beliefs import why_proposition
from kernel.cli._operator import error, error_of
from kernel.cli._read import json_text, print_json, say
from kernel.core.events import RuleProposed
from kernel.core.reasons import CliError, ExitCode
from kernel.journal.opening import open_journal
from kernel.memory import MEMORY_PACK
from kernel.policy.packs import PolicyPack
from kernel.state.rulebook import RuleDecision, RuleItem, RuleVersion, history
from kernel.state.snapshots import state_at, state_json


def add_commands(commands: Any) -> None:
    """Add the replay subcommands to ``dirk``'s subparsers."""
    state = commands.add_parser("state", help="print the whole projected state after an event")
    state.add_argument("--db", required=True, help="the journal file")
    state.add_argument("--at", type=int, metavar="SEQ", help="after event SEQ (default: the end)")
    state.add_argument(
        "--json", action="store_true", help="the state as one JSON object on one line"
    )
    state.set_defaults(run=_state)

    what = commands.add_parser("whatif", help="which recorded verdicts another history changes")
    what.add_argument("--db", required=True, help="the journal file")
    what.add_argument(
        "--exclude",
        metavar="SEQ,...",
        help="replay without these events (with --pack: e.g. a grant never issued)",
    )
    what.add_argument("--inject-constraint", metavar="TEXT", help="add this constraint ...")
    what.add_argument("--at", type=int, default=1, metavar="SEQ", help="... from event SEQ on")
    what.add_argument(
        "--priority",
        default="required",
        choices=["required", "learned", "preferred"],
        help="the injected constraint's priority (default required)",
    )
    what.add_argument(
        "--pack",
        action="append",
        metavar="PATH",
        help="judge again with this pack: FILE.py[:ATTR] or MODULE[:ATTR] (repeatable)",
    )
    what.add_argument(
        "--json", action="store_true", help="the verdicts judged and those changed as one object"
    )
    what.set_defaults(run=_whatif)

    why = commands.add_parser(
        "why", help="a rule's versions, decisions and provenance; a proposition's transitions"
    )
    why.add_argument(
        "rule", metavar="RULE_ID", help="the rule, as dirk rules lists it, or a proposition"
    )
    why.add_argument("--db", required=True, help="the journal file")
    why.add_argument(
        "--json", action="store_true", help="the rule's versions and decisions as one object"
    )
    why.set_defaults(run=_why)


async def _state(args: argparse.Namespace) -> int:
    async with open_journal(args.db, readonly=True) as journal:
        if args.at is not None and not 0 <= args.at <= journal.head_seq:
            return error(CliError.UNKNOWN_SEQ, f"{args.db} has events 1..{journal.head_seq}")
        projections = await state_at(journal, args.at)
    if args.json:
        print(json_text(msgspec.json.encode(state_json(projections)).decode()))
        return ExitCode.OK
    print(
        json_text(
            msgspec.json.format(msgspec.json.encode(state_json(projections)), indent=2).decode()
        )
    )
    return ExitCode.OK


def _excluded(args: argparse.Namespace) -> list[int] | int:
    """``--exclude``'s seqs (none when not given), or the usage error's code."""
    try:
        return [int(s) for s in args.exclude.split(",") if s.strip()] if args.exclude else []
    except ValueError:
        return error(
            CliError.BAD_ARGUMENT, f"--exclude takes seqs, not {args.exclude!r}", ExitCode.USAGE
        )


async def _whatif(args: argparse.Namespace) -> int:
    exclude = _excluded(args)
    if isinstance(exclude, int):
        return exclude
    if args.pack:
        if args.inject_constraint:
            return error(
                CliError.BAD_ARGUMENT,
                "--pack goes with --exclude, not with --inject-constraint",
                ExitCode.USAGE,
            )
        return await _whatif_pack(args.db, args.pack, args.json, exclude)
    if not exclude and not args.inject_constraint:
        return error(
            CliError.BAD_ARGUMENT, "give --exclude, --inject-constraint or --pack", ExitCode.USAGE
        )
    async with open_journal(args.db, readonly=True) as journal:
        result = await whatif(
            journal,
            exclude=exclude,
            constraint=args.inject_constraint,
            at=args.at,
            priority=args.priority,
        )
    if args.json:
        print_json({"judged": result.judged, "skipped": 0, "changes": result.changes})
        return ExitCode.OK
    for change in result.changes:
        say(change.line())
    say(f"whatif: {result.judged} recorded verdicts judged again, {len(result.changes)} change")
    return ExitCode.OK


async def _why(args: argparse.Namespace) -> int:
    async with open_journal(args.db, readonly=True) as journal:
        events = await journal.read(types=["RuleProposed", "RuleDecided", "RuleRetracted"])
    book = history(events)
    item = book.items.get(args.rule)
    if item is None:
        return await why_proposition(args)  # a proposition of the belief graph, if one is
    proposals = {e.seq: e.payload for e in events if isinstance(e.payload, RuleProposed)}
    if args.json:
        print_json(why_document(args.rule, item, proposals))
        return ExitCode.OK
    for line in why_lines(args.rule, item, proposals):
        say(line)
    return ExitCode.OK


def why_lines(rule: str, item: RuleItem, proposals: dict[int, RuleProposed]) -> list[str]:
    """Return ``dirk why``'s text: the current version, every version, every decision."""
    current = item.current
    lines = [
        f"rule {rule}: "
        + (f"current v{current.version} {current.title!r}" if current else "no version in force")
    ]
    lines.append("versions:")
    for v in item.versions:
        lines += _version_lines(v)
    lines.append("decisions:")
    for d in item.decisions:
        lines.append(_decision_line(d, proposals.get(d.proposal)))
    return lines


def _version_lines(v: RuleVersion) -> list[str]:
    source = v.source
    return [
        f"  v{v.version} {v.title!r} labels [{', '.join(v.labels)}]"
        f" (proposal #{v.proposal}, decision #{v.decided} by {v.actor})",
        f"     source repo {source.repo or '-'} ref {source.ref or '-'}"
        f" path {source.path or '-'} blob {source.blob or '-'}",
        f"     {v.content}",
    ]


def _decision_line(d: RuleDecision, proposal: RuleProposed | None) -> str:
    who = ""
    if proposal is not None:
        role = "operator" if proposal.by_operator else "agent"
        who = f" by {role} {proposal.proposer or '-'}"
    after = f" -> v{d.version}" if d.version else ""
    detail = f": {d.detail}" if d.detail else ""
    return (
        f"  #{d.seq} {d.decision.upper()} by {d.actor}, {d.reason}{detail}"
        f" (proposal #{d.proposal}{who}; prior v{d.prior_version}{after})"
    )


def why_document(rule: str, item: RuleItem, proposals: dict[int, RuleProposed]) -> Any:
    """``dirk why --json``: the current version, every version, every decision with its
    proposer."""
    decisions = []
    for d in item.decisions:
        proposal = proposals.get(d.proposal)
        decisions.append(
            msgspec.to_builtins(d)
            | {
                "proposer": proposal.proposer if proposal is not None else "",
                "by_operator": proposal.by_operator if proposal is not None else False,
            }
        )
    return {
        "rule": rule,
        "current": item.current,
        "versions": item.versions,
        "decisions": decisions,
    }


def packs_from(specs: list[str]) -> list[PolicyPack]:
    """Load the packs the ``--pack`` arguments name; the memory pack unless one is given.

    Raises:
        PackPathError: a path names no loadable pack.
    """
    packs = [pack for spec in specs for pack in load_packs(spec)]
    if not any(pack.name == MEMORY_PACK.name for pack in packs):
        packs.append(MEMORY_PACK)
    return packs


async def _whatif_pack(
    db: str, specs: list[str], as_json: bool = False, exclude: list[int] | None = None
) -> int:
    try:
        packs = packs_from(specs)
    except PackPathError as exc:
        return error_of(exc, ExitCode.USAGE)
    async with open_journal(db, readonly=True) as journal:
        result = await rejudge(journal, packs, check_hash=False, exclude=exclude or ())
    if as_json:
        print_json({"judged": result.judged, "skipped": result.skipped, "changes": result.changes})
        return ExitCode.OK
    for change in result.changes:
        say(change.line())
    say(
        f"whatif: {result.judged} recorded verdicts judged again, {len(result.changes)} change"
        f" ({result.skipped} of kinds no given pack defines)"
    )
    return ExitCode.OK


async def rejudge_verdicts(db: str, specs: list[str]) -> Rejudged:
    """Re-judge every recorded verdict with the packs ``specs`` name, checking pack hashes."""
    async with open_journal(db, readonly=True) as journal:
        return await rejudge(journal, packs_from(specs), check_hash=True)


def verdict_lines(result: Rejudged) -> tuple[bool, list[str]]:
    """``verify --verdicts``' text: (ok, a line per mismatch and per changed verdict, a total)."""
    lines = [f"verify: FAILED {line}" for line in result.mismatches]
    lines += [f"verify: FAILED verdict differs: {change.line()}" for change in result.changes]
    ok = not lines
    lines.append(
        f"verify: verdicts {'ok' if ok else 'FAILED'}: {result.judged} re-judged,"
        f" {len(result.changes)} differ, {result.skipped} not compared"
    )
    return ok, lines
