"""``dirk mcp``: serve a journal's kernel to MCP hosts, over stdio or streamable HTTP.

The SDK is imported only when the command runs (``pip install 'dir-kernel[mcp]'``),
so ``dirk``'s other commands and ``import kernel`` never pay for it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from kernel.audit.reverify import PackPathError
from kernel.cli._operator import error
from kernel.cli._proxy import add_proxy
from kernel.cli._replay import packs_from
from kernel.core.hosts import (
    TlsError,
    TlsFiles,
    insecure_http_warning,
    is_loopback,
    plain_http_refusal,
    tls_files,
)
from kernel.core.reasons import CliError, ExitCode, ReasonCode
from kernel.core.text import id_problem
from kernel.policy.packs import PackError, PolicyCatalog, PolicyPack

if TYPE_CHECKING:
    from kernel.mcp import Embedded, Follower, Identity, Principal

_QUIET = ("mcp", "mcp.server", "httpx", "httpx2", "uvicorn", "uvicorn.error", "uvicorn.access")


def add_commands(commands: Any) -> None:
    """Add ``mcp`` to ``dirk``'s subparsers."""
    p = commands.add_parser(
        "mcp",
        help="serve the kernel to MCP hosts (stdio; --http HOST:PORT for streamable HTTP)",
        description=(
            "Serve the journal's memory, rulebook and decisions as MCP tools; every agent"
            " write is a proposal the kernel judges. By default the server follows a kernel"
            " running in another process: reads fold the journal, and writes go through its"
            " operator inbox (that kernel must allow the agents). With --kernel it opens the"
            " kernel here, with the memory pack."
        ),
    )
    p.add_argument("--db", help="the journal file (required)")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--agent", metavar="ID", help="over stdio: calls act as this agent")
    who.add_argument("--operator", metavar="NAME", help="over stdio: calls act as this operator")
    p.add_argument(
        "--kernel",
        action="store_true",
        help="open the kernel in this process (no other kernel may run on the journal)",
    )
    p.add_argument(
        "--pack",
        action="append",
        default=[],
        metavar="PATH",
        help=(
            "a policy pack the kernel judges with: FILE.py[:ATTR] or MODULE[:ATTR] (repeatable;"
            " its kinds' schemas go into the propose tool; with --kernel, packs with built-in"
            " adapters only)"
        ),
    )
    p.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve streamable HTTP (stateless) instead of stdio; port 0 picks a free one",
    )
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help="HTTP bearer tokens, one 'agent:ID TOKEN' or 'operator:NAME TOKEN' a line",
    )
    p.add_argument(
        "--key",
        metavar="PATH",
        help="a directory of NAME.key files (default: $DIRK_KEY): the server's own, DOOR.key,"
        " signs operator acts; each agent's signs its proposals (dirk operator add)",
    )
    p.add_argument(
        "--door",
        default="mcp",
        metavar="NAME",
        help="the name the kernel's keyring holds the server's key under (default mcp)",
    )
    p.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="with --http: serve HTTPS with this certificate chain (PEM); needs --tls-key",
    )
    p.add_argument(
        "--tls-key", metavar="FILE", help="the certificate's private key (PEM, unencrypted)"
    )
    p.add_argument(
        "--insecure-http",
        action="store_true",
        help="with --http: serve plain HTTP off loopback anyway (bearer tokens readable)",
    )
    p.set_defaults(run=_mcp)
    add_proxy(p.add_subparsers(dest="mcp_command", metavar="{proxy}"))


async def _mcp(args: argparse.Namespace) -> int:
    try:
        import kernel.mcp  # noqa: F401
    except ImportError:
        return error(
            CliError.BAD_ARGUMENT,
            "dirk mcp needs the MCP SDK: pip install 'dir-kernel[mcp]'",
            ExitCode.USAGE,
        )
    from kernel.mcp import Identity

    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    if not args.db:
        return error(CliError.BAD_ARGUMENT, "dirk mcp needs --db FILE", ExitCode.USAGE)
    callers = callers_of(args)
    if isinstance(callers, int):
        return callers
    host, port, tls, tokens, default = callers
    try:
        packs = packs_from(args.pack)
    except PackPathError as exc:
        return error(CliError.BAD_PACK_PATH, str(exc), ExitCode.USAGE)
    agents = sorted({p.name for p in tokens.values() if p.role == "agent"})
    if default is not None and default.role == "agent":
        agents = [default.name]
    identity = Identity(default, tokens)
    try:
        async with _backend(args, agents, packs) as backend:
            await _serve(backend, identity, tokens, args.http, host, port, tls)
    except PackError as exc:
        # Raised on opening the kernel: a pack that needs an adapter dirk mcp has not.
        return error(CliError.BAD_ARGUMENT, str(exc), ExitCode.USAGE)
    return ExitCode.OK


Callers = tuple[str, int, "TlsFiles | None", "dict[str, Principal]", "Principal | None"]
"""Where to listen and who calls: host, port, TLS, the bearer tokens, the stdio principal."""


