"""``dirk``: inspect, verify and re-export a kernel's journal from the command line.

Every command reads the journal read-only, except the operator's changes
(``decide``, ``amend``, ``agent --set``, ``rules --override``/``--skip``), which
write one request, signed with the operator's key, into the journal's operator
inbox (kernel.inbox), and ``operator``, which edits the kernel's keyring; none
of them needs the kernel to be running. Errors are one line with a code (a ``ReasonCode`` or a
``CliError``) and an ``ExitCode`` (both listed in ``dirk --help``), never a
traceback, and a reader that goes away (``dirk flows | head -1``) ends a command quietly.
The chain key of a keyed journal comes from ``DIRK_CHAIN_KEY`` or ``--key-file``,
never from a flag's value, which other users of the machine could see.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import sys
import textwrap
from collections.abc import Sequence
from typing import Any, NoReturn

import anyio
import msgspec

from kernel.audit.narrative import narrate as _narrate
from kernel.audit.narrative import outcome as _outcome
from kernel.audit.units import offset, readable
from kernel.cli._admin import add_commands as add_admin_commands
from kernel.cli._artifacts import add_commands as add_artifact_commands
from kernel.cli._audit import add_commands as add_audit_commands
from kernel.cli._beliefs import add_commands as add_belief_commands
from kernel.cli._completion import add_command as add_completion_command
from kernel.cli._escalations import add_commands as add_escalation_commands
from kernel.cli._grants import add_commands as add_grant_commands
from kernel.cli._journal import add_commands as add_journal_commands
from kernel.cli._keyring import add_commands as add_keyring_commands
from kernel.cli._mcp import add_commands as add_mcp_commands
from kernel.cli._operator import add_commands, counted, error, error_of, fold_journal
from kernel.cli._proofs import add_commands as add_proof_commands
from kernel.cli._read import (
    find_flows,
    flows_matching,
    paged,
    positive,
    principal_lines,
    print_table,
    say,
    select_flows,
    when,
)
from kernel.cli._replay import add_commands as add_replay_commands
from kernel.cli._roadmap import add_commands as add_roadmap_commands
from kernel.cli._serve import add_commands as add_serve_commands
from kernel.cli._shadow import add_commands as add_shadow_commands
from kernel.cli._tenants import add_commands as add_tenant_commands
from kernel.cli._verify import add_commands as add_verify_commands
from kernel.console import add_commands as add_console_commands
from kernel.core import events as ev
from kernel.core.events import Event
from kernel.core.flow import FlowState, FlowStatus, IllegalTransition
from kernel.core.reasons import CliError, ExitCode
from kernel.core.text import utf8_problem
from kernel.journal.errors import is_postgres
from kernel.journal.opening import open_journal
from kernel.journal.store import JournalCorrupt, JournalError
from kernel.registry import KERNEL_VERSION
from kernel.state.projections import Projections
from kernel.telemetry import trace_id_for

EPILOG = f"""\
--db takes a journal file or a postgresql:// URL (dir-kernel[postgres]); keep a
server's password in PGPASSWORD or ~/.pgpass, not in the URL.

exit status:
  {ExitCode.OK:<3}  the command did its work
  {ExitCode.FAILED:<3}  the answer is no: a check failed, something named is unknown,
       a change is refused, the collector did not take the spans
  {ExitCode.USAGE:<3}  it could not run as given: bad flags or flag values,
       an unreadable journal, no exporter
  {ExitCode.INTERRUPTED:<3}  interrupted (Ctrl-C)
  {ExitCode.CLOSED_PIPE:<3}  the reader went away (dirk flows | head -1), quietly

