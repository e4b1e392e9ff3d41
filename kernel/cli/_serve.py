"""``dirk serve``: run a kernel on an existing journal, with its console, until interrupted.

The examples (and any embedding) run a kernel for as long as their code runs;
a journal they leave with escalations waiting needs a kernel again for the
decisions to be applied. ``dirk serve`` is that kernel: it opens the journal
with the packs and adapters it is told (``--example trading`` takes the
example's own packs and simulated systems, beside the journal), reads the
operator inbox (so a decision from the console, ``dirk decide`` or an MCP host
is applied once, on record), serves the console in the same process, and
optionally the MCP server over HTTP.

Time: a journal written on a simulated clock (the examples' March 2024 day)
keeps that clock when served. The kernel's clock continues from the journal's
last recorded time and advances with the machine's from there (``--clock
journal``, the default), so an escalation that waited 46 simulated minutes does
not expire because the wall clock is two years later; ``--clock wall`` serves
on the machine's clock (a kernel whose journal was written in real time and
should catch up with it). The console's ages and deadlines are on the same clock.

Without a keyring (``--keyring``, ``DIRK_KEYRING``) the run makes its own, in a
private temporary directory that ends with it: one ``door`` key for the console
(and one for the MCP server), so whoever holds the printed sign-in link decides,
signed and recorded as the console's. With a keyring, the console signs with its
key there (``--key``, ``DIRK_KEY``), exactly as ``dirk console`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from kernel.audit.reverify import PackPathError
from kernel.cli._mcp import currency_of
from kernel.cli._operator import counted, error
from kernel.cli._replay import packs_from
from kernel.console._command import Prepared, add_options, prepare, server_for
from kernel.core.hosts import is_loopback
from kernel.core.keys import public_text, write_private_key
from kernel.core.reasons import CliError, ExitCode, ReasonCode
from kernel.core.text import id_problem
from kernel.inbox.keyring import ENV as KEYRING_ENV
from kernel.inbox.keyring import KeyringError, Principal, add_principal, read_keyring
from kernel.journal.errors import is_postgres, redact
from kernel.journal.opening import open_journal
from kernel.policy.packs import PackError, PolicyPack

EXAMPLES = ("trading", "booking")
"""The examples ``--example`` serves: each module's ``serving(files)`` names its parts."""


class ContinuedClock:
    """The journal's clock, continued: its last recorded time, then the machine's pace.

    ``now_ns()`` is ``start_ns`` plus the monotonic time since this clock was made, so
    it never runs backwards and a simulated day's journal goes on from where it
    stopped. Sleeping is real sleeping: a served kernel waits as long as a person does.
    """

    def __init__(self, start_ns: int, monotonic_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self.start_ns = start_ns
        self._monotonic_ns = monotonic_ns
        self._origin = monotonic_ns()

    def now_ns(self) -> int:
        return self.start_ns + (self._monotonic_ns() - self._origin)

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


def add_commands(commands: Any) -> None:
    """Add ``serve`` to ``dirk``'s subparsers."""
    p = commands.add_parser(
        "serve",
        help="run a kernel on an existing journal, with its console (extra dir-kernel[console])",
        description=(
            "Run a kernel on an existing journal with the packs and adapters named here,"
            " apply the operator inbox's decisions, and serve the console (and with --mcp the"
            " MCP server) until interrupted. Example: python -m examples.trading --operator"
            " none --db desk.db; dirk serve --example trading --db desk.db"
        ),
    )
    p.add_argument("--db", required=True, help="the journal: a file, or a postgresql:// URL")
    p.add_argument(
        "--example",
        choices=EXAMPLES,
        help="the example that wrote the journal: its packs, agents and simulated systems"
        " (their ledgers beside the journal, as the example left them)",
    )
    p.add_argument(
        "--pack",
        action="append",
        default=[],
        metavar="PATH",
        help="a policy pack: FILE.py[:ATTR] or MODULE[:ATTR] (repeatable; packs with built-in"
        " adapters only, unless --example brings the adapters)",
    )
    p.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="AGENT_ID",
        help="an agent allowed to register (repeatable; --example allows its own)",
    )
    p.add_argument(
        "--files",
        metavar="PATH",
        help="with --example on a postgresql:// journal: the file beside which the simulated"
        " systems keep their ledgers (default: the journal file itself)",
    )
    p.add_argument(
        "--clock",
        choices=("journal", "wall"),
        default="journal",
        help="journal (default): continue from the journal's last recorded time at the"
        " machine's pace, so a simulated day keeps its time; wall: the machine's clock",
    )
    p.add_argument(
        "--keyring",
        metavar="FILE",
        help=f"the operator keyring (default ${KEYRING_ENV}); without one, this run makes its"
        " own, trusting only its console's (and MCP server's) key",
    )
    p.add_argument(
        "--inbox-poll",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="how often the kernel reads the operator inbox (default 0.5)",
    )
    p.add_argument(
        "--no-console", action="store_true", help="run the kernel only (decide with dirk decide)"
    )
    p.add_argument(
        "--mcp",
        metavar="HOST:PORT",
        help=(
            "also serve MCP over streamable HTTP on HOST:PORT, on this kernel"
            " (extra dir-kernel[mcp])"
        ),
    )
    p.add_argument(
        "--mcp-token-file",
        metavar="FILE",
        help="with --mcp: bearer tokens, one 'agent:ID TOKEN' or 'operator:NAME TOKEN' a line",
    )
    p.add_argument(
        "--mcp-operator",
        metavar="NAME",
        help="with --mcp on loopback and no tokens: calls act as this operator",
    )
    p.add_argument(
        "--mcp-currency",
        metavar="CODE",
        help="with --mcp: the currency whose minor units reasons quote, shown as such in each"
        " answer's summary (default USD; none: as recorded), as dirk mcp --currency",
    )
    add_options(p)
    p.set_defaults(run=run)


