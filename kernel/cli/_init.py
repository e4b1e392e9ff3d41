"""``dirk init``: create a journal, so a command that opens one has one to open.

Every other command refuses a ``--db`` that is not there (a typo must not become
an empty journal). ``dirk init --db PATH`` is the one door that creates it: a
new SQLite journal (its schema, no events); a journal already there is left as it
is and said so.
"""

from __future__ import annotations

import argparse
from typing import Any

import anyio

from kernel.cli._read import say
from kernel.core.reasons import ExitCode
from kernel.journal.opening import open_journal


def add_commands(commands: Any) -> None:
    """Add ``init`` to the ``dirk`` parser's subcommands."""
    init = commands.add_parser("init", help="create an empty journal at --db (if none is there)")
    # Not ``dest="db"``: every other command refuses a --db that does not exist yet.
    init.add_argument("--db", dest="new_db", required=True, help="the journal file to create")
    init.set_defaults(run=_init)


async def _init(args: argparse.Namespace) -> int:
    path = args.new_db
    existed = await anyio.Path(path).exists()
    async with open_journal(path) as journal:  # opening creates; an existing one is checked
        events = await journal.read(limit=1)
    if existed:
        say(f"{path} is a journal already ({'with' if events else 'without'} events): unchanged")
    else:
        say(f"created the journal {path}")
    return ExitCode.OK
