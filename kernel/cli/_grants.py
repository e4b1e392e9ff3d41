"""``dirk grants`` and ``dirk grant``: standing grants, listed, given, voted on and taken back.

``grants`` only reads the journal: each grant, what it allows, its uses and money, its
window, whether it is live (on the journal's clock: its last event's time). ``grant add``,
``grant vote`` and ``grant revoke`` post one signed request into the operator inbox, as
``dirk decide`` does (kernel.inbox), checked here as the kernel will check it.
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from kernel.cli._operator import (
    add_act_arguments,
    error,
    fold_journal_now,
    post_request,
    refused,
)
from kernel.cli._read import iso_time, print_json, print_rows, say
from kernel.core.reasons import CliError, ExitCode, ReasonCode
from kernel.inbox import RequestRefused
from kernel.inbox.prepare import bounds_of, grant_request, grant_revocation, grant_vote
from kernel.policy.money import format_money
from kernel.state.grants import Grant, Grants, describe, live

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def add_commands(commands: Any) -> None:
    """Add ``grants`` and ``grant`` to ``dirk``'s subcommands."""
    listing = commands.add_parser("grants", help="list standing grants: scope, uses, window")
    listing.add_argument("--db", required=True, help="the journal file")
    listing.add_argument("--json", action="store_true", help="one JSON object per grant")
    listing.set_defaults(run=_grants)

    grant = commands.add_parser("grant", help="give, vote on or revoke a standing grant")
    acts = grant.add_subparsers(dest="act", required=True)

    add = acts.add_parser("add", help="grant in advance: matching proposals skip the human")
    add.add_argument("--kind", required=True, help="the policy kind, e.g. booking.reserve_room")
    add.add_argument("--agent", default="*", help="the agent it is for (default: any)")
    add.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="TERM",
        help="a bound: FIELD=VALUE, FIELD=A|B, FIELD<=N, FIELD>=N (repeatable)",
    )
    add.add_argument("--uses", required=True, type=int, help="how many proposals it may let by")
    end = add.add_mutually_exclusive_group(required=True)
    end.add_argument("--for", dest="duration", metavar="DURATION", help="e.g. 7d, 12h, 30m")
    end.add_argument("--until", metavar="ISO", help="an end time, e.g. 2025-06-08T00:00:00Z")
    add.add_argument("--from", dest="start", metavar="ISO", help="a start time (default: now)")
    add.add_argument("--cap", default="", metavar="MONEY", help="a money cap: '1,000.00 EUR'")
    add_act_arguments(add)
    add.set_defaults(run=_add)

    vote = acts.add_parser("vote", help="vote on a grant that waits for its quorum")
    vote.add_argument("grant", metavar="GRANT", help="the grant's id (g-...)")
    choice = vote.add_mutually_exclusive_group(required=True)
    choice.add_argument("--approve", action="store_true", help="count my approval")
    choice.add_argument("--reject", action="store_true", help="vote against it")
    add_act_arguments(vote)
    vote.set_defaults(run=_vote)

    revoke = acts.add_parser("revoke", help="take a grant out of force")
    revoke.add_argument("grant", metavar="GRANT", help="the grant's id (g-...)")
    add_act_arguments(revoke)
    revoke.set_defaults(run=_revoke)


def status_of(grant: Grant, now_ns: int) -> str:
    """LIVE, PENDING, REVOKED, REJECTED, or why a live grant no longer matches (USED, EXPIRED)."""
    if grant.status != "LIVE" or live(grant, now_ns):
        return str(grant.status) if now_ns >= grant.valid_from_ns else "NOT_YET"
    return "USED" if grant.used >= grant.uses else "EXPIRED"


def grant_row(grant: Grant, now_ns: int) -> dict[str, Any]:
    """What ``dirk grants`` (and the console) show of one grant."""
    return {
        "grant": grant.grant,
        "status": status_of(grant, now_ns),
        "kind": grant.kind,
        "agent": grant.agent,
        "bounds": grant.bounds,
        "uses": grant.uses,
        "used": grant.used,
        "cap": format_money(grant.cap, grant.currency) if grant.cap is not None else "",
        "spent": format_money(grant.spent, grant.currency) if grant.cap is not None else "",
        "from": iso_time(grant.valid_from_ns),
        "until": iso_time(grant.valid_until_ns),
        "operator": grant.operator,
        "waiting": grant.waiting,
        "summary": describe(grant),
    }


async def _grants(args: argparse.Namespace) -> int:
    projections, now = await fold_journal_now(args.db)
    grants = sorted(projections.domain(Grants).grants.values(), key=lambda g: g.issued_seq)
    rows = [grant_row(g, now) for g in grants]
    if args.json:
        for row in rows:
            print_json(row)
        return ExitCode.OK
    print_rows(
        ["GRANT", "STATUS", ">USES", "UNTIL", "BY", "ALLOWS"],
        (
            [
                str(r["grant"]),
                str(r["status"]) + (f" ({r['waiting']})" if r["waiting"] else ""),
                f"{r['used']}/{r['uses']}",
                str(r["until"]),
                str(r["operator"]),
                str(r["summary"]),
            ]
            for r in rows
        ),
    )
    say(f"{len(rows)} grants")
    return ExitCode.OK


def _time(text: str) -> int:
    """An ISO 8601 time (UTC unless it says otherwise) as ns since the epoch."""
    when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp()) * 1_000_000_000


def _seconds(text: str) -> float:
    number, unit = text[:-1], text[-1:]
    if unit not in _UNITS or not number.isdigit() or int(number) <= 0:
        raise ValueError(f"{text[:32]!r} is not a duration such as 7d, 12h, 30m or 45s")
    return float(int(number) * _UNITS[unit])


async def _add(args: argparse.Namespace) -> int:
    try:
        start = _time(args.start) if args.start else None
        until = _time(args.until) if args.until else None
        duration = _seconds(args.duration) if args.duration else None
    except ValueError as exc:
        return error(CliError.BAD_ARGUMENT, str(exc), ExitCode.USAGE)
    try:
        # The journal names packs, not their kinds: the kernel checks the kind.
        request = grant_request(
            (),
            args.kind,
            operator=args.operator,
            reason=args.reason,
            uses=args.uses,
            agent=args.agent,
            bounds=bounds_of(args.where),
            valid_from_ns=start,
            valid_until_ns=until,
            valid_for_s=duration,
            cap=args.cap,
        )
    except RequestRefused as exc:
        return refused(exc)
    return await post_request(args, request, f"grant of {args.kind} for {args.agent}")


async def _vote(args: argparse.Namespace) -> int:
    projections, _ = await fold_journal_now(args.db)
    grant = projections.domain(Grants).grants.get(args.grant)
    try:
        request = grant_vote(
            grant,
            args.grant,
            "approve" if args.approve else "reject",
            operator=args.operator,
            reason=args.reason,
        )
    except RequestRefused as exc:
        return refused(exc)
    return await post_request(args, request, f"vote {request.vote} on {args.grant}")


async def _revoke(args: argparse.Namespace) -> int:
    projections, _ = await fold_journal_now(args.db)
    grant = projections.domain(Grants).grants.get(args.grant)
    if grant is None:
        return error(ReasonCode.GRANT_NOT_LIVE, f"no grant {args.grant[:64]} in {args.db}")
    try:
        request = grant_revocation(grant, args.grant, operator=args.operator, reason=args.reason)
    except RequestRefused as exc:
        return refused(exc)
    return await post_request(args, request, f"revocation of {args.grant}")
