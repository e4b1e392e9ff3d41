"""``dirk operator``: who may sign inbox requests: add a principal's key, revoke it, list them.

``dirk operator add NAME`` makes an Ed25519 key pair, writes the private key to a file
only its owner may read (mode 0600) and adds the public half to the kernel's keyring
(``--keyring`` or ``DIRK_KEYRING``; kernel.inbox.keyring), a file outside the journal:
the root of trust of the inbox, which no writer of the journal can change. The running
kernel reads the keyring again when it changes, and records the key the first time it
takes a request signed with it (OperatorKeyTrusted). ``revoke`` takes a line out; the
kernel records the key revoked (OperatorKeyRevoked) and never trusts it again on that
journal. What a key may sign (``--role``): ``operator`` (acts as itself: ``dirk decide
--key``), ``door`` (the console or an MCP server, acting for the operators it signs in),
``agent`` (proposes through the inbox as itself: ``dirk mcp --agent``). Any other
``--role`` is an operator's role, as a pack's quorum names it (``--role risk --role
desk-head``): a quorum counts votes by them (kernel.policy.quorums).

The folders are made when missing (the key's mode 700, ``DIRK_KEY=~/.dirk`` on a fresh
machine), or the command says why not; a command that fails leaves no key, folder or
keyring behind.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernel.cli._operator import counted, error
from kernel.core import events as ev
from kernel.core.keys import KeyUnusable, fingerprint, public_text, write_private_key
from kernel.core.reasons import CliError, ExitCode
from kernel.inbox.client import KEY_ENV
from kernel.inbox.keyring import (
    ENV,
    ROLE_NAME,
    ROLES,
    KeyringError,
    Principal,
    Role,
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
        "--role",
        action="append",
        default=[],
        metavar="ROLE",
        help="what the key may sign: operator (the default), door or agent; or an operator's"
        " role as a pack's quorum names it (risk, desk-head); repeatable",
    )
    add.add_argument(
        "--key-out",
        metavar="FILE",
        help=f"where the private key goes (default: NAME.key in the folder ${KEY_ENV} names,"
        " made mode 700 if missing; without it, the current one); never overwritten",
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
    role, roles, problem = _roles(args.role)
    if problem is not None:
        return error(CliError.BAD_ARGUMENT, problem, ExitCode.USAGE)
    if os.path.exists(path):
        try:
            if args.name in read_keyring(path):
                return error(
                    CliError.BAD_ARGUMENT, f"the keyring already names {args.name!r}: revoke it"
                )
        except KeyringError as exc:
            return error(CliError.BAD_ARGUMENT, str(exc), ExitCode.USAGE)
    out, problem = (Path(args.key_out), None) if args.key_out else _default_key_file(args.name)
    if problem is not None:
        return error(CliError.BAD_ARGUMENT, problem, ExitCode.USAGE)
    made: list[Path] = []
    try:
        made += make_folders(out.parent, 0o700)  # first: a folder both share is the key's
        made += make_folders(Path(path).parent, 0o755)
        key = write_private_key(out)
    except (KeyUnusable, OSError) as exc:
        _unmake(made)
        return error(CliError.BAD_ARGUMENT, _why(exc), ExitCode.USAGE)
    public = public_text(key)
    try:
        add_principal(path, Principal(name=args.name, role=role, key=public, roles=roles))
    except (KeyringError, OSError) as exc:
        out.unlink(missing_ok=True)  # a key nobody trusts is no use
        _unmake(made)
        return error(CliError.BAD_ARGUMENT, _why(exc), ExitCode.USAGE)
    held = f", roles {', '.join(roles)}" if roles else ""
    print(f"{args.name} ({role}{held}) key {fingerprint(public)} added to {path}")
    print(f"private key: {out} (mode 600; keep it, it is shown nowhere else)", file=sys.stderr)
    return ExitCode.OK


def _roles(given: list[str]) -> tuple[Role, tuple[str, ...], str | None]:
    """What ``--role`` says: the key's role, an operator's quorum roles, or why it cannot."""
    kinds = [r for r in given if r in ROLES]
    roles = tuple(dict.fromkeys(r for r in given if r not in ROLES))
    role: Role = kinds[0] if kinds else "operator"
    return role, roles, _roles_problem(kinds, roles, role)


def _roles_problem(kinds: Sequence[str], roles: tuple[str, ...], role: Role) -> str | None:
    if len(set(kinds)) > 1:
        return f"a key is one of {', '.join(ROLES)}, not {' and '.join(kinds)}"
    bad = [r for r in roles if not ROLE_NAME.match(r)]
    if bad:
        return (
            f"role {bad[0][:64]!r}: a role is a letter or digit, then up to 63 of"
            " letters, digits, '_', '.', '-' (as a pack's quorum names it: risk, desk-head)"
        )
    if roles and role != "operator":
        return f"only an operator holds roles ({', '.join(roles)}), not a {role}"
    return None


def _default_key_file(name: str) -> tuple[Path, str | None]:
    """Where NAME's key goes without ``--key-out``, or why ``DIRK_KEY`` cannot say."""
    where = os.environ.get(KEY_ENV)
    if not where:
        return Path(f"{name}.key"), None
    folder = Path(where).expanduser()
    if folder.is_dir():
        return folder / f"{name}.key", None
    if folder.exists():
        return folder, (
            f"${KEY_ENV} names {folder}, which is no folder: give --key-out FILE, or point"
            f" ${KEY_ENV} at a folder for NAME.key files"
        )
    return folder / f"{name}.key", None


