"""Streamable HTTP for the MCP server: stateless, behind a bearer token per principal.

The SDK's own auth sends clients into OAuth discovery; a small ASGI middleware
in front of its app checks ``Authorization: Bearer TOKEN`` against the token
file instead, and answers 401 without reaching the server when it does not
match. Tools read the same header to know who calls (kernel.mcp._server.Identity).
Tokens are compared in constant time and never logged: the SDK's and uvicorn's
request logs are off.

A token file has one principal per line, ``agent:ID TOKEN`` or
``operator:NAME TOKEN`` (blank lines and ``#`` comments ignored); a token is
at least 16 characters.

Served with a certificate and key (:class:`kernel.core.hosts.TlsFiles`), the
same app speaks HTTPS only: a bearer token never crosses a network readable.
"""

from __future__ import annotations

import hmac
import json
import socket
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from kernel.core.hosts import TlsFiles
from kernel.core.text import id_problem
from kernel.mcp._backend import Principal

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
        if len(parts) != 2 or role not in ("agent", "operator") or not name:
            raise TokenFileError(
                f"{path} line {number}: want 'agent:ID TOKEN' or 'operator:NAME TOKEN'"
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
        tokens[token] = Principal(role=role, name=name)  # type: ignore[arg-type]
    if not tokens:
        raise TokenFileError(f"{path} names no principal")
    return tokens


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


def bearer(app: App, tokens: Mapping[str, Principal]) -> App:
    """Wrap ``app`` so an HTTP request without a known bearer token gets 401 and goes no further."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = {
            key.decode("latin-1").lower(): value.decode("latin-1")
            for key, value in scope.get("headers", [])
        }
        if principal_of(headers, tokens) is None:
            body = b'{"error": "UNAUTHORIZED", "detail": "a bearer token of this server is needed"}'
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"www-authenticate", b"Bearer"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return guarded


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

        async def sending(message: Message) -> None:
            if held:
                held.append(message)
                if message["type"] == "http.response.body" and not message.get("more_body"):
                    await _flush_coded(held, send)
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


async def _flush_coded(held: list[Message], send: Send) -> None:
    start, *bodies = held
    body = b"".join(m.get("body", b"") for m in bodies)
    status = start.get("status", 400)
    code = "UNAUTHORIZED" if status in (401, 403, 421) else "SCHEMA_INVALID"
    try:
        message = json.loads(body)
        error = message.get("error") if isinstance(message, dict) else None
        if isinstance(error, dict) and "data" not in error:
            error["data"] = {"reason_code": code}
            body = json.dumps(message).encode()
    except ValueError:
        pass  # not JSON after all: sent as it came
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def serve_http(
    app: App,
    host: str,
    port: int,
    *,
    ready: Callable[[int], None] | None = None,
    tls: TlsFiles | None = None,
) -> None:
    """Serve ``app`` on ``host:port`` with uvicorn until cancelled; ``ready`` gets the bound port.

    The socket is bound here, before uvicorn starts, so the port (0: a free one) is
    known, and a client may connect, as soon as ``ready`` is called. With ``tls`` the
    server speaks HTTPS only (a plain HTTP request fails its TLS handshake).
    """
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        if ready is not None:
            ready(sock.getsockname()[1])
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="on",
            ssl_certfile=tls.cert if tls is not None else None,
            ssl_keyfile=tls.key if tls is not None else None,
        )
        await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        sock.close()
