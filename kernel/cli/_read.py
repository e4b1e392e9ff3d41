"""What ``dirk``'s reading commands share: finding a flow by any id it goes by, filtering
flows, printing them as a table (``rich``) with short ids and ages on the journal's
clock, and a pager for what does not fit a terminal.

A table fits the terminal's width (``COLUMNS`` when set, as a test sets it), and
shows each DFID by its shortest unique prefix of at least :data:`SHORT_ID`
characters: what ``show``, ``review`` and ``decide`` take back. Output longer than
the terminal is high goes through ``$PAGER`` (``less`` by default), only when stdout
is a terminal: a pipe or a file always gets the whole text.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TextIO

import msgspec

from kernel.core.events import Event, FlowCreated
from kernel.core.flow import FlowState, FlowStatus
from kernel.core.reasons import CliError
from kernel.core.wall import visible
from kernel.telemetry import trace_id_for

if TYPE_CHECKING:
    from kernel.journal.store import Journal

__all__ = [
    "SHORT_ID",
    "FlowNotFound",
    "age",
    "find_flows",
    "flows_matching",
    "iso_time",
    "json_text",
    "paged",
    "positive",
    "principal_lines",
    "print_json",
    "print_rows",
    "print_table",
    "resolve_flow",
    "say",
    "select_flows",
    "short_ids",
    "when",
]


def say(*lines: str, file: TextIO | None = None, flush: bool = False) -> None:
    """Print each line for a person: what is not printable is shown as an escape.

    Every string a journal holds came from outside (agents, operators, adapters), and
    a terminal obeys C0 and C1 controls, DEL and their sequences (clear the screen,
    rewrite the line above, retitle the window, a disguised link), so each line is shown
    through :func:`kernel.core.wall.visible` (``\\x1b``, ``\\x9b``, ``\\n`` inside a value).
    A line is one line: a value cannot add lines of its own. JSON output does not come
    through here; it escapes what it must itself and stays exact.
    """
    for line in lines:
        print(visible(line), file=file, flush=flush)


def json_text(text: str) -> str:
    """Return JSON text with what is not printable inside its strings as ``\\u`` escapes.

    msgspec writes C1 controls, DEL and format characters raw (``json.dumps`` escapes
    every non-ASCII character already); as ``\\u009b`` they decode to the same value.
    The newlines of indented JSON lie between tokens and stay.
    """
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() or char == "\n" else _u_escape(char) for char in text)


def _u_escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # a character past the BMP as its JSON surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def print_json(document: Any) -> None:
    """Print one JSON document on one line (msgspec structs and enums become plain JSON)."""
    print(json.dumps(msgspec.to_builtins(document)))


def iso_time(ts_ns: int) -> str:
    """A time on the journal's clock as ISO 8601, UTC, to the millisecond."""
    return dt.datetime.fromtimestamp(ts_ns / 1e9, tz=dt.UTC).isoformat(timespec="milliseconds")


def when(text: str) -> int:
    """Parse an ISO 8601 time (UTC unless it names a zone) into ns since the epoch."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1e9)


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive number: {text!r}")
    return value


def age(ns: int) -> str:
    """A duration as a person reads it: 45s, 12m, 3h 20m, 2d 4h."""
    seconds = max(0, ns) // 1_000_000_000
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m" + (f" {seconds}s" if seconds and minutes < 10 else "")
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h" + (f" {minutes}m" if minutes else "")
    days, hours = divmod(hours, 24)
    return f"{days}d" + (f" {hours}h" if hours else "")


def select_flows(flows: Iterable[FlowState], args: argparse.Namespace) -> list[FlowState]:
    """The flows ``dirk flows``'s filters keep, oldest first (the newest ``--limit``)."""

    def keep(f: FlowState) -> bool:
        kind = f.proposal.kind if f.proposal else ""
        return (
            (not args.status or f.status == args.status)
            and (not args.needs_review or f.needs_review)
            and (not args.agent or f.agent_id == args.agent)
            and (not args.kind or kind == args.kind)
            and (not args.reason or str(f.reason_code or "") == args.reason)
            and (args.since is None or f.created_ts >= args.since)
            and (args.until is None or f.created_ts < args.until)
        )

    kept = sorted((f for f in flows if keep(f)), key=lambda f: (f.created_ts, f.dfid))
    if args.limit is not None:
        kept = kept[-args.limit :]
    return kept