def callers_of(args: argparse.Namespace) -> Callers | int:
    """Check ``--http``, TLS, ``--token-file`` and ``--agent``/``--operator``; or an exit code.

    Shared by ``dirk mcp`` and ``dirk mcp proxy``: both are served, and authenticate
    their callers, the same way.
    """
    from kernel.mcp import Principal
    from kernel.mcp._http import TokenFileError, read_tokens

    operator = getattr(args, "operator", None)  # dirk mcp proxy serves agents only
    for flag, name in (("--agent", args.agent), ("--operator", operator)):
        problem = None if name is None else id_problem(name)
        if problem is not None:
            # A byte that is not UTF-8 reaches argv as a lone surrogate: refused, not echoed.
            return error(ReasonCode.SCHEMA_INVALID, f"{flag}: {problem}", ExitCode.USAGE)
    host, port = "", 0
    tls: TlsFiles | None = None
    if args.http:
        host, sep, port_text = args.http.rpartition(":")
        if not sep or not port_text.isdigit() or not host or not 0 <= int(port_text) <= 65535:
            return error(CliError.BAD_ARGUMENT, "--http takes HOST:PORT", ExitCode.USAGE)
        host, port = host.strip("[]"), int(port_text)
        if not is_loopback(host) and not args.token_file:
            return error(
                CliError.BAD_ARGUMENT,
                f"refusing to serve {host} without --token-file (only loopback may go without)",
                ExitCode.USAGE,
            )
        try:
            tls = tls_files(args.tls_cert, args.tls_key)
        except TlsError as exc:
            return error(CliError.BAD_ARGUMENT, str(exc), ExitCode.USAGE)
        if tls is not None and args.insecure_http:
            return error(
                CliError.BAD_ARGUMENT,
                "--insecure-http contradicts --tls-cert/--tls-key",
                ExitCode.USAGE,
            )
        refusal = plain_http_refusal(host, tls=tls is not None, insecure_http=args.insecure_http)
        if refusal is not None:
            return error(CliError.BAD_ARGUMENT, refusal, ExitCode.USAGE)
    elif args.token_file or args.tls_cert or args.tls_key or args.insecure_http:
        return error(
            CliError.BAD_ARGUMENT,
            "--token-file, --tls-cert, --tls-key and --insecure-http go with --http",
            ExitCode.USAGE,
        )
    tokens: dict[str, Principal] = {}
    if args.token_file:
        try:
            tokens = read_tokens(args.token_file)
        except TokenFileError as exc:
            return error(CliError.BAD_ARGUMENT, str(exc), ExitCode.USAGE)
    default = None
    if args.agent:
        default = Principal(role="agent", name=args.agent)
    elif operator:
        default = Principal(role="operator", name=operator)
    if default is None and not tokens:
        who = "--agent ID or --operator NAME" if hasattr(args, "operator") else "--agent ID"
        return error(CliError.BAD_ARGUMENT, f"say who calls: {who}", ExitCode.USAGE)
    if tokens and default is not None:
        return error(
            CliError.BAD_ARGUMENT,
            "with --token-file the tokens say who calls, not --agent/--operator",
            ExitCode.USAGE,
        )
    return host, port, tls, tokens, default


async def _serve(
    backend: Embedded | Follower,
    identity: Identity,
    tokens: dict[str, Principal],
    http: str | None,
    host: str,
    port: int,
    tls: TlsFiles | None,
) -> None:
    import anyio
    from mcp.server.subscriptions import InMemorySubscriptionBus

    from kernel.mcp import Embedded, build_server, watch_rules

    bus = InMemorySubscriptionBus()
    server = build_server(backend, identity, bus=bus)
    async with anyio.create_task_group() as tg:
        if isinstance(backend, Embedded):
            tg.start_soon(watch_rules, bus, backend.kernel.journal)
        await _transport(server, tokens, http, host, port, tls)
        tg.cancel_scope.cancel()


async def _transport(
    server: Any,
    tokens: dict[str, Principal],
    http: str | None,
    host: str,
    port: int,
    tls: TlsFiles | None,
) -> None:
    from kernel.mcp._http import bearer, coded_errors, serve_http

    if not http:
        await server.run_stdio_async()
        return
    app: Any = coded_errors(server.streamable_http_app(stateless_http=True, host=host))
    if tokens:
        app = bearer(app, tokens)

    scheme = "https" if tls is not None else "http"
    shown = f"[{host}]" if ":" in host else host
    if tls is None and not is_loopback(host):
        print(insecure_http_warning(host), file=sys.stderr, flush=True)

    def ready(bound: int) -> None:
        print(f"dirk mcp: serving {scheme}://{shown}:{bound}/mcp", file=sys.stderr, flush=True)

    await serve_http(app, host, port, ready=ready, tls=tls)


@asynccontextmanager
async def _backend(
    args: argparse.Namespace, agents: list[str], packs: list[PolicyPack]
) -> AsyncIterator[Embedded | Follower]:
    from kernel.mcp import Embedded, Follower

    if not args.kernel:
        yield Follower(args.db, PolicyCatalog(packs).schemas, key=args.key, door=args.door)
        return
    from kernel.boot import open_kernel

    async with open_kernel(args.db, packs=packs, adapters={}, allow=agents) as kernel:
        yield Embedded(kernel)
