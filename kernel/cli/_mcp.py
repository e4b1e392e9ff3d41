"""``dirk mcp``: serve a journal's kernel to MCP hosts, over stdio or streamable HTTP.

The SDK is imported only when the command runs (``pip install 'dir-kernel[mcp]'``),
so ``dirk``'s other commands and ``import kernel`` never pay for it.
"""

from __future__ import annotations

import argparse
import logging
import math
import socket
import sys
import urllib.parse
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
        "--public-url",
        metavar="URL",
        help="with --token-file: the server's MCP URL as hosts reach it (behind a proxy, or"
        " bound to 0.0.0.0), named in its protected-resource metadata (default: from --http)",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="following a kernel: how long a write waits for its answer before QUEUED (default 5)",
    )
    add_serving_arguments(p, "one 'agent:ID TOKEN' or 'operator:NAME TOKEN' a line")
    p.set_defaults(run=_mcp)
    add_proxy(p.add_subparsers(dest="mcp_command", metavar="{proxy}"))


def add_serving_arguments(p: argparse.ArgumentParser, tokens: str) -> None:
    """Add where and how a server is reached (shared by ``dirk mcp`` and ``dirk mcp proxy``).

    Args:
        p: the command's parser.
        tokens: what a line of its ``--token-file`` holds.
    """
    p.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve streamable HTTP (stateless) instead of stdio; port 0 picks a free one",
    )
    p.add_argument("--token-file", metavar="FILE", help=f"HTTP bearer tokens, {tokens}")
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


async def _mcp(args: argparse.Namespace) -> int:
    try:
        import kernel.mcp  # noqa: F401
    except ImportError:
        # The same code as the console's for the same situation.
        return error(
            CliError.EXTRA_MISSING,
            "dirk mcp needs the MCP SDK: pip install 'dir-kernel[mcp]'",
            ExitCode.USAGE,
        )
    from kernel.mcp import Identity

    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    if not args.db:
        # Not required by argparse, so that `dirk mcp proxy` (a subcommand) goes without.
        return error(CliError.BAD_ARGUMENT, "dirk mcp needs --db FILE", ExitCode.USAGE)
    if not (math.isfinite(args.wait) and 0 <= args.wait <= 600):
        return error(CliError.BAD_ARGUMENT, "--wait takes seconds from 0 to 600", ExitCode.USAGE)
    callers = callers_of(args)
    if isinstance(callers, int):
        return callers
    try:
        packs = packs_from(args.pack)
    except PackPathError as exc:
        return error(CliError.BAD_PACK_PATH, str(exc), ExitCode.USAGE)
    tokens, default = callers.tokens, callers.default
    agents = sorted({p.name for p in tokens.values() if p.role == "agent"})
    if default is not None and default.role == "agent":
        agents = [default.name]
    identity = Identity(default, tokens)
    web = web_of(args, callers)
    if isinstance(web, int):
        return web
    try:
        async with _backend(args, agents, packs) as backend:
            await _serve(backend, identity, web)
    except PackError as exc:
        # Raised on opening the kernel: a pack that needs an adapter dirk mcp has not.
        return error(CliError.BAD_ARGUMENT, str(exc), ExitCode.USAGE)
    return ExitCode.OK