An error is one line on stderr, "error: CODE: what": CODE is a reason code
(the kernel's word for the condition) or one of dirk's own:
{textwrap.fill(", ".join(CliError) + ".", width=78)}
"""

DB_ENV = "DIRK_DB"
"""The environment variable naming the journal when ``--db`` is not given."""

# How long ``traces export`` waits for the collector to take the spans, unless told.
_EXPORT_TIMEOUT_S = 10.0
# The batch span processor's smallest sensible queue (its batches are 512 spans).
_MIN_QUEUE = 8192


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``dirk`` command line; return the exit status (an ``ExitCode``, see EPILOG).

    ``verify`` and ``anchor`` report any file that is there but does not check
    out as one ``FAILED`` line and FAILED (1). A closed pipe on stdout ends any
    command quietly with CLOSED_PIPE (141), as a pipe's writer killed by SIGPIPE would.
    """
    parser = _parser()
    args = parser.parse_args(_with_default_db(sys.argv[1:] if argv is None else list(argv)))
    if getattr(args, "needs_db", False) and not args.db:
        return error(
            CliError.BAD_ARGUMENT,
            f"name the journal: --db FILE or URL, or set ${DB_ENV}",
            ExitCode.USAGE,
        )
    refused = _not_text(args)
    if refused is not None:
        return error(CliError.BAD_ARGUMENT, refused, ExitCode.USAGE)
    db = getattr(args, "db", None) or ""
    try:
        return _run(args, db)
    except BrokenPipeError:
        # Whatever is still buffered goes nowhere, so the interpreter's last flush is quiet too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return ExitCode.CLOSED_PIPE
    except JournalError as exc:
        return error_of(exc, ExitCode.USAGE)
    except IllegalTransition as exc:
        # Events that decode but do not fold: edited behind the kernel's back.
        return error_of(JournalCorrupt(db, f"{exc} (run dirk verify)"), ExitCode.USAGE)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


def _run(args: argparse.Namespace, db: str) -> int:
    """Run the parsed command on its journal (a file that is none is refused first)."""
    if db and not is_postgres(db) and not os.path.isfile(db):
        # SQLite's own words for this are "unable to open database file".
        what = "no such file" if not os.path.exists(db) else "not a file"
        raise JournalError(db, what)
    # Reading commands for people page what does not fit a terminal (never --json).
    pages = getattr(args, "pages", False) and not getattr(args, "json", False)
    with paged(pages and not args.no_pager):
        status = int(anyio.run(args.run, args))
    # Flushed here, so a reader that went away is seen here and not at exit.
    sys.stdout.flush()
    return status


DESCRIPTION = f"""\
dirk: inspect, verify and re-export a kernel's journal, and act as its operator.

Every command names its journal with --db FILE or URL; ${DB_ENV}, when set, is the default.
Reading commands print text for people, or JSON with --json.
"""


_FILE_ARGUMENTS = frozenset(
    {
        "db",
        "source",
        "target",
        "key_file",
        "anchor",
        "operators",
        "token_file",
        "pack",
        "files",
        "keyring",
        "mcp_token_file",
    }
)
"""Arguments that name files: any bytes the system takes (a name need not be UTF-8)."""


def _not_text(args: argparse.Namespace) -> str | None:
    """Return why an argument is refused before the command runs, or None.

    Under ``surrogateescape`` an argument byte that is not UTF-8 (``\\xff``) arrives as a
    lone surrogate: such text could be neither recorded nor queued, so every argument
    but a file's name must be UTF-8 (the kernel's wall then checks what each field takes).
    """
    for dest, value in sorted(vars(args).items()):
        if dest in _FILE_ARGUMENTS or callable(value):
            continue
        for item in value if isinstance(value, list) else [value]:
            problem = utf8_problem(item) if isinstance(item, str) else None
            if problem is not None:
                flag = dest.replace("_", "-")
                return f"{flag}: {problem} (was a byte of it not UTF-8?)"
    return None


def _with_default_db(argv: list[str]) -> list[str]:
    """Add ``--db $DIRK_DB`` to a command given no ``--db`` (every command takes one)."""
    default = os.environ.get(DB_ENV, "")
    asks_help = {"-h", "--help", "--version"} & set(argv)
    # ``copy`` takes the journal to copy as --from (or --db).
    given = any(arg.split("=")[0] in ("--db", "--from") for arg in argv)
    if default and argv and not asks_help and not given:
        return [*argv, "--db", default]
    return argv


class _Parser(argparse.ArgumentParser):
    """argparse, its errors in dirk's form: the usage, then ``error: BAD_ARGUMENT: what``."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        """Add an argument; a required ``--db`` is shown optional: ``$DIRK_DB`` stands for it.

        A command that needs its journal says so after parsing (``needs_db``), as one line.
        """
        long = next((a for a in args if str(a).startswith("--")), "")
        dest = kwargs.get("dest") or str(long)[2:].replace("-", "_")
        if kwargs.get("required") and dest == "db":
            kwargs["required"] = False
            kwargs["metavar"] = kwargs.get("metavar") or f"${DB_ENV}"
            kwargs["help"] = f"{kwargs.get('help')} (default ${DB_ENV})"
            self.set_defaults(needs_db=True)
        return super().add_argument(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        error(CliError.BAD_ARGUMENT, f"{self.prog}: {message}")
        sys.exit(ExitCode.USAGE)


def _parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = _Parser(
        prog="dirk",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"dirk {KERNEL_VERSION}",
        help="print dirk's version and exit",
    )
    parser.add_argument(
        "--no-pager",
        action="store_true",
        help="never page long output on a terminal (PAGER='' or DIRK_PAGER='' say the same)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    flows = commands.add_parser(
        "flows",
        help="list DecisionFlows (filters combine; times are the journal's clock, UTC)",
    )
    flows.add_argument("--db", required=True, help="the journal: a file or a postgresql:// URL")
    flows.add_argument("--agent", metavar="AGENT_ID", help="only flows of this agent")
    flows.add_argument("--kind", metavar="KIND", help="only flows proposing this policy kind")
    flows.add_argument(
        "--reason",
        type=str.upper,
        metavar="CODE",
        help="only flows that ended with this reason code (as in the REASON column)",
    )
    flows.add_argument(
        "--since",
        type=when,
        metavar="TIME",
        help="only flows created at or after TIME (ISO 8601, 2024-03-15T14:30; UTC unless zoned)",
    )
    flows.add_argument(
        "--until", type=when, metavar="TIME", help="only flows created before TIME (as --since)"
    )
    flows.add_argument(
        "--limit", type=positive, metavar="N", help="only the N most recently created of them"
    )
    flows.add_argument(
        "--status",
        type=str.upper,
        choices=[status.value for status in FlowStatus],
        metavar="STATUS",
        help="only flows in this status (e.g. ABORTED)",
    )
    flows.add_argument(
        "--needs-review",
        action="store_true",
        help="only flows flagged NEEDS_REVIEW (by a soft guard or a rule past its budget)",
    )
    flows.add_argument("--json", action="store_true", help="one JSON object per line, per flow")
    flows.set_defaults(run=_flows, pages=True)

    show = commands.add_parser("show", help="print the narrative of one flow")
    show.add_argument(
        "dfid",
        metavar="FLOW",
        help="the flow: its DFID, a unique prefix of it, or its trace id as a trace viewer shows",
    )
    show.add_argument("--db", required=True, help="the journal: a file or a postgresql:// URL")
    show.add_argument(
        "--json", action="store_true", help="the flow and its events as one JSON object"
    )
    show.add_argument(
        "--currency",
        default="USD",
        metavar="CODE",
        help="the currency whose minor units the packs count in, shown as such (default USD;"
        " none: amounts as recorded)",
    )
    show.set_defaults(run=_show, pages=True)

    traces = commands.add_parser("traces", help="OpenTelemetry spans from the journal")
    traces_commands = traces.add_subparsers(dest="traces_command", required=True, metavar="COMMAND")
    export = traces_commands.add_parser("export", help="re-emit past flows as spans (OTEL_* env)")
    export.add_argument("--db", required=True, help="the journal: a file or a postgresql:// URL")
    export.add_argument(
        "--dfid",
        metavar="FLOW",
        help="only this flow and its children (a DFID, a unique prefix, or a trace id)",
    )
    export.add_argument("--json", action="store_true", help="the outcome as one JSON object")
    export.add_argument(
        "--timeout",
        type=float,
        default=_EXPORT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up on the collector after this long (default {_EXPORT_TIMEOUT_S:g})",
    )
    export.set_defaults(run=_traces_export)
    add_verify_commands(commands)
    add_artifact_commands(commands)
    add_proof_commands(commands)
    add_escalation_commands(commands)
    add_commands(commands)
    add_admin_commands(commands)
    add_keyring_commands(commands)
    add_replay_commands(commands)
    add_journal_commands(commands)
    add_mcp_commands(commands)
    add_console_commands(commands)
    add_serve_commands(commands)
    add_belief_commands(commands)
    add_completion_command(commands, _parser)
    add_roadmap_commands(commands)
    add_grant_commands(commands)
    add_shadow_commands(commands)
    add_audit_commands(commands)
    add_tenant_commands(commands)
    return parser


def _flow_row(flow: FlowState) -> dict[str, Any]:
    return {
        "dfid": flow.dfid,
        "status": str(flow.status),
        "agent_id": flow.agent_id,
        "policy_kind": flow.proposal.kind if flow.proposal else "",
        "attempts": flow.attempts,
        "reason_code": str(flow.reason_code) if flow.reason_code else "",
        "parent_dfid": flow.parent_dfid,
        "created": _time(flow.created_ts),
        "needs_review": flow.needs_review,
        "trace_id": f"{trace_id_for(flow.dfid):032x}",
    }


async def _flows(args: argparse.Namespace) -> int:
    projections = await fold_journal(args.db)
    everything = projections.flows.values()
    # "Now" is the journal's: its latest event, so a simulated run's ages make sense.
    now = max((f.updated_ts for f in everything), default=0)
    flows = select_flows(everything, args)
    rows = [_flow_row(f) for f in flows]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return ExitCode.OK
    print_table(flows, now, among=projections.flows)
    say(counted(len(rows), "flow"))
    return ExitCode.OK


async def _show(args: argparse.Namespace) -> int:
    async with open_journal(args.db, readonly=True) as journal:
        found = await find_flows(journal, args.dfid)
        if len(found) > 1:
            some = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
            return error(
                CliError.AMBIGUOUS_FLOW, f"{args.dfid} fits {len(found)} flows ({some}): say more"
            )
        events = await journal.flow_events(found[0]) if found else []
    if not events:
        return error(CliError.UNKNOWN_FLOW, f"no flow {args.dfid} in {args.db}")
    dfid = found[0]
    start = events[0].ts
    first = events[0]
    projections = Projections()
    projections.apply(events)
    flow = projections.flows.get(dfid)
    trace = f"{trace_id_for(dfid):032x}"
    if args.json:
        row: dict[str, Any] = _flow_row(flow) if flow is not None else {"dfid": dfid}
        row["trace_id"] = trace
        row["events"] = [msgspec.to_builtins(e) for e in events]
        print(json.dumps(row))
        return ExitCode.OK
    say(f"DecisionFlow {dfid}")
    say(f"  trace {trace}")
    say(f"  agent {first.agent_id}, parent {first.parent_dfid or '-'}, started {_time(start)}")
    say(*principal_lines(events))
    for event in events:
        words = readable(_narrate(event), args.currency)
        say(f"  {offset(event.ts - start):>14}  #{event.seq:<6} {event.type:20} {words}")
    if flow is not None:
        say(f"  {_outcome(flow)}")
    return ExitCode.OK


def _time(ts_ns: int) -> str:
    return dt.datetime.fromtimestamp(ts_ns / 1e9, tz=dt.UTC).isoformat(timespec="milliseconds")


class _ExportProblems(logging.Handler):
    """Count the exporter's errors, and show its warnings on one line each.

    The batch span processor drops what its exporter failed to send and says so
    only in its log, so that log is how the command learns the export failed.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.errors = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            self.errors += 1
        # The message without its traceback: the CLI prints no tracebacks.
        say(f"otel: {record.getMessage()}", file=sys.stderr)


def _flow_named(args: argparse.Namespace, events: list[Event]) -> str | int:
    """The flow ``--dfid`` names (whole or a prefix), or the exit code when it names none."""
    created = [e.dfid for e in events if isinstance(e.payload, ev.FlowCreated) and e.dfid]
    found = [args.dfid] if args.dfid in created else flows_matching(created, args.dfid)
    if len(found) > 1:
        return error(CliError.AMBIGUOUS_FLOW, f"{args.dfid} fits {len(found)} flows: say more")
    if not found:
        return error(CliError.UNKNOWN_FLOW, f"no flow {args.dfid} in {args.db}")
    return found[0]


async def _traces_export(args: argparse.Namespace) -> int:
    from kernel.telemetry import (
        ExporterUnavailable,
        configure_exporter,
        export_flows,
        shutdown_processor,
    )

    events: list[Event] = []
    async with open_journal(args.db, readonly=True) as journal:
        async for batch in journal.scan():
            events.extend(batch)
    dfid = _flow_named(args, events) if args.dfid else None
    if isinstance(dfid, int):
        return dfid
    env = dict(os.environ)
    # Every span is handed over at once, and a full queue drops spans: make room for
    # them all (a flow has at most two spans per event).
    env.setdefault("OTEL_BSP_MAX_QUEUE_SIZE", str(max(_MIN_QUEUE, 2 * len(events))))
    try:
        # A one-off export: a refusal is the answer, said at once (no retries).
        processor = configure_exporter(env, give_up_s=0.0)
    except ExporterUnavailable as exc:
        return error(CliError.NO_EXPORTER, str(exc), ExitCode.USAGE)
    if processor is None:
        return error(
            CliError.NO_EXPORTER,
            "set OTEL_EXPORTER_OTLP_ENDPOINT (e.g. http://127.0.0.1:4318)",
            ExitCode.USAGE,
        )
    problems = _ExportProblems()
    otel_log = logging.getLogger("opentelemetry")
    otel_log.addHandler(problems)
    try:
        count = export_flows(events, processor, dfid=dfid)
    finally:
        # Bounded: an unreachable collector must not hold the command.
        finished = await anyio.to_thread.run_sync(shutdown_processor, processor, args.timeout)
        # An export still running past the timeout logs through Python's last resort.
        otel_log.removeHandler(problems)
    if not finished:
        return error(
            CliError.EXPORT_TIMEOUT,
            f"the collector did not take the {count} spans within {args.timeout:g} s;"
            " those not sent were dropped",
        )
    if problems.errors:
        return error(
            CliError.EXPORT_FAILED, f"the collector did not take all {count} spans (see above)"
        )
    if args.json:
        print(json.dumps({"ok": True, "spans": count, "dfid": dfid}))
    else:
        say(f"traces: exported {count} spans")
    return ExitCode.OK