def make_folders(folder: Path, mode: int) -> list[Path]:
    """Make ``folder`` and its missing parents (``mode``); return those made, outermost first.

    Raises:
        OSError: one cannot be made (what was made is taken back).
    """
    missing: list[Path] = []
    for step in [folder, *folder.parents]:
        if step.exists():
            break
        missing.insert(0, step)
    made: list[Path] = []
    try:
        for step in missing:
            step.mkdir(mode)
            made.append(step)
    except OSError:
        _unmake(made)
        raise
    return made


def _unmake(made: list[Path]) -> None:
    """Take back the folders ``make_folders`` made (innermost first), if still empty."""
    for step in reversed(made):
        try:
            step.rmdir()
        except OSError:
            return


def _why(exc: Exception) -> str:
    """An error's words: an OSError's file and reason, else its message."""
    if isinstance(exc, OSError) and not isinstance(exc, KeyringError):
        return f"{exc.filename}: {exc.strerror}" if exc.filename else f"{exc.strerror or exc}"
    return str(exc)


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


async def _keys_recorded(db: str) -> dict[str, str]:
    """What the journal recorded of each key, by fingerprint (trusted since, revoked at)."""
    recorded: dict[str, str] = {}
    async with open_journal(db, readonly=True) as journal:
        found = await journal.read(types=["OperatorKeyTrusted", "OperatorKeyRevoked"])
    for event in found:
        payload = event.payload
        if isinstance(payload, ev.OperatorKeyTrusted):
            recorded[payload.fingerprint] = f"trusted since #{event.seq}"
        elif isinstance(payload, ev.OperatorKeyRevoked):
            recorded[payload.fingerprint] = f"revoked at #{event.seq}"
    return recorded


async def _list(args: argparse.Namespace) -> int:
    path = _keyring_path(args)
    keyring = {}
    if path is not None:
        try:
            keyring = dict(read_keyring(path))
        except KeyringError as exc:
            return error(CliError.BAD_ARGUMENT, str(exc), ExitCode.USAGE)
    recorded = await _keys_recorded(args.db) if args.db else {}
    rows = [
        {
            "name": p.name,
            "role": p.role,
            "roles": list(p.roles),
            "fingerprint": p.fingerprint,
            "key": p.key,
            "journal": recorded.get(p.fingerprint, "not used yet" if args.db else ""),
        }
        for p in keyring.values()
    ]
    _print_keys(rows, args.json, path)
    return ExitCode.OK


def _print_keys(rows: list[dict[str, Any]], as_json: bool, path: Path | str | None) -> None:
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    for row in rows:
        held = ",".join(row["roles"]) or "-"
        print(
            f"{row['name']}  {row['role']}  {held}  {row['fingerprint']}  {row['journal']}".rstrip()
        )
    print(f"{counted(len(rows), 'key')} in {path or '(no keyring)'}")
