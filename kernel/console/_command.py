"""``dirk console``: serve the operator console for one journal, on 127.0.0.1 unless told.

A non-loopback address is refused unless named operators with passwords are
configured (``--operators``), and unless it is served over TLS (``--tls-cert``,
``--tls-key``) or the operator says ``--insecure-http``: passwords and session
cookies must not cross a network readable. Without operators, the console
prints a sign-in link with a token made for this run (as Jupyter does), and
whoever holds it names themselves when signing in.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel.console._auth import Gate, OperatorsFileError, add_operator, read_operators
from kernel.core.hosts import (
    TlsError,
    TlsFiles,
    insecure_http_warning,
    is_loopback,
    plain_http_refusal,
    tls_files,
)
from kernel.core.reasons import CliError, ExitCode, ReasonCode
from kernel.core.text import utf8_problem
from kernel.escalation import EscalationPolicy
from kernel.journal.errors import redact
from kernel.journal.opening import open_journal

DEFAULT_PORT = 8765
ANSWER_S = 3.0
"""How long a change waits for the kernel's answer, so a refusal shows at once."""
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")


def add_commands(commands: Any) -> None:
    """Add ``console`` to the ``dirk`` parser's subcommands."""
    console = commands.add_parser(
        "console", help="serve the operator console in a browser (extra dir-kernel[console])"
    )
    console.add_argument("--db", required=True, help="the journal: a file, or a postgresql:// URL")
    add_options(console)
    console.add_argument(
        "--add-operator",
        metavar="NAME",
        help="add NAME to --operators FILE with a password read from the terminal (or stdin)",
    )
    console.set_defaults(run=run)


def add_options(console: argparse.ArgumentParser) -> None:
    """Add the console's serving options (``dirk console`` and ``dirk serve`` share them)."""
    console.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    console.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0: any free port"
    )
    console.add_argument(
        "--operators",
        type=Path,
        metavar="FILE",
        help="named operators with hashed passwords (see --add-operator); required off loopback",
    )
    console.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="serve HTTPS with this certificate chain (PEM); needs --tls-key",
    )
    console.add_argument(
        "--tls-key", metavar="FILE", help="the certificate's private key (PEM, unencrypted)"
    )
    console.add_argument(
        "--insecure-http",
        action="store_true",
        help="serve plain HTTP off loopback anyway (passwords and cookies readable on the way)",
    )
    console.add_argument(
        "--poll",
        type=float,
        default=0.25,
        metavar="SECONDS",
        help="SQLite: how often to read the journal (PostgreSQL notifies instead)",
    )
    console.add_argument(
        "--approval-ttl",
        type=float,
        default=EscalationPolicy().approval_ttl_s,
        metavar="SECONDS",
        help="the kernel's approval TTL, to show each escalation's expiry (0: never expires)",
    )
    console.add_argument(
        "--trace-url",
        default="",
        metavar="TEMPLATE",
        help="a link to a flow's trace, e.g. http://localhost:16686/trace/{trace_id}",
    )
    console.add_argument(
        "--currency",
        default="USD",
        metavar="CODE",
        help="the currency whose minor units (cents) reasons quote, shown as such (default USD;"
        " none: amounts as recorded)",
    )
    console.add_argument(
        "--key",
        metavar="PATH",
        help="the console's private key, or a directory holding DOOR.key (default: $DIRK_KEY);"
        " it signs the signed-in operators' requests (dirk operator add console --role door)",
    )
    console.add_argument(
        "--door",
        default="console",
        metavar="NAME",
        help="the name the kernel's keyring holds the console's key under (default console)",
    )


def _error(code: CliError | ReasonCode, message: str, status: ExitCode = ExitCode.USAGE) -> int:
    print(f"error: {code}: {message}", file=sys.stderr)
    return status


@dataclass(frozen=True)
class Prepared:
    """A console ready to serve: its settings, its gate, and the socket it listens on."""

    settings: Any
    gate: Gate
    sock: socket.socket
    tls: TlsFiles | None
    host: str


async def run(args: argparse.Namespace) -> int:
    """Run ``dirk console`` until interrupted; return its exit status."""
    if args.add_operator:
        return _add_operator(args)
    # A file that is no journal fails here, as one line with its code (dirk's main prints it).
    async with open_journal(args.db, readonly=True):
        pass
    prepared = prepare(args)
    if isinstance(prepared, int):
        return prepared
    try:
        await serve(prepared)
    finally:
        prepared.sock.close()
    return ExitCode.OK


def prepare(args: argparse.Namespace, **overrides: Any) -> Prepared | int:
    """Check the console's options and bind its socket; an exit status when they are wrong.

    ``overrides`` replace fields of the console's Settings (``dirk serve`` names its key).
    """
    refused = _numbers_refused(args)
    if refused is not None:
        return refused
    operators = _operators(args)
    if isinstance(operators, int):
        return operators
    tls = _tls(args)
    if isinstance(tls, int):
        return tls
    try:
        import uvicorn  # noqa: F401

        from kernel.console._settings import Settings
    except ImportError as exc:
        return _error(
            CliError.EXTRA_MISSING,
            f"the console needs its extra: pip install 'dir-kernel[console]' ({exc})",
        )
    sock = _listen(args)
    if isinstance(sock, int):
        return sock
    ttl = args.approval_ttl if args.approval_ttl and args.approval_ttl > 0 else None
    fields: dict[str, Any] = {
        "db": args.db,
        "poll_s": args.poll,
        "approval_ttl_s": ttl,
        "trace_url": args.trace_url,
        "allowed_hosts": (*LOOPBACK_NAMES, args.host) if is_loopback(args.host) else None,
        "key": args.key,
        "door": args.door,
        "answer_s": ANSWER_S,
        "tls": tls is not None,
        "currency": args.currency,
    }
    settings = Settings(**(fields | overrides))
    return Prepared(settings, Gate(operators), sock, tls, args.host)