async def run(args: argparse.Namespace) -> int:
    """Run ``dirk serve`` until interrupted; return its exit status."""
    refused = _flags_refused(args)
    if refused is not None:
        return refused
    try:
        extra = packs_from(args.pack) if args.pack else []
    except PackPathError as exc:
        return error(CliError.BAD_PACK_PATH, str(exc), ExitCode.USAGE)
    start_ns = await _start_ns(args.db)
    keyring = args.keyring or os.environ.get(KEYRING_ENV) or None
    problem = _untrusted(keyring, args)
    if problem is not None:
        return problem
    with _own_keys(keyring, args) as (keyring_path, key):
        prepared = None if args.no_console else _console(args, key)
        if isinstance(prepared, int):
            return prepared
        try:
            return await _serve_parts(args, extra, keyring_path, start_ns, prepared)
        finally:
            if prepared is not None:
                prepared.sock.close()


async def _serve_parts(
    args: argparse.Namespace,
    extra: list[PolicyPack],
    keyring_path: str | None,
    start_ns: int,
    prepared: Prepared | None,
) -> int:
    """Serve the kernel with its packs, adapters and agents; a bad pack or example is refused."""
    try:
        async with _parts(args, extra) as (packs, adapters, allow, bind):
            return await _serve(
                args, packs, adapters, allow, bind, keyring_path, start_ns, prepared
            )
    except PackError as exc:
        return error(CliError.BAD_ARGUMENT, str(exc), ExitCode.USAGE)
    except ExampleMissing as exc:
        return error(CliError.BAD_ARGUMENT, str(exc), ExitCode.USAGE)


def _untrusted(keyring: str | None, args: argparse.Namespace) -> int | None:
    """The exit code of a given keyring that does not trust what this run needs, or None."""
    if keyring is None:
        return None
    return _trusted(keyring, None if args.no_console else args.door)


async def _start_ns(db: str) -> int:
    """When the served journal last recorded, or now for an empty one."""
    # A file that is no journal fails here, as one line with its code (dirk's main prints it).
    async with open_journal(db, readonly=True) as journal:
        last = await journal.read(journal.head_seq, limit=1) if journal.head_seq else []
    return last[-1].ts if last else time.time_ns()


def _console(args: argparse.Namespace, key: str | None) -> Prepared | int:
    """The console prepared to serve beside the kernel (with the served operator key, if any)."""
    return prepare(args, key=key) if key is not None else prepare(args)


def _flags_refused(args: argparse.Namespace) -> int | None:
    """The exit code of flags ``dirk serve`` cannot run with, or None."""
    for agent_id in args.allow:
        problem = id_problem(agent_id)
        if problem is not None:
            return error(ReasonCode.SCHEMA_INVALID, f"--allow: {problem}", ExitCode.USAGE)
    if args.files and not args.example:
        return error(CliError.BAD_ARGUMENT, "--files goes with --example", ExitCode.USAGE)
    if not 0.05 <= args.inbox_poll <= 60:
        return error(CliError.BAD_ARGUMENT, "--inbox-poll takes 0.05 to 60 seconds", ExitCode.USAGE)
    return _mcp_refused(args)


