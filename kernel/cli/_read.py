"""What ``dirk``'s reading commands share: finding a flow by any id it goes by, filtering
flows, and printing them as a table (``rich``) with ages on the journal's clock."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

import msgspec

from kernel.core.flow import FlowState, FlowStatus
from kernel.core.wall import visible
from kernel.telemetry import trace_id_for

__all__ = [
    "age",
    "flows_matching",
    "iso_time",
    "json_text",
    "positive",
    "print_json",
    "print_rows",
    "print_table",
    "say",
    "select_flows",
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


def _console() -> Any:
    from rich.console import Console

    # A pipe gets whole lines (no wrapping, no colour); a terminal gets its width.
    class _Console(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError  # main() ends quietly with CLOSED_PIPE, as for print()

    width = None if sys.stdout.isatty() else 1000
    return _Console(highlight=False, soft_wrap=False, width=width)


def _table() -> Any:
    from rich import box
    from rich.table import Table

    return Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)


def print_rows(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """Print ``rows`` as a table under ``columns`` (a column named with a leading ``>`` is
    right-aligned); cells are plain text, never markup."""
    from rich.text import Text

    table = _table()
    for column in columns:
        right = column.startswith(">")
        table.add_column(column.lstrip(">"), justify="right" if right else "left")
    for row in rows:
        table.add_row(*(Text(visible(cell)) for cell in row))
    _console().print(table)


def print_table(flows: Sequence[FlowState], now: int) -> None:
    from rich.text import Text

    console = _console()
    table = _table()
    table.add_column("DFID", no_wrap=True)
    table.add_column("STATUS", no_wrap=True)
    table.add_column("AGENT", overflow="ellipsis")
    table.add_column("KIND", overflow="ellipsis")
    table.add_column("TRIES", justify="right")
    table.add_column("AGE", justify="right", no_wrap=True)
    table.add_column("REASON")
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
            Text(visible(flow.dfid)),
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
