"""The journal's own command: ``dirk copy`` from one store to another, verified on arrival.

``dirk copy --from A --to B`` copies a journal, row for row, from a SQLite
file to a PostgreSQL database or back (or file to file), and verifies the copy
on arrival against the head the source verified to. Every command's ``--db``
(and ``copy``'s ``--from`` and ``--to``) takes a file or a ``postgresql://`` URL.
Put a server's password in ``PGPASSWORD`` or ``~/.pgpass``, not in
the URL: the URL is on the command line, where other users can see it.
"""

from __future__ import annotations

import argparse
from typing import Any

from kernel.cli._read import say
from kernel.core.reasons import ExitCode
from kernel.journal.copy import copy_journal
from kernel.journal.errors import JournalKeyError, chain_key_from, chain_key_from_env, redact
from kernel.journal.head import CHAIN_KEY_ENV


def add_commands(commands: Any) -> None:
    """Add ``copy`` to the ``dirk`` parser's subcommands."""
    copy = commands.add_parser(
        "copy", help="copy a journal to another store (SQLite or PostgreSQL), verified on arrival"
    )
    copy.add_argument(
        "--from", "--db", dest="source", required=True, help="the journal to copy (or DIRK_DB)"
    )
    copy.add_argument(
        "--to", dest="target", required=True, help="a new journal: a file or postgresql:// URL"
    )
    copy.add_argument(
        "--key-file",
        metavar="PATH",
        help=f"the chain key of a keyed journal, read from this file (default: ${CHAIN_KEY_ENV})",
    )
    copy.set_defaults(run=_copy)


async def _copy(args: argparse.Namespace) -> int:
    key = _key(args)
    report = await copy_journal(args.source, args.target, chain_key=key)
    say(
        f"copied {report.events} events of journal {report.journal_id} to {redact(args.target)};"
        f" verified: head {report.head}"
    )
    return ExitCode.OK


def _key(args: argparse.Namespace) -> bytes | None:
    if args.key_file is None:
        return chain_key_from_env(None, args.source)
    try:
        with open(args.key_file, "rb") as file:
            return chain_key_from(file.read().rstrip(b"\r\n"), args.source)
    except OSError as exc:
        raise JournalKeyError(args.source, f"the key file cannot be read ({exc.strerror})") from exc