class Callers:
    """Where to listen and who calls, as the command line says (checked by :func:`callers_of`)."""

    def __init__(
        self,
        host: str,
        port: int,
        tls: TlsFiles | None,
        tokens: dict[str, Principal],
        default: Principal | None,
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.tokens = tokens
        self.default = default


def callers_of(args: argparse.Namespace) -> Callers | int:
    """Check ``--http``, TLS, ``--token-file``, ``--public-url`` and ``--agent``/``--operator``.

    Shared by ``dirk mcp`` and ``dirk mcp proxy``: both are served, and authenticate their
    callers, the same way. Returns the callers, or the exit code of a usage error.
    """
    from kernel.mcp import Principal
    from kernel.mcp._http import TokenFileError, read_tokens

    operator = getattr(args, "operator", None)  # dirk mcp proxy serves agents only
    public_url = getattr(args, "public_url", None)
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
    elif args.token_file or args.tls_cert or args.tls_key or args.insecure_http or public_url:
        return error(
            CliError.BAD_ARGUMENT,
            "--token-file, --public-url, --tls-cert, --tls-key and --insecure-http go with --http",
            ExitCode.USAGE,
        )
    if public_url is not None and _url_problem(public_url) is not None:
        return error(
            CliError.BAD_ARGUMENT, f"--public-url: {_url_problem(public_url)}", ExitCode.USAGE
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
    return Callers(host, port, tls, tokens, default)


def web_of(args: argparse.Namespace, callers: Callers) -> _Web | int | None:
    """Bind ``--http``'s socket: where the server listens (None over stdio), or an exit code."""
    from kernel.mcp._http import bound

    if not args.http:
        return None
    try:
        sock = bound(callers.host, callers.port)
    except OSError as exc:
        return error(CliError.BAD_ARGUMENT, f"--http {args.http}: {exc.strerror}", ExitCode.USAGE)
    scheme = "https" if callers.tls is not None else "http"
    url = getattr(args, "public_url", None) or _url_of(scheme, callers.host, sock.getsockname()[1])
    return _Web(sock, callers.host, url, callers.tls, callers.tokens)


class _Web:
    """Where ``dirk mcp --http`` serves: its bound socket, its URL, TLS, and the tokens."""

    def __init__(
        self,
        sock: socket.socket,
        host: str,
        url: str,
        tls: TlsFiles | None,
        tokens: dict[str, Principal],
    ) -> None:
        self.sock = sock
        self.host = host
        self.url = url
        self.tls = tls
        self.tokens = tokens


def _url_of(scheme: str, host: str, port: int) -> str:
    """The MCP URL of a server bound to ``host:port`` (a wildcard bind: this machine's name)."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}/mcp"


def _url_problem(url: str) -> str | None:
    """Why ``url`` cannot be the server's public URL, or None."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an http:// or https:// URL"
    if not parts.path.endswith("/mcp") or parts.query or parts.fragment:
        return "a URL ending in /mcp, with no query"
    return id_problem(url)


def auth_of(web: _Web | None) -> dict[str, Any]:
    """The MCP server's keywords for ``web``: the SDK's bearer check when tokens say who calls.

    A 401 then names the protected-resource metadata (RFC 9728); over stdio, or on loopback
    without tokens, none.
    """
    from kernel.mcp._http import http_auth

    if web is None or not web.tokens:
        return {}
    auth, verifier = http_auth(web.tokens, web.url)
    return {"auth": auth, "token_verifier": verifier}


async def _serve(backend: Embedded | Follower, identity: Identity, web: _Web | None) -> None:
    import anyio
    from mcp.server.subscriptions import InMemorySubscriptionBus

    from kernel.mcp import Embedded, build_server, watch_rules

    bus = InMemorySubscriptionBus()
    server = build_server(backend, identity, bus=bus, **auth_of(web))
    async with anyio.create_task_group() as tg:
        if isinstance(backend, Embedded):
            tg.start_soon(watch_rules, bus, backend.kernel.journal)
        await transport(server, web)
        tg.cancel_scope.cancel()


async def transport(server: Any, web: _Web | None) -> None:
    """Serve ``server`` over stdio, or over streamable HTTP at ``web`` (until cancelled)."""
    from kernel.mcp._http import coded_errors, no_oauth, serve_http

    if web is None:
        await server.run_stdio_async()
        return
    app: Any = server.streamable_http_app(stateless_http=True, host=web.host)
    app = coded_errors(no_oauth(app) if web.tokens else app)
    if web.tls is None and not is_loopback(web.host):
        print(insecure_http_warning(web.host), file=sys.stderr, flush=True)
    print(f"dirk mcp: serving {web.url}", file=sys.stderr, flush=True)
    await serve_http(app, web.sock, tls=web.tls)


@asynccontextmanager
async def _backend(
    args: argparse.Namespace, agents: list[str], packs: list[PolicyPack]
) -> AsyncIterator[Embedded | Follower]:
    from kernel.mcp import Embedded, Follower

    if not args.kernel:
        yield Follower(
            args.db,
            PolicyCatalog(packs).schemas,
            key=args.key,
            door=args.door,
            wait_s=args.wait,
            answer_s=args.wait,
        )
        return
    from kernel.boot import open_kernel

    async with open_kernel(args.db, packs=packs, adapters={}, allow=agents) as kernel:
        yield Embedded(kernel)
