"""``dirk operator``: who may sign inbox requests: add a principal's key, revoke it, list them.

``dirk operator add NAME`` makes an Ed25519 key pair, writes the private key to a file
only its owner may read (mode 0600) and adds the public half to the kernel's keyring
(``--keyring`` or ``DIRK_KEYRING``; kernel.inbox.keyring), a file outside the journal:
the root of trust of the inbox, which no writer of the journal can change. The running
kernel reads the keyring again when it changes, and records the key the first time it
takes a request signed with it (OperatorKeyTrusted). ``revoke`` takes a line out; the
kernel records the key revoked (OperatorKeyRevoked) and never trusts it again on that
journal. Roles: ``operator`` (acts as itself: ``dirk decide --key``), ``door`` (the
console or an MCP server, acting for the operators it signs in), ``agent`` (proposes
through the inbox as itself: ``dirk mcp --agent``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from kernel.cli._operator import error
from kernel.core import events as ev
from kernel.core.keys import KeyUnusable, fingerprint, public_text, write_private_key
from kernel.core.reasons import CliError, ExitCode
from kernel.inbox.client import KEY_ENV
from kernel.inbox.keyring import (
    ENV,
    ROLES,
    KeyringError,
    Principal,
    add_principal,
    read_keyring,
    remove_principal,
    valid_name,
)
from kernel.journal.opening import open_journal


def add_commands(commands: Any) -> None:
    """Add ``operator`` and its subcommands to ``dirk``'s subparsers."""
    operator = commands.add_parser(
        "operator", help="who may sign inbox requests: add, revoke, list (the keyring)"
    )
    verbs = operator.add_subparsers(dest="operator_command", required=True, metavar="COMMAND")

    add = verbs.add_parser("add", help="make NAME's key pair and add its public half")
    add.add_argument("name", metavar="NAME", help="the operator (or door, or agent) it names")
    add.add_argument(
        "--role", choices=ROLES, default="operator", help="what the key may sign (default operator)"
    )
    add.add_argument(
        "--key-out",
        metavar="FILE",
        help=f"where the private key goes (default: NAME.key in ${KEY_ENV} if it is a"
        " directory, else in the current one); never overwritten",
    )
    _common(add)
    add.set_defaults(run=_add)

    revoke = verbs.add_parser("revoke", help="take NAME's key out of the keyring, for good")
    revoke.add_argument("name", metavar="NAME", help="the principal whose key goes")
    _common(revoke)
    revoke.set_defaults(run=_revoke)

    listing = verbs.add_parser(
        "list", help="the keyring; with --db, what the journal recorded of each key"
    )
    listing.add_argument("--json", action="store_true", help="one JSON object per key")
    _common(listing)
    listing.set_defaults(run=_list)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keyring", metavar="FILE", help=f"the keyring (default: ${ENV})")
    parser.add_argument("--db", help="the journal (list: what it recorded of each key)")


def _keyring_path(args: argparse.Namespace) -> str | None:
    return args.keyring or os.environ.get(ENV) or None


async def _add(args: argparse.Namespace) -> int:
    return _add_key(args)


def _add_key(args: argparse.Namespace) -> int:
    path = _keyring_path(args)
    if path is None:
        return error(CliError.BAD_ARGUMENT, f"name the keyring: --keyring FILE or ${ENV}")
    if not valid_name(args.name):
        return error(
            CliError.BAD_ARGUMENT,
            "a name is 1 to 256 printable characters, no blanks, not starting with #",
            ExitCode.USAGE,
        )
    if os.path.exists(path):
        try:
            if args.name in read_keyring(path):
                return error(
                    CliError.BAD_ARGUMENT, f"the keyring already names {args.name!r}: revoke it"
                )
        except KeyringError as exc:
            return error(CliError.BAD_ARGUMENT, str(exc), ExitCode.USAGE)
    out = Path(args.key_out) if args.key_out else _default_key_file(args.name)
    try:
        key = write_private_key(out)
    except KeyUnusable as exc:
        return error(CliError.BAD_ARGUMENT, str(exc), ExitCode.USAGE)
    except OSError as exc:
        return error(CliError.BAD_ARGUMENT, f"{out}: {exc.strerror or exc}", ExitCode.USAGE)
    public = public_text(key)
    try:
        add_principal(path, Principal(name=args.name, role=args.role, key=public))
    except (KeyringError, OSError) as exc:
        out.unlink(missing_ok=True)  # a key nobody trusts is no use
        return error(CliError.BAD_ARGUMENT, str(exc), ExitCode.USAGE)
    print(f"{args.name} ({args.role}) key {fingerprint(public)} added to {path}")
    print(f"private key: {out} (mode 600; keep it, it is shown nowhere else)", file=sys.stderr)
    return ExitCode.OK


def _default_key_file(name: str) -> Path:
    where = os.environ.get(KEY_ENV)
    folder = Path(where) if where and Path(where).is_dir() else Path()
    return folder / f"{name}.key"


async def _revoke(args: argparse.Namespace) -> int:
    return _revoke_key(args)


def _revoke_key(args: argparse.Namespace) -> int:
    path = _keyring_path(args)
    if path is None:
        return error(CliError.BAD_ARGUMENT, f"name the keyring: --keyring FILE or ${ENV}")
    try:
        gone = remove_principal(path, args.name)
    except KeyringError as exc:
        return error(CliError.BAD_ARGUMENT, str(exc))
    print(f"{gone.name} ({gone.role}) key {gone.fingerprint} revoked in {path}")
    return ExitCode.OK


async def _list(args: argparse.Namespace) -> int:
    path = _keyring_path(args)
    keyring = {}
    if path is not None:
        try:
            keyring = dict(read_keyring(path))
        except KeyringError as exc:
            return error(CliError.BAD_ARGUMENT, str(exc), ExitCode.USAGE)
    recorded: dict[str, str] = {}
    if args.db:
        async with open_journal(args.db, readonly=True) as journal:
            found = await journal.read(types=["OperatorKeyTrusted", "OperatorKeyRevoked"])
        for event in found:
            payload = event.payload
            if isinstance(payload, ev.OperatorKeyTrusted):
                recorded[payload.fingerprint] = f"trusted since #{event.seq}"
            elif isinstance(payload, ev.OperatorKeyRevoked):
                recorded[payload.fingerprint] = f"revoked at #{event.seq}"
    rows = [
        {
            "name": p.name,
            "role": p.role,
            "fingerprint": p.fingerprint,
            "key": p.key,
            "journal": recorded.get(p.fingerprint, "not used yet" if args.db else ""),
        }
        for p in keyring.values()
    ]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return ExitCode.OK
    for row in rows:
        print(f"{row['name']}  {row['role']}  {row['fingerprint']}  {row['journal']}".rstrip())
    print(f"{len(rows)} keys in {path or '(no keyring)'}")
    return ExitCode.OK
