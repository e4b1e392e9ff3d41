"""``dirk shadow``: a candidate pack's report, and the operator's retire and promote.

``shadow report`` only reads the journal. Without ``--pack`` it reads what a shadow
recorded live (the last loaded, or the one loaded at ``--shadow SEQ``); with ``--pack``
it replays the journal with the candidate in its pack's place (``--with`` the other
packs in force), over ``--from``/``--to``: the same report either way
(kernel.audit.shadow), so a CI job can gate a candidate on history before it runs live,
and on live traffic before it is promoted. ``--fail-above N`` exits FAILED (1) when
more than N verdicts differ. ``--json`` prints the report with its digest.

``shadow load``, ``shadow retire`` and ``shadow promote`` post one signed request into
the operator inbox (kernel.inbox.ShadowRequest), as ``dirk grant revoke`` does;
``promote --report DIGEST`` names the report reviewed, and the kernel refuses the
promotion if the shadow's report has changed since (SHADOW_REPORT_CHANGED). Loading
takes the candidate's code, so ``load PACK --version V [--candidate HASH]`` names one
the embedding program offered (``Kernel.offer_shadow``); the kernel refuses a version
not offered, or one whose hash is not the one reviewed (SHADOW_INVALID).
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from kernel.audit.reverify import PackPathError, load_packs
from kernel.audit.shadow import (
    NoShadow,
    ShadowReport,
    digest,
    history_report,
    live_report,
    report_lines,
)
from kernel.cli._operator import (
    add_act_arguments,
    error,
    error_of,
    fold_journal_now,
    post_request,
)
from kernel.cli._read import print_json, say
from kernel.cli._replay import packs_from
from kernel.core.reasons import CliError, ExitCode, ReasonCode
from kernel.core.wall import InputInvalid, who_and_why
from kernel.inbox import ShadowRequest
from kernel.inbox.requests import normalized
from kernel.journal.opening import open_journal
from kernel.state.shadows import Shadows


def add_commands(commands: Any) -> None:
    """Add ``shadow`` and its acts to ``dirk``'s subcommands."""
    shadow = commands.add_parser(
        "shadow", help="a shadow pack's report (live or replayed), retire or promote it"
    )
    acts = shadow.add_subparsers(dest="act", required=True)

    report = acts.add_parser("report", help="the verdicts a candidate pack decides otherwise")
    report.add_argument("--db", required=True, help="the journal file")
    report.add_argument(
        "--shadow", type=int, metavar="SEQ", help="the shadow loaded at SEQ (default: the last)"
    )
    report.add_argument(
        "--pack", metavar="PATH", help="replay with this candidate: FILE.py[:ATTR] or MODULE[:ATTR]"
    )
    report.add_argument(
        "--with",
        dest="others",
        action="append",
        default=[],
        metavar="PATH",
        help="with --pack: another pack in force beside it (repeatable)",
    )
    report.add_argument(
        "--from", dest="start", type=int, default=0, metavar="SEQ", help="after event SEQ"
    )
    report.add_argument("--to", dest="stop", type=int, metavar="SEQ", help="through event SEQ")
    report.add_argument(
        "--fail-above",
        type=int,
        metavar="N",
        help="exit 1 when more than N verdicts differ (a CI gate)",
    )
    report.add_argument("--json", action="store_true", help="the report as one JSON object")
    report.set_defaults(run=_report)

    for act, words in (
        ("load", "load a candidate the kernel's program offered as a shadow"),
        ("retire", "stop a shadow; the enforced pack stays"),
        ("promote", "make a shadow the enforced pack, with its report's digest"),
    ):
        parser = acts.add_parser(act, help=words)
        parser.add_argument("pack", metavar="PACK", help="the name of the pack it shadows")
        parser.add_argument(
            "--version",
            default="",
            required=act == "load",
            help="the candidate's version (load), or the shadow's (checked)",
        )
        if act == "promote":
            parser.add_argument(
                "--report", default="", metavar="DIGEST", help="the digest of the report reviewed"
            )
        if act == "load":
            parser.add_argument(
                "--candidate",
                default="",
                metavar="HASH",
                help="the content hash of the candidate reviewed (refused if another is offered)",
            )
        add_act_arguments(parser)
        parser.set_defaults(run=_act, action=act)


def _bad_numbers(args: argparse.Namespace) -> str | None:
    for flag, value in (
        ("--shadow", args.shadow),
        ("--from", args.start),
        ("--to", args.stop),
        ("--fail-above", args.fail_above),
    ):
        if value is not None and not 0 <= value < 2**63:
            return f"{flag} takes a number from 0, not {value}"
    if args.shadow is not None and args.pack:
        return "--shadow reads a live shadow; --pack replays: give one"
    if args.others and not args.pack:
        return "--with goes with --pack"
    return None


async def _report(args: argparse.Namespace) -> int:
    bad = _bad_numbers(args)
    if bad is not None:
        return error(CliError.BAD_ARGUMENT, bad, ExitCode.USAGE)
    try:
        report = await _read(args)
    except PackPathError as exc:
        return error_of(exc, ExitCode.USAGE)
    except NoShadow as exc:
        return error(ReasonCode.SHADOW_NOT_LOADED, f"{args.db}: {exc}")
    if args.json:
        print_json(
            msgspec.to_builtins(report) | {"differed": report.differed, "digest": digest(report)}
        )
    else:
        for line in report_lines(report):
            say(line)
    if args.fail_above is not None and report.differed > args.fail_above:
        if not args.json:
            say(f"shadow: FAILED {report.differed} verdict(s) differ, above {args.fail_above}")
        return ExitCode.FAILED
    return ExitCode.OK


async def _read(args: argparse.Namespace) -> ShadowReport:
    """The report ``args`` ask for: replayed with ``--pack``, else as recorded live."""
    async with open_journal(args.db, readonly=True) as journal:
        if args.pack:
            candidates = load_packs(args.pack)
            others = packs_from(args.others)  # the memory pack unless one is given
            return await history_report(
                journal, candidates, others, start=args.start, stop=args.stop
            )
        return await live_report(journal, shadow=args.shadow, stop=args.stop)


async def _act(args: argparse.Namespace) -> int:
    problem = who_and_why(args.operator, args.reason)
    if problem is not None:
        return error(ReasonCode.SCHEMA_INVALID, problem, ExitCode.USAGE)
    try:
        request = normalized(
            ShadowRequest(
                action=args.action,
                pack=args.pack,
                version=args.version,
                report=getattr(args, "report", ""),
                candidate=getattr(args, "candidate", ""),
                operator=args.operator,
                reason=args.reason,
            )
        )
    except InputInvalid as exc:
        return error(exc.reason_code, f"{exc.field}: {exc.detail}", ExitCode.USAGE)
    if args.action == "load":  # what is offered lives in the kernel's process: it answers
        return await post_request(args, request, f"load of {args.pack} {args.version} as a shadow")
    projections, _ = await fold_journal_now(args.db)
    judging = [s for s in projections.domain(Shadows).judging() if s.name == args.pack]
    if not judging or (args.version and judging[-1].version != args.version):
        what = f"{args.pack} {args.version}".strip()
        return error(ReasonCode.SHADOW_NOT_LOADED, f"no shadow {what:.200} judges in {args.db}")
    return await post_request(args, request, f"{args.action} of the shadow of {args.pack}")
