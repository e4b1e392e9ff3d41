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
import getpass
import socket
import sys
from pathlib import Path
from typing import Any

from kernel.console._auth import Gate, OperatorsFileError, add_operator, read_operators
from kernel.core.hosts import (
    TlsError,
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
        "console", help="serve the operator console in a browser (extra dirk[console])"
    )
    console.add_argument("--db", required=True, help="the journal: a file, or a postgresql:// URL")
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
        "--add-operator",
        metavar="NAME",
        help="add NAME to --operators FILE with a password read from the terminal (or stdin)",
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
    console.set_defaults(run=run)


def _error(code: CliError | ReasonCode, message: str, status: ExitCode = ExitCode.USAGE) -> int:
    print(f"error: {code}: {message}", file=sys.stderr)
    return status


async def run(args: argparse.Namespace) -> int:
    """Run ``dirk console`` until interrupted; return its exit status."""
    if args.add_operator:
        return _add_operator(args)
    if not 0 <= args.port <= 65535:
        return _error(CliError.BAD_ARGUMENT, f"--port {args.port} is not a port")
    if not args.poll > 0 or args.poll > 60:
        return _error(CliError.BAD_ARGUMENT, "--poll takes seconds above 0, up to 60")
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
    try:
        tls = tls_files(args.tls_cert, args.tls_key)
    except TlsError as exc:
        return _error(CliError.BAD_ARGUMENT, str(exc))
    if tls is not None and args.insecure_http:
        return _error(CliError.BAD_ARGUMENT, "--insecure-http contradicts --tls-cert/--tls-key")
    refusal = plain_http_refusal(args.host, tls=tls is not None, insecure_http=args.insecure_http)
    if refusal is not None:
        return _error(CliError.BAD_ARGUMENT, refusal)
    try:
        import uvicorn

        from kernel.console._app import Settings, create_app
    except ImportError as exc:
        return _error(
            CliError.EXTRA_MISSING,
            f"dirk console needs the console extra: pip install 'dir-kernel[console]' ({exc})",
        )
    # A file that is no journal fails here, as one line with its code (dirk's main prints it).
    async with open_journal(args.db, readonly=True):
        pass
    try:
        family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((args.host, args.port))
        sock.listen(64)
    except OSError as exc:
        return _error(CliError.BAD_ARGUMENT, f"cannot listen on {args.host}:{args.port}: {exc}")
    gate = Gate(operators)
    ttl = args.approval_ttl if args.approval_ttl and args.approval_ttl > 0 else None
    settings = Settings(
        db=args.db,
        poll_s=args.poll,
        approval_ttl_s=ttl,
        trace_url=args.trace_url,
        allowed_hosts=(*LOOPBACK_NAMES, args.host) if is_loopback(args.host) else None,
        key=args.key,
        door=args.door,
        answer_s=ANSWER_S,
        tls=tls is not None,
    )
    app = create_app(settings, gate)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if tls is not None else "http"
    if tls is None and not is_loopback(args.host):
        print(insecure_http_warning(args.host), file=sys.stderr, flush=True)
    print(f"dirk console for {redact(args.db)} on {scheme}://{shown}:{port}/", flush=True)
    if operators is None:
        # Printed once, on the operator's own terminal, never logged (access logs are off).
        print(f"sign in: {scheme}://{shown}:{port}/login?token={gate.token}", flush=True)
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=2,
        ssl_certfile=tls.cert if tls is not None else None,
        ssl_keyfile=tls.key if tls is not None else None,
    )
    server = uvicorn.Server(config)
    try:
        await server.serve(sockets=[sock])
    finally:
        sock.close()
    return ExitCode.OK


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
