"""Streamable HTTP for the MCP server: stateless, behind a bearer token per principal.

The SDK's own auth checks ``Authorization: Bearer TOKEN`` with :class:`TokenFile`,
a token verifier over the token file, and answers 401 without reaching the server
when it does not match. The 401 names the server's protected-resource metadata
(RFC 9728, served at ``/.well-known/oauth-protected-resource/mcp``), so a host
discovers what this server is and how to present a token instead of guessing.
Tools read the same header to know who calls (kernel.mcp._server.Identity).
Tokens are compared in constant time and never logged: the SDK's and uvicorn's
request logs are off.

The tokens are provisioned by the operator, out of band: the metadata names no
authorization server for them (RFC 9728 makes ``authorization_servers`` optional;
the SDK's own would name this server, which runs none). With signed user tokens
(``--user-keys``) it names their issuer, the identity provider that does issue
them. This server serves no OAuth endpoint (``/.well-known/oauth-authorization-server``,
``/register``, ``/authorize`` answer 404 with an ``error_description`` that says
so), so a host that tries OAuth anyway stops at its first request with that
sentence to show.

A token file has one principal per line, ``agent:ID TOKEN`` or
``operator:NAME TOKEN`` (blank lines and ``#`` comments ignored); a token is
at least 16 characters. A third column, ``TENANT/USER``, binds the token to the
user it acts for: its calls are that user's, in that tenant, vouched for by this
server (``mcp:<name>``), and it reads that tenant's records only. With a
:class:`kernel.identity.TokenVerifier`, a signed user token is a bearer token too:
its subject is the user, its ``azp`` claim the agent (kernel.mcp._tools.Identity).

Served with a certificate and key (:class:`kernel.core.hosts.TlsFiles`), the
same app speaks HTTPS only: a bearer token never crosses a network readable.
"""

from __future__ import annotations

import hmac
import json
import socket
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from pydantic import AnyHttpUrl

from kernel.core.events import Principal as OnBehalfOf
from kernel.core.hosts import TlsFiles
from kernel.core.text import id_problem
from kernel.identity import TokenVerifier
from kernel.mcp._backend import Principal, ToolRefused

MIN_TOKEN = 16
"""The shortest token a token file may hold."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class TokenFileError(ValueError):
    """The token file cannot be read or holds a malformed line (its text is never shown)."""


def read_tokens(path: str | Path) -> dict[str, Principal]:
    """Return the principals of a token file by token.

    Raises:
        TokenFileError: unreadable, empty, a malformed line, a short or repeated token.
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"cannot read the token file {path}: {type(exc).__name__}") from None
    tokens: dict[str, Principal] = {}
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        role, _, name = parts[0].partition(":") if parts else ("", "", "")
        if len(parts) not in (2, 3) or role not in ("agent", "operator") or not name:
            raise TokenFileError(
                f"{path} line {number}: want 'agent:ID TOKEN [TENANT/USER]' or"
                " 'operator:NAME TOKEN [TENANT/USER]'"
            )
        problem = id_problem(name)
        if problem is not None:
            # The name is what the journal records as who acted: no control character in it.
            raise TokenFileError(f"{path} line {number}: the name holds {problem}")
        token = parts[1]
        if len(token) < MIN_TOKEN:
            raise TokenFileError(
                f"{path} line {number}: a token has at least {MIN_TOKEN} characters"
            )
        if token in tokens:
            raise TokenFileError(f"{path} line {number}: the same token twice")
        user = _user_of(parts[2:], name, path, number)
        tokens[token] = Principal(role=role, name=name, on_behalf=user)  # type: ignore[arg-type]
    if not tokens:
        raise TokenFileError(f"{path} names no principal")
    return tokens


def _user_of(rest: list[str], name: str, path: str | Path, number: int) -> OnBehalfOf | None:
    """The user a token-file line's third column binds its token to (None: no column)."""
    if not rest:
        return None
    tenant, _, user = rest[0].partition("/")
    if not tenant or not user or id_problem(tenant) or id_problem(user):
        raise TokenFileError(f"{path} line {number}: the third column is TENANT/USER")
    return OnBehalfOf(tenant=tenant, user=user, vouched_by=f"mcp:{name}")


def principal_of(headers: Mapping[str, str], tokens: Mapping[str, Principal]) -> Principal | None:
    """Return the principal whose token the Authorization header carries, or None."""
    scheme, _, given = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        return None
    found = None
    for token, principal in tokens.items():
        # Every token is compared, so the time taken says nothing about which was close.
        if hmac.compare_digest(token.encode(), given.strip().encode()):
            found = principal
    return found


