"""``dirk state`` and ``dirk whatif``: time travel and counterfactuals from the command line.

Both only read the journal. ``state`` prints the whole projected state after
any event; ``whatif`` prints the recorded verdicts another history would
change (see :mod:`kernel.counterfactual`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import msgspec

from kernel.counterfactual import whatif
from kernel.journal import open_journal
from kernel.replay import ProjectionReport, state_at, state_json, verify_projections


def add_commands(commands: Any) -> None:
    """Add the replay subcommands to ``dirk``'s subparsers."""
    state = commands.add_parser("state", help="print the whole projected state after an event")
    state.add_argument("--db", required=True, help="the journal file")
    state.add_argument("--at", type=int, metavar="SEQ", help="after event SEQ (default: the end)")
    state.set_defaults(run=_state)

    what = commands.add_parser("whatif", help="which recorded verdicts another history changes")
    what.add_argument("--db", required=True, help="the journal file")
    what.add_argument("--exclude", metavar="SEQ,...", help="replay without these events")
    what.add_argument("--inject-constraint", metavar="TEXT", help="add this constraint ...")
    what.add_argument("--at", type=int, default=1, metavar="SEQ", help="... from event SEQ on")
    what.add_argument(
        "--priority", default="required", choices=["required", "learned", "preferred"]
    )
    what.set_defaults(run=_whatif)


async def _state(args: argparse.Namespace) -> int:
    async with open_journal(args.db, readonly=True) as journal:
        if args.at is not None and not 0 <= args.at <= journal.head_seq:
            print(
                f"error: UNKNOWN_SEQ: {args.db} has events 1..{journal.head_seq}", file=sys.stderr
            )
            return 1
        projections = await state_at(journal, args.at)
    print(msgspec.json.format(msgspec.json.encode(state_json(projections)), indent=2).decode())
    return 0


async def _whatif(args: argparse.Namespace) -> int:
    try:
        exclude = [int(s) for s in args.exclude.split(",") if s.strip()] if args.exclude else []
    except ValueError:
        print(f"error: BAD_ARGUMENT: --exclude takes seqs, not {args.exclude!r}", file=sys.stderr)
        return 2
    if not exclude and not args.inject_constraint:
        print("error: BAD_ARGUMENT: give --exclude or --inject-constraint", file=sys.stderr)
        return 2
    async with open_journal(args.db, readonly=True) as journal:
        result = await whatif(
            journal,
            exclude=exclude,
            constraint=args.inject_constraint,
            at=args.at,
            priority=args.priority,
        )
    for change in result.changes:
        print(change.line())
    print(f"whatif: {result.judged} recorded verdicts judged again, {len(result.changes)} change")
    return 0


async def verify_replay(db: str) -> ProjectionReport:
    """Recompute the projection hash and compare it with the checkpoints and snapshots."""
    async with open_journal(db, readonly=True) as journal:
        return await verify_projections(journal)
