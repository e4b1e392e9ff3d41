"""The HTTP pieces of the console's web application: headers, forms, cookies and cells.

What every route of :mod:`kernel.console._app` leans on: the security headers on every
response, a bounded form read, the same-origin check, session cookies, and the text of
a CSV cell, a time and a trace link.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from kernel.console._fields import row_refusal
from kernel.telemetry import trace_id_for

MAX_FORM_BYTES = 256 * 1024

_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self';"
    " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


class SecurityHeaders:
    """Headers on every response: no inline script, no framing, no sniffing, no referrer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (b"content-security-policy", _CSP.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"x-frame-options", b"DENY"),
                    # A sign-in link carries the run's token: no Referer to another site.
                    # (no-referrer would also make the browser send "Origin: null".)
                    (b"referrer-policy", b"same-origin"),
                    (b"cache-control", b"no-store"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, sending)


async def form_of(request: Request) -> FormData | None:
    """The request's form, or None when it is too large or does not parse."""
    length = request.headers.get("content-length", "")
    if not length.isdigit() or int(length) > MAX_FORM_BYTES:
        return None
    try:
        return await request.form(max_files=0, max_fields=32)
    except Exception:  # a malformed body, whatever the parser says about it
        return None


def plain(form: FormData) -> dict[str, Any]:
    return {key: value for key, value in form.items() if isinstance(value, str)}


def same_origin(request: Request) -> bool:
    """A browser's Origin (or Referer) header, when sent, must name this console."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin:
        return True  # not a browser, or one that sends neither: the CSRF token still counts
    try:
        parts = urlsplit(origin)
    except ValueError:  # "http://[": not a URL, so no origin of this console
        return False
    return parts.netloc == request.headers.get("host", "")


def checked(row: Any) -> None:
    """Raise the refusal of a row no journal could record (a lone surrogate in it)."""
    refused = row_refusal(row)
    if refused is not None:
        raise refused


def set_cookie(
    response: Response, name: str, value: str, path: str = "/", *, secure: bool = False
) -> None:
    # Secure under TLS: a browser then never sends the session over plain HTTP.
    response.set_cookie(name, value, httponly=True, samesite="strict", path=path, secure=secure)


def new_nonce() -> str:
    import secrets

    return secrets.token_urlsafe(24)


def cell(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text, never runs as a formula."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def utc(ns: int) -> str:
    """An event's time as UTC to the second (``2026-11-24 02:19:18``)."""
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def span_text(ns: int) -> str:
    seconds = max(0, ns // 1_000_000_000)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def trace_link(template: str, dfid: str, root_dfid: str) -> str:
    if not template:
        return ""
    trace_id = f"{trace_id_for(root_dfid or dfid):032x}"
    return template.replace("{trace_id}", trace_id).replace("{dfid}", dfid)