def _mcp_refused(args: argparse.Namespace) -> int | None:
    """The exit code of ``--mcp`` flags that do not go together, or None."""
    if args.mcp is None:
        return _mcp_options_alone(args)
    host, sep, port = args.mcp.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        return error(CliError.BAD_ARGUMENT, "--mcp takes HOST:PORT", ExitCode.USAGE)
    if not args.mcp_token_file and not (args.mcp_operator and is_loopback(host.strip("[]"))):
        return error(
            CliError.BAD_ARGUMENT,
            "--mcp needs --mcp-token-file (or, on loopback, --mcp-operator NAME)",
            ExitCode.USAGE,
        )
    if args.mcp_currency is not None and currency_of(args.mcp_currency) is None:
        shown = args.mcp_currency[:20]
        return error(
            CliError.BAD_ARGUMENT,
            f"--mcp-currency takes a currency code (USD, EUR) or none, not {shown!r}",
            ExitCode.USAGE,
        )
    return None


def _mcp_options_alone(args: argparse.Namespace) -> int | None:
    """The exit code of an ``--mcp-*`` option without ``--mcp``, or None."""
    if args.mcp_token_file or args.mcp_operator or args.mcp_currency is not None:
        return error(
            CliError.BAD_ARGUMENT,
            "--mcp-token-file, --mcp-operator and --mcp-currency go with --mcp",
            ExitCode.USAGE,
        )
    return None


class ExampleMissing(Exception):
    """``--example`` names an example this installation does not have."""


Bind = Callable[[Any], None]


@asynccontextmanager
async def _parts(
    args: argparse.Namespace, extra: list[PolicyPack]
) -> AsyncIterator[tuple[list[PolicyPack], dict[str, Any], list[str], Bind]]:
    """The packs, adapters, allowed agents and post-open hook the kernel is served with."""
    if not args.example:
        packs = extra or packs_from([])
        yield packs, {}, list(args.allow), lambda kernel: None
        return
    try:
        module = importlib.import_module(f"examples.{args.example}")
    except ImportError as exc:
        raise ExampleMissing(f"the example {args.example} is not installed here ({exc})") from exc
    if is_postgres(args.db) and not args.files:
        raise ExampleMissing(
            "a postgresql:// journal keeps no files: name the simulated systems' with --files"
        )
    files = Path(args.files or args.db)
    served = module.serving(files)
    try:
        names = {pack.name for pack in served.packs}
        packs = [*served.packs, *(pack for pack in extra if pack.name not in names)]
        allow = sorted({*served.allow, *args.allow})
        yield packs, dict(served.adapters), allow, served.bind
    finally:
        served.close()


def _trusted(keyring: str, door: str | None) -> int | None:
    """Say whom ``keyring`` trusts, on stderr; the exit code if it cannot be served with."""
    try:
        principals = read_keyring(keyring)
    except KeyringError as exc:
        return error(CliError.BAD_ARGUMENT, str(exc), ExitCode.USAGE)
    if door is not None and (door not in principals or principals[door].role != "door"):
        return error(
            CliError.BAD_ARGUMENT,
            f"keyring {keyring} names no door {door!r} for the console to sign with:"
            f" dirk operator add {door} --role door (or --no-console)",
            ExitCode.USAGE,
        )
    shown = ", ".join(_principal_text(p) for p in principals.values()) or "nobody"
    print(f"trusting {counted(len(principals), 'key')} of {keyring}: {shown}", flush=True)
    return None


def _principal_text(principal: Principal) -> str:
    """One keyring line as a person reads it: ``ana (operator: risk, desk-head)``."""
    roles = f": {', '.join(principal.roles)}" if principal.roles else ""
    return f"{principal.name} ({principal.role}{roles})"


@contextlib.contextmanager
def _own_keys(
    keyring: str | None, args: argparse.Namespace
) -> Iterator[tuple[str | None, str | None]]:
    """This run's keyring and door keys, when no keyring is given; removed when it ends."""
    if keyring is not None:
        yield keyring, None
        return
    with tempfile.TemporaryDirectory(prefix="dirk-serve-") as folder:
        own = Path(folder) / "keyring"
        # The MCP server acts on this kernel in process: only the console signs.
        key = write_private_key(Path(folder) / f"{args.door}.key")
        add_principal(own, Principal(name=args.door, role="door", key=public_text(key)))
        print(
            "no keyring given: this run trusts only its own console's key (made for it, gone"
            " when it stops); give --keyring for the operators' own keys",
            file=sys.stderr,
            flush=True,
        )
        yield str(own), folder