class TokenFile:
    """The SDK's token verifier over a token file: a known token is its principal's access.

    The access token names the principal as ``client_id`` (``agent:ide``), its role
    as the one scope, and this server's URL as the resource it was issued for. With
    ``users``, a signed user token that verifies is an agent's access too (its ``azp``).

    Args:
        tokens: the principals by token (:func:`read_tokens`).
        resource: this server's MCP URL, e.g. ``https://desk.example:8766/mcp``.
        users: the verifier of signed user tokens, if the server takes them.
        token_agent: the agent a user token without ``azp`` calls as.
    """

    def __init__(
        self,
        tokens: Mapping[str, Principal],
        resource: str,
        *,
        users: TokenVerifier | None = None,
        token_agent: str = "",
    ) -> None:
        from kernel.mcp._tools import Identity

        self._identity = Identity(tokens=tokens, users=users, token_agent=token_agent)
        self.resource = resource

    async def verify_token(self, token: str) -> AccessToken | None:
        """Return the access ``token`` gives, or None for a token this server never issued."""
        try:
            principal = self._identity.of_token(token)
        except ToolRefused:
            return None
        who = f"{principal.role}:{principal.name}"
        return AccessToken(
            token=token, client_id=who, subject=who, scopes=[principal.role], resource=self.resource
        )


def http_auth(
    tokens: Mapping[str, Principal],
    resource: str,
    *,
    users: TokenVerifier | None = None,
    token_agent: str = "",
) -> tuple[AuthSettings, TokenFile]:
    """Return the SDK's auth settings and verifier for a server at ``resource`` with ``tokens``.

    The operator provisions the tokens (``--token-file``), no OAuth server issues them;
    user tokens (``users``) come from the identity provider whose keys the verifier
    holds. The SDK's settings want an issuer: the server's origin is given, but the
    metadata hosts read is :func:`resource_metadata`'s (served by :func:`no_oauth`),
    which names no authorization server that does not exist.
    """
    origin = resource.removesuffix("/mcp")
    settings = AuthSettings(
        issuer_url=AnyHttpUrl(origin),
        resource_server_url=AnyHttpUrl(resource),
        # TokenFile answers only for its own tokens, each issued for this resource.
        validate_token_resource=False,
    )
    return settings, TokenFile(tokens, resource, users=users, token_agent=token_agent)


_NO_OAUTH = (
    b'{"error": "invalid_request", "error_description": "this MCP server takes bearer tokens'
    b" its operator provisions (dirk mcp --token-file): it issues none, and runs no OAuth"
    b' server; ask the operator for a token and send it as Authorization: Bearer TOKEN",'
    b' "reason_code": "UNAUTHORIZED"}'
)
_OAUTH_PATHS = (
    "/.well-known/oauth-authorization-server",
    "/.well-known/openid-configuration",
    "/register",
    "/authorize",
    "/token",
)


def resource_metadata(resource: str, users: TokenVerifier | None = None) -> bytes:
    """The protected-resource metadata (RFC 9728) of the MCP server at ``resource``.

    It names an authorization server only where one exists: the issuer of the signed
    user tokens the server takes (``users``), when that is an https (or loopback http)
    URL. The operator's tokens have none, so without ``users`` it names none.
    """
    document: dict[str, Any] = {
        "resource": resource,
        "bearer_methods_supported": ["header"],
        "resource_name": "dirk",
    }
    issuer = users.config.issuer if users is not None else ""
    if issuer.startswith(("https://", "http://127.0.0.1", "http://localhost")):
        document["authorization_servers"] = [issuer]
    return json.dumps(document).encode()


def metadata_path(resource: str) -> str:
    """Where the metadata of ``resource`` is served (``/.well-known/...`` + its path)."""
    path = urllib.parse.urlsplit(resource).path.rstrip("/")
    return "/.well-known/oauth-protected-resource" + path


