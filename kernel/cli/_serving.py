"""How ``dirk mcp`` and ``dirk mcp proxy`` are served: where they listen and who calls.

Both authenticate their callers and serve over stdio or streamable HTTP the same way;
``dirk serve`` serves ``dirk mcp``'s HTTP the same way too. The SDK is imported only when
a server starts.
"""

from __future__ import annotations

import argparse
import socket
import sys
import urllib.parse
from typing import TYPE_CHECKING, Any

from kernel.cli._operator import error
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

if TYPE_CHECKING:
    from kernel.identity import TokenVerifier
    from kernel.mcp import Identity, Principal

QUIET_LOGGERS = (
    "mcp",
    "mcp.server",
    "httpx",
    "httpx2",
    "uvicorn",
    "uvicorn.error",
    "uvicorn.access",
)
"""The loggers a server quiets to warnings (the SDK and its web stack log every request)."""


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
    users = p.add_argument_group(
        "signed user tokens",
        "with --http: take JWTs from an identity provider as bearer tokens too; each call"
        " acts for the token's subject, in its tenant (docs/identity.md)",
    )
    users.add_argument(
        "--user-keys",
        action="append",
        default=[],
        metavar="FILE",
        help="the identity provider's public keys: JWKS, JWK or PEM (repeatable)",
    )
    users.add_argument("--user-issuer", metavar="URL", help="the iss every user token carries")
    users.add_argument("--user-audience", metavar="AUD", help="the aud a user token must name")
    users.add_argument(
        "--user-tenant-claim",
        default="tenant",
        metavar="CLAIM",
        help="the claim that names the user's tenant (default tenant)",
    )
    users.add_argument(
        "--token-agent",
        default="",
        metavar="ID",
        help="the agent a user token calls as when it has no azp claim (default: it must)",
    )