async def _serve(
    args: argparse.Namespace,
    packs: list[PolicyPack],
    adapters: dict[str, Any],
    allow: list[str],
    bind: Bind,
    keyring: str | None,
    start_ns: int,
    prepared: Any,
) -> int:
    mcp_sock = None
    if args.mcp:
        # Bound before the kernel opens: a port in use is one line, not a stopped kernel.
        try:
            mcp_sock = _bound(args.mcp)
        except OSError as exc:
            return error(CliError.BAD_ARGUMENT, f"--mcp {args.mcp}: {exc.strerror}", ExitCode.USAGE)
    with contextlib.closing(mcp_sock) if mcp_sock is not None else contextlib.nullcontext():
        return await _run_kernel(
            args, packs, adapters, allow, bind, keyring, start_ns, prepared, mcp_sock
        )


async def _run_kernel(
    args: argparse.Namespace,
    packs: list[PolicyPack],
    adapters: dict[str, Any],
    allow: list[str],
    bind: Bind,
    keyring: str | None,
    start_ns: int,
    prepared: Any,
    mcp_sock: socket.socket | None,
) -> int:
    from kernel.boot import open_kernel
    from kernel.config import KernelConfig, Ports, Supervision
    from kernel.core.events import Principal
    from kernel.core.ports import SystemClock

    clock = ContinuedClock(start_ns) if args.clock == "journal" else SystemClock()
    config = KernelConfig(
        # `dirk serve` hosts the examples' desks for the one person running it, as the
        # examples do: their flows act for one local user (docs/identity.md).
        principal=Principal(tenant="local", user="you"),
        ports=Ports(clock=clock),
        supervision=Supervision(inbox_poll_s=args.inbox_poll),
        keyring=keyring,
    )
    async with open_kernel(
        args.db, packs=packs, adapters=adapters, allow=allow, config=config
    ) as kernel:
        bind(kernel)
        names = ", ".join(pack.name for pack in packs)
        waiting = len(kernel.projections.waiting)
        print(
            f"dirk serve: kernel on {redact(args.db)} (packs {names}; clock {args.clock});"
            f" {counted(waiting, 'flow')} {'waits' if waiting == 1 else 'wait'} for a human."
            " Ctrl-C stops it.",
            flush=True,
        )
        console = None
        if prepared is not None:
            console = server_for(prepared, now_ns=clock.now_ns, signals=False)
        async with anyio.create_task_group() as tg:
            if console is not None:
                tg.start_soon(console.serve, [prepared.sock])
            mcp = anyio.CancelScope()
            if mcp_sock is not None:
                tg.start_soon(_mcp, kernel, args, mcp_sock, mcp)
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    break
            mcp.cancel()
            if console is not None:
                console.should_exit = True  # it closes its connections, then returns
            # Past this a connection that would not close is cut: the kernel stops regardless.
            tg.cancel_scope.deadline = anyio.current_time() + 5
    print("dirk serve: stopped", file=sys.stderr, flush=True)
    return ExitCode.OK


def _bound(address: str) -> socket.socket:
    """A listening socket on ``address`` (``HOST:PORT``; port 0: a free one)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


async def _mcp(
    kernel: Any, args: argparse.Namespace, sock: socket.socket, scope: anyio.CancelScope
) -> None:
    """Serve MCP over HTTP on this kernel (``dirk mcp --kernel --http``, in this process)."""
    from kernel.cli._mcp import serve
    from kernel.cli._serving import Web, url_of
    from kernel.mcp import Embedded, Identity, Principal
    from kernel.mcp._http import read_tokens

    host = args.mcp.rpartition(":")[0].strip("[]")
    tokens = read_tokens(args.mcp_token_file) if args.mcp_token_file else {}
    default = None
    if args.mcp_operator and not tokens:
        default = Principal(role="operator", name=args.mcp_operator)
    identity = Identity(default, tokens)
    url = url_of("http", host, sock.getsockname()[1])
    with scope:
        currency = currency_of(args.mcp_currency or "USD") or "USD"  # checked before the kernel
        await serve(Embedded(kernel), identity, Web(sock, host, url, None, tokens), currency)