def no_oauth(app: App, resource: str = "", users: TokenVerifier | None = None) -> App:
    """Wrap ``app`` so OAuth's endpoints answer 404 with a sentence a host can show.

    A host that finds no authorization server's metadata tries the default OAuth
    endpoints on the server's origin (``/register``, then ``/authorize``); each gets
    this JSON error, so the host stops there and says why, rather than opening a
    browser on a flow no one can finish. With ``resource`` (the server's MCP URL), the
    protected-resource metadata is :func:`resource_metadata`'s, not the SDK's.
    """
    served = metadata_path(resource) if resource else None
    metadata = resource_metadata(resource, users) if resource else b""

    async def answering(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if served is not None and path == served and scope.get("method") in ("GET", "HEAD"):
            await _send_json(send, 200, metadata)
            return
        if not any(path == p or path.startswith(p + "/") for p in _OAUTH_PATHS):
            await app(scope, receive, send)
            return
        await _send_json(send, 404, _NO_OAUTH)

    return answering


async def _send_json(send: Send, status: int, body: bytes) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"access-control-allow-origin", b"*"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def coded_errors(app: App) -> App:
    """Wrap ``app`` so each JSON-RPC error it answers over HTTP carries a reason code too.

    The SDK refuses what never reaches a tool (a body that is not JSON, or JSON that
    holds a lone surrogate's escape, a request that is not JSON-RPC) with a JSON-RPC
    error and a 4xx status. Each such error gets ``data: {"reason_code": ...}``
    (SCHEMA_INVALID; UNAUTHORIZED for 401, 403 and 421), as a tool's refusal has one.
    """

    async def coding(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        held: list[Message] = []
        signed = _bearer_is_jwt(scope)

        async def sending(message: Message) -> None:
            if held:
                held.append(message)
                if message["type"] == "http.response.body" and not message.get("more_body"):
                    await _flush_coded(held, send, signed)
                return
            if message["type"] == "http.response.start" and _json_error(message):
                held.append(message)
                return
            await send(message)

        await app(scope, receive, sending)

    return coding


def _json_error(start: Message) -> bool:
    if not 400 <= start.get("status", 200) < 500:
        return False
    headers: dict[bytes, bytes] = {k.lower(): v for k, v in start.get("headers", [])}
    return headers.get(b"content-type", b"").startswith(b"application/json")


def _bearer_is_jwt(scope: Scope) -> bool:
    """Whether the request's bearer token has a JWT's shape (three dot-separated parts)."""
    for key, value in scope.get("headers", []):
        if key.lower() == b"authorization":
            scheme, _, token = value.partition(b" ")
            return bool(scheme.lower() == b"bearer" and token.strip().count(b".") == 2)
    return False


def _code_of(status: int, signed: bool) -> str:
    """The reason code of a 4xx answer (``signed``: the request bore a user token)."""
    if status == 401 and signed:
        # A signed user token that did not verify: forged, expired, or another audience's.
        return "PRINCIPAL_INVALID"
    return "UNAUTHORIZED" if status in (401, 403, 421) else "SCHEMA_INVALID"


async def _flush_coded(held: list[Message], send: Send, signed: bool = False) -> None:
    start, *bodies = held
    body = b"".join(m.get("body", b"") for m in bodies)
    status = start.get("status", 400)
    code = _code_of(status, signed)
    try:
        message = json.loads(body)
        error = message.get("error") if isinstance(message, dict) else None
        if isinstance(error, dict) and "data" not in error:
            error["data"] = {"reason_code": code}
            body = json.dumps(message).encode()
        elif isinstance(error, str) and "reason_code" not in message:
            # An OAuth error (the auth middleware's 401: "invalid_token"): the code beside it.
            message["reason_code"] = code
            body = json.dumps(message).encode()
    except ValueError:
        pass  # not JSON after all: sent as it came
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": body})


SHUTDOWN_GRACE_S = 2
"""How long a stopping server waits for its open connections before it cuts them."""


def bound(host: str, port: int) -> socket.socket:
    """Return a listening socket on ``host:port`` (port 0: a free one, see ``getsockname``).

    Bound before the app is built, so the app knows its own URL (the resource its
    metadata names), and before uvicorn starts, so a client may connect at once.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


async def serve_http(app: App, sock: socket.socket, *, tls: TlsFiles | None = None) -> None:
    """Serve ``app`` on the bound ``sock`` with uvicorn until cancelled; the socket is closed.

    With ``tls`` the server speaks HTTPS only (a plain HTTP request fails its TLS handshake).
    """
    import uvicorn

    host, port = sock.getsockname()[:2]
    try:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="on",
            ssl_certfile=tls.cert if tls is not None else None,
            ssl_keyfile=tls.key if tls is not None else None,
            # On SIGTERM, connections still open (a client idle on keep-alive after a 401)
            # get this long to close, then are cut: the server always exits.
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        )
        await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        sock.close()
