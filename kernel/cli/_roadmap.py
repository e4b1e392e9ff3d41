"""``dirk roadmap``: coding agents' roadmap (ESAA's ``roadmap.json``), folded from a journal.

It rebuilds the roadmap from the journal (through the trusted snapshots ``dirk state``
uses; ``--at SEQ``: as it stood after event SEQ), so what it prints is a replay: the
``projection_hash_sha256`` it shows is the hash of the roadmap rebuilt from the log,
and equals the live kernel's when nothing diverged (docs/coding-agents.md).
"""

from __future__ import annotations

import argparse
from typing import Any

from kernel.cli._operator import error
from kernel.cli._read import print_json, print_rows, say
from kernel.core.reasons import CliError, ExitCode
from kernel.journal.opening import open_journal
from kernel.state.roadmap.domain import Roadmap
from kernel.state.roadmap.view import roadmap_json
from kernel.state.snapshots import state_at


def add_commands(commands: Any) -> None:
    """Add ``roadmap`` to the ``dirk`` parser's subcommands."""
    roadmap = commands.add_parser(
        "roadmap",
        help="coding agents' roadmap: tasks, claims, commits, checks, phases (ESAA)",
    )
    roadmap.add_argument("--db", required=True, help="the journal: a file or a postgresql:// URL")
    roadmap.add_argument(
        "--at", type=int, metavar="SEQ", help="as after event SEQ (default: the end)"
    )
    roadmap.add_argument(
        "--json", action="store_true", help="the roadmap as one object (ESAA's roadmap.json)"
    )
    roadmap.set_defaults(run=_roadmap)


async def _roadmap(args: argparse.Namespace) -> int:
    async with open_journal(args.db, readonly=True) as journal:
        if args.at is not None and not 0 <= args.at <= journal.head_seq:
            return error(CliError.UNKNOWN_SEQ, f"{args.db} has events 1..{journal.head_seq}")
        projections = await state_at(journal, args.at)
    document = roadmap_json(projections.domain(Roadmap).state, projections.last_seq)
    if args.json:
        print_json({"roadmap": document})
        return ExitCode.OK
    if document is None:
        say(f"no roadmap: no esaa.open was carried out (events 1..{projections.last_seq})")
        return ExitCode.OK
    _show(document)
    return ExitCode.OK


def _show(document: dict[str, Any]) -> None:
    run = document["run"]
    counts = ", ".join(f"{n} {state}" for state, n in document["counts"].items())
    say(
        f"roadmap {document['project'] or '(unnamed)'}: opened by {run['opened_by']} at"
        f" #{run['opened_seq']} on {run['base_commit'][:12]}, head {run['head_commit'][:12]}",
        f"{len(document['tasks'])} tasks: {counts}",
    )
    print_rows(
        ["TASK", "PHASE", "KIND", "STATE", "AGENT", "DEPENDS ON", "ACCEPTANCE", ">COMMITS"],
        [_row(task) for task in document["tasks"]],
    )
    for phase in document["phases"]:
        finished = f"finished at #{phase['done_seq']}" if phase["done_seq"] else "open"
        say(f"phase {phase['phase']}: {phase['done']}/{phase['tasks']} done, {finished}")
    for task in document["tasks"]:
        for issue in task["issues"]:
            opened = f" -> hotfix {issue['hotfix']}" if issue["hotfix"] else ""
            say(
                f"issue #{issue['seq']} on {task['task_id']} ({issue['severity']},"
                f" {issue['agent']}): {issue['title']}{opened}"
            )
    say(
        f"projection_hash_sha256 {run['projection_hash_sha256']}"
        f" (replayed to #{run['last_event_seq']})"
    )


def _row(task: dict[str, Any]) -> list[str]:
    checks = []
    for name in task["acceptance"]:
        run = task["runs"].get(name)
        result = "not run" if run is None else "passed" if run["passed"] else "failed"
        checks.append(f"{name}: {result}")
    return [
        task["task_id"],
        task["phase"],
        task["kind"],
        task["state"],
        task["claimed_by"],
        ", ".join(task["depends_on"]),
        "; ".join(checks),
        str(len(task["commits"])),
    ]
