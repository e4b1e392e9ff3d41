"""``dirk audit``: one record per attempt, for one tenant, from the journal.

Every call an agent made on someone's behalf, allowed or refused at any layer, with
whom it was for (tenant, user, email), the kind, the decision, the reason, the layer,
the trace id (the flow's DFID, what ``dirk show`` takes), the delegation chain, the tier
and the agent (kernel.audit.attempts derives them). ``--json`` prints one JSON object
per line; ``--jsonl FILE`` writes the same JSON Lines to a file (an export) and says how
many. ``--tenant ''`` lists the attempts of flows that recorded no principal (a journal
older than principals): they say so.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import msgspec

from kernel.audit.attempts import Attempt, attempts
from kernel.cli._operator import error
from kernel.cli._read import json_text, print_rows, say
from kernel.core.reasons import CliError, ExitCode
from kernel.journal.opening import open_journal

_COLUMNS = (
    "TIME",
    "USER",
    "AGENT",
    "TIER",
    "KIND",
    "DECISION",
    "REASON",
    "LAYER",
    "CHAIN",
    "TRACE",
)

NO_PRINCIPAL = "(no principal recorded)"
"""What a row of a flow that recorded no principal shows for its user."""


def add_commands(commands: Any) -> None:
    """Add ``audit`` to ``dirk``'s subcommands."""
    audit = commands.add_parser(
        "audit", help="one record per attempt (allowed or refused) for a tenant's users"
    )
    audit.add_argument("--db", required=True, help="the journal: a file or a postgresql:// URL")
    audit.add_argument(
        "--tenant",
        required=True,
        metavar="TENANT",
        help="only this tenant's attempts ('' for flows that recorded no principal)",
    )
    audit.add_argument("--user", metavar="USER", help="only this user's attempts")
    audit.add_argument("--json", action="store_true", help="one JSON object per line, per attempt")
    audit.add_argument(
        "--jsonl", metavar="FILE", help="write the attempts to FILE as JSON Lines (an export)"
    )
    audit.set_defaults(run=_audit, pages=True)


def document(attempt: Attempt) -> str:
    """Return one attempt as one line of JSON (what ``--json`` and ``--jsonl`` write)."""
    return json_text(json.dumps(msgspec.to_builtins(attempt), ensure_ascii=False))


def cells(attempt: Attempt) -> Sequence[str]:
    """Return one attempt as the table's cells."""
    user = attempt.user if attempt.principal else NO_PRINCIPAL
    if attempt.email:
        user += f" <{attempt.email}>"
    decision = attempt.decision + (" (without journal)" if attempt.without_journal else "")
    return (
        attempt.time,
        user,
        attempt.agent,
        attempt.tier,
        attempt.kind,
        decision,
        attempt.reason_code,
        attempt.layer,
        " > ".join(attempt.chain),
        attempt.trace_id,
    )


async def _audit(args: argparse.Namespace) -> int:
    if args.jsonl is not None:
        try:
            async with await anyio.open_file(args.jsonl, "w", encoding="utf-8") as out:
                count = await _write(args, out.write)
        except OSError as exc:
            return error(
                CliError.BAD_ARGUMENT,
                f"jsonl: cannot write {args.jsonl} ({exc.strerror})",
                ExitCode.USAGE,
            )
        say(f"{count} attempts written to {args.jsonl}")
        return ExitCode.OK
    if args.json:
        await _write(args, _print)
        return ExitCode.OK
    rows: list[Sequence[str]] = []
    async with open_journal(args.db, readonly=True) as journal:
        async for attempt in attempts(journal, tenant=args.tenant, user=args.user):
            rows.append(cells(attempt))
    print_rows(_COLUMNS, rows)
    say(f"{len(rows)} attempts in tenant {args.tenant!r}" + _of_user(args.user))
    return ExitCode.OK


def _of_user(user: str | None) -> str:
    return "" if user is None else f" by user {user!r}"


async def _print(line: str) -> None:
    print(line, end="")


async def _write(args: argparse.Namespace, emit: Callable[[str], Awaitable[object]]) -> int:
    """Write each attempt as a line of JSON through ``emit``; return how many."""
    count = 0
    async with open_journal(args.db, readonly=True) as journal:
        async for attempt in attempts(journal, tenant=args.tenant, user=args.user):
            await emit(document(attempt) + "\n")
            count += 1
    return count