def _numbers_refused(args: argparse.Namespace) -> int | None:
    """An exit status when ``--port`` is not a port or ``--poll`` not seconds up to 60."""
    if not 0 <= args.port <= 65535:
        return _error(CliError.BAD_ARGUMENT, f"--port {args.port} is not a port")
    if not args.poll > 0 or args.poll > 60:
        return _error(CliError.BAD_ARGUMENT, "--poll takes seconds above 0, up to 60")
    return None


def _operators(args: argparse.Namespace) -> dict[str, str] | int | None:
    """The operators file's names, or None; an exit status when it cannot serve this host."""
    operators = None
    if args.operators is not None:
        try:
            operators = read_operators(args.operators)
        except OperatorsFileError as exc:
            return _error(CliError.BAD_ARGUMENT, str(exc))
        if not operators:
            return _error(CliError.BAD_ARGUMENT, f"{args.operators} names no operator")
    if not is_loopback(args.host) and operators is None:
        return _error(
            CliError.BAD_ARGUMENT,
            f"refusing to listen on {args.host} without named operators: give --operators FILE"
            " (or listen on 127.0.0.1)",
        )
    return operators


def _tls(args: argparse.Namespace) -> TlsFiles | int | None:
    """The certificate and key to serve TLS with, or None; an exit status when refused."""
    try:
        tls = tls_files(args.tls_cert, args.tls_key)
    except TlsError as exc:
        return _error(CliError.BAD_ARGUMENT, str(exc))
    if tls is not None and args.insecure_http:
        return _error(CliError.BAD_ARGUMENT, "--insecure-http contradicts --tls-cert/--tls-key")
    refusal = plain_http_refusal(args.host, tls=tls is not None, insecure_http=args.insecure_http)
    if refusal is not None:
        return _error(CliError.BAD_ARGUMENT, refusal)
    return tls


def _listen(args: argparse.Namespace) -> socket.socket | int:
    """A socket bound to the console's host and port; an exit status when it cannot be."""
    try:
        family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((args.host, args.port))
        sock.listen(64)
    except OSError as exc:
        return _error(CliError.BAD_ARGUMENT, f"cannot listen on {args.host}:{args.port}: {exc}")
    return sock


async def serve(prepared: Prepared) -> None:
    """Serve a prepared console until interrupted."""
    await server_for(prepared).serve(sockets=[prepared.sock])


def server_for(
    prepared: Prepared, *, now_ns: Callable[[], int] | None = None, signals: bool = True
) -> Any:
    """Return the uvicorn server of a prepared console, and print where it listens.

    Args:
        prepared: what :func:`prepare` made.
        now_ns: the clock the pages measure ages by (None: the journal's last event).
        signals: whether the server stops on SIGINT/SIGTERM itself (``dirk serve`` stops
            it, setting ``should_exit``, after it stopped the kernel).
    """
    import uvicorn

    from kernel.console._app import create_app

    app = create_app(prepared.settings, prepared.gate, now_ns=now_ns)
    host, port = prepared.sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if prepared.tls is not None else "http"
    if prepared.tls is None and not is_loopback(prepared.host):
        print(insecure_http_warning(prepared.host), file=sys.stderr, flush=True)
    where = redact(prepared.settings.db)
    print(f"dirk console for {where} on {scheme}://{shown}:{port}/", flush=True)
    if not prepared.gate.named:
        # Printed once, on the operator's own terminal, never logged (access logs are off).
        print(f"sign in: {scheme}://{shown}:{port}/login?token={prepared.gate.token}", flush=True)
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=2,
        ssl_certfile=prepared.tls.cert if prepared.tls is not None else None,
        ssl_keyfile=prepared.tls.key if prepared.tls is not None else None,
    )
    if signals:
        return uvicorn.Server(config)
    return _unsignalled(config)


def _unsignalled(config: Any) -> Any:
    """A uvicorn server that leaves SIGINT and SIGTERM to its caller."""
    import uvicorn  # the console extra: imported only when a console runs

    class Unsignalled(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Unsignalled(config)


def _add_operator(args: argparse.Namespace) -> int:
    if args.operators is None:
        return _error(CliError.BAD_ARGUMENT, "--add-operator needs --operators FILE")
    if sys.stdin.isatty():
        password = getpass.getpass(f"password for {args.add_operator}: ")
        if getpass.getpass("again: ") != password:
            return _error(CliError.BAD_ARGUMENT, "the two passwords differ")
    else:
        try:
            password = sys.stdin.readline().rstrip("\n")
        except UnicodeDecodeError:
            return _error(ReasonCode.SCHEMA_INVALID, "the password is not UTF-8 text")
    problem = utf8_problem(password)
    if problem is not None:
        return _error(ReasonCode.SCHEMA_INVALID, f"the password holds {problem}")
    try:
        add_operator(args.operators, args.add_operator, password)
    except OperatorsFileError as exc:
        return _error(CliError.BAD_ARGUMENT, str(exc))
    print(f"operator {args.add_operator} can sign in (in {args.operators})")
    return ExitCode.OK