SHORT_ID = 8
"""The fewest characters of a DFID a table shows (more where two flows share them)."""

_PAGING: list[os.terminal_size] = []
"""The terminal's size while :func:`paged` holds the output back (stdout is then a buffer)."""


def _console() -> Any:
    from rich.console import Console

    # A pipe gets whole lines (no wrapping, no colour) unless COLUMNS says how wide; a
    # terminal gets its width, also while the pager holds the output back.
    class _Console(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError  # main() ends quietly with CLOSED_PIPE, as for print()

    if _PAGING:
        return _Console(
            highlight=False, soft_wrap=False, width=_PAGING[-1].columns, force_terminal=True
        )
    columns = os.environ.get("COLUMNS", "")
    width = None if sys.stdout.isatty() or columns.isdigit() else 1000
    return _Console(highlight=False, soft_wrap=False, width=width)


@contextlib.contextmanager
def paged(enabled: bool = True) -> Iterator[None]:
    """Hold back what the block prints; past a screenful on a terminal, show it in a pager.

    Only when stdout is a terminal (never a pipe or a file), ``enabled`` (``--no-pager``
    says not) and ``$PAGER`` is not empty. The pager is ``$DIRK_PAGER``, else ``$PAGER``,
    else ``less``, run by the shell; ``less`` gets ``LESS=FRX`` unless set (quit at the
    end of one screen, colours as they are). A pager that cannot start prints nothing
    lost: the text is written as it would have been.
    """
    pager = os.environ.get("DIRK_PAGER", os.environ.get("PAGER", "less"))
    if not (enabled and pager.strip() and sys.stdout.isatty()):
        yield
        return
    size = shutil.get_terminal_size()
    held = io.StringIO()
    real = sys.stdout
    _PAGING.append(size)
    try:
        with contextlib.redirect_stdout(held):
            yield
    finally:
        _PAGING.pop()
        text = held.getvalue()
        if text.count("\n") < size.lines:
            real.write(text)
        else:
            _page(pager, text, real)


def _page(pager: str, text: str, out: TextIO) -> None:
    env = dict(os.environ)
    env.setdefault("LESS", "FRX")
    out.flush()
    try:
        # The user's own command line, as git and man run it: through the shell.
        done = subprocess.run(pager, shell=True, input=text, text=True, env=env, check=False)
    except OSError:
        out.write(text)
        return
    if done.returncode == 127:  # the shell found no such pager
        out.write(text)


def short_ids(dfids: Iterable[str], among: Iterable[str] = ()) -> dict[str, str]:
    """Return each DFID's shortest prefix of at least :data:`SHORT_ID` characters that no
    other DFID in ``dfids`` or ``among`` shares (git's short hashes)."""
    wanted = list(dfids)
    every = sorted(set(wanted) | set(among))
    shortest: dict[str, str] = {}
    for i, dfid in enumerate(every):
        need = SHORT_ID
        for other in (every[i - 1] if i else "", every[i + 1] if i + 1 < len(every) else ""):
            common = 0
            while common < min(len(dfid), len(other)) and dfid[common] == other[common]:
                common += 1
            need = max(need, common + 1)
        shortest[dfid] = dfid[:need]
    return {dfid: shortest[dfid] for dfid in wanted}


class FlowNotFound(Exception):
    """No flow, or more than one, goes by the id given (UNKNOWN_FLOW, AMBIGUOUS_FLOW)."""

    def __init__(self, code: CliError, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


async def find_flows(journal: Journal, wanted: str) -> list[str]:
    """Return the DFIDs ``wanted`` names: itself, or those it prefixes (see flows_matching)."""
    if await journal.flow_events(wanted):
        return [wanted]
    created = await journal.read(types=["FlowCreated"])
    return flows_matching((e.dfid for e in created if e.dfid is not None), wanted)


async def resolve_flow(journal: Journal, wanted: str) -> str:
    """Return the one DFID ``wanted`` names: a DFID, a unique prefix of it, or its trace id.

    Raises:
        FlowNotFound: UNKNOWN_FLOW for none, AMBIGUOUS_FLOW (naming some) for several.
    """
    found = await find_flows(journal, wanted)
    if len(found) > 1:
        some = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        raise FlowNotFound(
            CliError.AMBIGUOUS_FLOW, f"{wanted} fits {len(found)} flows ({some}): say more"
        )
    if not found:
        raise FlowNotFound(CliError.UNKNOWN_FLOW, f"no flow {wanted}")
    return found[0]


def _table() -> Any:
    from rich import box
    from rich.table import Table

    # One space between columns: at 80 columns every one counts.
    # The box's blank separator alone between columns: at 80 columns every one counts.
    return Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=0)


def print_rows(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """Print ``rows`` as a table under ``columns`` (a column named with a leading ``>`` is
    right-aligned, with ``=`` never wrapped); cells are plain text, never markup."""
    from rich.text import Text

    table = _table()
    for column in columns:
        right = column.startswith(">")
        whole = column.lstrip(">").startswith("=")
        table.add_column(
            column.lstrip(">="),
            justify="right" if right else "left",
            no_wrap=whole,
            overflow="fold",  # never cut short: what is not shown cannot be pasted back
        )
    for row in rows:
        table.add_row(*(Text(visible(cell)) for cell in row))
    _console().print(table)


def print_table(flows: Sequence[FlowState], now: int, among: Iterable[str] = ()) -> None:
    """Print ``flows`` as a table, each DFID by its short id (unique among ``among`` too)."""
    from rich.text import Text

    console = _console()
    table = _table()
    table.add_column("DFID", no_wrap=True)
    table.add_column("STATUS", no_wrap=True)
    # Ids and kinds whole where they fit: the reason (the kernel's word) wraps first.
    table.add_column("AGENT", no_wrap=True, overflow="fold")
    table.add_column("KIND", no_wrap=True, overflow="fold")
    table.add_column("TRIES", justify="right")
    table.add_column("AGE", justify="right", no_wrap=True)
    table.add_column("REASON", overflow="fold")
    short = short_ids((f.dfid for f in flows), among)
    colours = {
        FlowStatus.ABORTED: "red",
        FlowStatus.COMPENSATED: "red",
        FlowStatus.ESCALATED: "yellow",
        FlowStatus.CLOSED: "green",
    }
    for flow in flows:
        status = str(flow.status)
        reason = str(flow.reason_code or "") + ("  NEEDS_REVIEW" if flow.needs_review else "")
        # Recorded text as Text (never markup), shown through visible(); only the status
        # (the kernel's own word) is coloured.
        table.add_row(
            Text(visible(short[flow.dfid])),
            f"[{colours[flow.status]}]{status}[/]" if flow.status in colours else status,
            Text(visible(flow.agent_id or "")),
            Text(visible(flow.proposal.kind if flow.proposal else "")),
            str(flow.attempts),
            age(now - flow.created_ts),
            Text(visible(reason)),
        )
    console.print(table)


def flows_matching(dfids: Iterable[str], wanted: str) -> list[str]:
    """Return the DFIDs ``wanted`` names: a prefix of the DFID, with or without its
    dashes, or of its trace id (32 hex digits, as a trace viewer shows it); any case."""
    text = wanted.strip().lower()
    bare = text.replace("-", "")
    if not bare:
        return []
    return [
        dfid
        for dfid in dfids
        if dfid.lower().startswith(text)
        or dfid.replace("-", "").lower().startswith(bare)
        or f"{trace_id_for(dfid):032x}".startswith(bare)
    ]


def principal_lines(events: Sequence[Event]) -> list[str]:
    """Whom a flow acts for, as ``dirk show`` prints it: tenant, user, tier, chain.

    A flow recorded before principals were (its ``FlowCreated`` has no ``on_behalf``)
    says so rather than showing anyone.
    """
    created = next((e.payload for e in events if isinstance(e.payload, FlowCreated)), None)
    behalf = created.on_behalf if created is not None else None
    if behalf is None:
        return ["  on behalf of: no principal recorded"]
    who = behalf.principal
    user = f"{who.user} <{who.email}>" if who.email else who.user
    chain = " -> ".join(behalf.chain) if behalf.chain else "-"
    lines = [
        f"  on behalf of: {user}, tenant {who.tenant} (vouched by {who.vouched_by})",
        f"  tier {behalf.tier}, chain {chain}"
        + (f", delegation {behalf.delegation}" if behalf.delegation else ""),
    ]
    if who.scopes is not None:
        lines.append(f"  scopes claimed: {' '.join(who.scopes) or '(none)'}")
    return lines