class Callers:
    """Where to listen and who calls, as the command line says (checked by :func:`callers_of`)."""

    def __init__(
        self,
        host: str,
        port: int,
        tls: TlsFiles | None,
        tokens: dict[str, Principal],
        default: Principal | None,
        users: TokenVerifier | None = None,
        token_agent: str = "",
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.tokens = tokens
        self.default = default
        self.users = users
        self.token_agent = token_agent

    def agents(self) -> list[str]:
        """The agents that may call: the token file's, ``--agent``'s, ``--token-agent``."""
        named = {p.name for p in self.tokens.values() if p.role == "agent"}
        if self.default is not None and self.default.role == "agent":
            named.add(self.default.name)
        if self.token_agent:
            named.add(self.token_agent)
        return sorted(named)

    def identity(self) -> Identity:
        """Who calls, as :class:`kernel.mcp.Identity` knows it."""
        from kernel.mcp import Identity

        return Identity(self.default, self.tokens, users=self.users, token_agent=self.token_agent)


def callers_of(args: argparse.Namespace) -> Callers | int:
    """Check ``--http``, TLS, ``--token-file``, ``--public-url`` and ``--agent``/``--operator``.

    Shared by ``dirk mcp`` and ``dirk mcp proxy``: both are served, and authenticate their
    callers, the same way. Returns the callers, or the exit code of a usage error.
    """
    from kernel.mcp._http import TokenFileError, read_tokens

    operator = getattr(args, "operator", None)  # dirk mcp proxy serves agents only
    public_url = getattr(args, "public_url", None)
    for flag, name in (("--agent", args.agent), ("--operator", operator)):
        problem = None if name is None else id_problem(name)
        if problem is not None:
            # A byte that is not UTF-8 reaches argv as a lone surrogate: refused, not echoed.
            return error(ReasonCode.SCHEMA_INVALID, f"{flag}: {problem}", ExitCode.USAGE)
    listening = _listening(args, public_url)
    if isinstance(listening, int):
        return listening
    host, port, tls = listening
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
    return _with_users(args, operator, Callers(host, port, tls, tokens, None))


def _with_users(args: argparse.Namespace, operator: str | None, callers: Callers) -> Callers | int:
    """``callers`` with the user tokens and the caller without a token, or an exit code."""
    users = _users_of(args)
    if isinstance(users, int):
        return users
    default = _default_caller(args, operator, callers.tokens, users is not None)
    if isinstance(default, int):
        return default
    callers.default, callers.users, callers.token_agent = default, users, args.token_agent
    return callers


def _users_of(args: argparse.Namespace) -> TokenVerifier | int | None:
    """The verifier of ``--user-keys`` tokens (None: none taken), or an exit code."""
    from kernel.identity import KeyFileError, TokenVerifier, UserTokens

    given = (args.user_keys, args.user_issuer, args.user_audience)
    if not any(given):
        if args.token_agent:
            return error(CliError.BAD_ARGUMENT, "--token-agent goes with --user-keys")
        return None
    if not all(given):
        return error(
            CliError.BAD_ARGUMENT,
            "signed user tokens need --user-keys FILE, --user-issuer URL and --user-audience AUD",
            ExitCode.USAGE,
        )
    if not args.http:
        return error(CliError.BAD_ARGUMENT, "--user-keys goes with --http", ExitCode.USAGE)
    for flag, value in (
        ("--user-issuer", args.user_issuer),
        ("--user-audience", args.user_audience),
        ("--user-tenant-claim", args.user_tenant_claim),
        ("--token-agent", args.token_agent or "x"),
    ):
        problem = id_problem(value)
        if problem is not None:
            return error(ReasonCode.SCHEMA_INVALID, f"{flag}: {problem}", ExitCode.USAGE)
    config = UserTokens(
        issuer=args.user_issuer,
        audience=args.user_audience,
        keys=list(args.user_keys),
        tenant_claim=args.user_tenant_claim,
    )
    try:
        return TokenVerifier(config)
    except (KeyFileError, ValueError) as exc:
        return error(CliError.BAD_ARGUMENT, f"--user-keys: {exc}", ExitCode.USAGE)


def _listening(
    args: argparse.Namespace, public_url: str | None
) -> tuple[str, int, TlsFiles | None] | int:
    """Where ``--http`` listens and its TLS (``("", 0, None)`` over stdio), or an exit code."""
    if not args.http:
        if args.token_file or args.tls_cert or args.tls_key or args.insecure_http or public_url:
            return error(
                CliError.BAD_ARGUMENT,
                "--token-file, --public-url, --tls-cert, --tls-key and --insecure-http go with"
                " --http",
                ExitCode.USAGE,
            )
        return "", 0, None
    where = _host_port(args)
    if isinstance(where, int):
        return where
    host, port = where
    tls = _tls(args, host)
    if isinstance(tls, int):
        return tls
    return host, port, tls


def _host_port(args: argparse.Namespace) -> tuple[str, int] | int:
    """``--http``'s HOST:PORT; a host not loopback needs --token-file. Else an exit code."""
    host, sep, port_text = args.http.rpartition(":")
    if not sep or not port_text.isdigit() or not host or not 0 <= int(port_text) <= 65535:
        return error(CliError.BAD_ARGUMENT, "--http takes HOST:PORT", ExitCode.USAGE)
    host, port = host.strip("[]"), int(port_text)
    if not is_loopback(host) and not (args.token_file or args.user_keys):
        return error(
            CliError.BAD_ARGUMENT,
            f"refusing to serve {host} without --token-file or --user-keys (only loopback may"
            " go without)",
            ExitCode.USAGE,
        )
    return host, port


def _tls(args: argparse.Namespace, host: str) -> TlsFiles | int | None:
    """The TLS files to serve ``host`` with (None: plain HTTP, where allowed), or an exit code."""
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
    return tls


def _default_caller(
    args: argparse.Namespace, operator: str | None, tokens: dict[str, Principal], users: bool
) -> Principal | int | None:
    """Who calls without a token (``--agent``/``--operator``), None, or an exit code."""
    from kernel.mcp import Principal

    default = None
    if args.agent:
        default = Principal(role="agent", name=args.agent)
    elif operator:
        default = Principal(role="operator", name=operator)
    if default is None and not tokens and not users:
        who = "--agent ID or --operator NAME" if hasattr(args, "operator") else "--agent ID"
        return error(CliError.BAD_ARGUMENT, f"say who calls: {who}", ExitCode.USAGE)
    if (tokens or users) and default is not None:
        return error(
            CliError.BAD_ARGUMENT,
            "with --token-file or --user-keys the tokens say who calls, not --agent/--operator",
            ExitCode.USAGE,
        )
    return default


def web_of(args: argparse.Namespace, callers: Callers) -> Web | int | None:
    """Bind ``--http``'s socket: where the server listens (None over stdio), or an exit code."""
    from kernel.mcp._http import bound

    if not args.http:
        return None
    try:
        sock = bound(callers.host, callers.port)
    except OSError as exc:
        return error(CliError.BAD_ARGUMENT, f"--http {args.http}: {exc.strerror}", ExitCode.USAGE)
    scheme = "https" if callers.tls is not None else "http"
    url = getattr(args, "public_url", None) or url_of(scheme, callers.host, sock.getsockname()[1])
    return Web(
        sock, callers.host, url, callers.tls, callers.tokens, callers.users, callers.token_agent
    )


class Web:
    """Where ``dirk mcp --http`` serves: its bound socket, its URL, TLS, and the tokens."""

    def __init__(
        self,
        sock: socket.socket,
        host: str,
        url: str,
        tls: TlsFiles | None,
        tokens: dict[str, Principal],
        users: TokenVerifier | None = None,
        token_agent: str = "",
    ) -> None:
        self.sock = sock
        self.host = host
        self.url = url
        self.tls = tls
        self.tokens = tokens
        self.users = users
        self.token_agent = token_agent

    @property
    def guarded(self) -> bool:
        """Whether a request must carry a bearer token (a token file, or user tokens)."""
        return bool(self.tokens) or self.users is not None


def url_of(scheme: str, host: str, port: int) -> str:
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


def auth_of(web: Web | None) -> dict[str, Any]:
    """The MCP server's keywords for ``web``: the SDK's bearer check when tokens say who calls.

    A 401 then names the protected-resource metadata (RFC 9728); over stdio, or on loopback
    without tokens, none.
    """
    from kernel.mcp._http import http_auth

    if web is None or not web.guarded:
        return {}
    auth, verifier = http_auth(web.tokens, web.url, users=web.users, token_agent=web.token_agent)
    return {"auth": auth, "token_verifier": verifier}


async def transport(server: Any, web: Web | None) -> None:
    """Serve ``server`` over stdio, or over streamable HTTP at ``web`` (until cancelled)."""
    from kernel.mcp._http import coded_errors, no_oauth, serve_http

    if web is None:
        await server.run_stdio_async()
        return
    app: Any = server.streamable_http_app(stateless_http=True, host=web.host)
    app = coded_errors(no_oauth(app, web.url, web.users) if web.guarded else app)
    if web.tls is None and not is_loopback(web.host):
        print(insecure_http_warning(web.host), file=sys.stderr, flush=True)
    print(f"dirk mcp: serving {web.url}", file=sys.stderr, flush=True)
    await serve_http(app, web.sock, tls=web.tls)
