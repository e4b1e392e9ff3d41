"""Which addresses a server may bind, and how it serves them: only this machine's go plain.

``dirk console`` and ``dirk mcp --http`` carry passwords, session cookies and
bearer tokens. On a loopback address they cross no network; anywhere else they
must go over TLS (``--tls-cert``, ``--tls-key``), or the operator says
``--insecure-http`` explicitly (a TLS proxy in front they trust, on a network
they control) and is warned each time the server starts.
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1 or localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class TlsFiles:
    """A server's certificate chain and private key (PEM files), as uvicorn takes them."""

    cert: str
    key: str


class TlsError(ValueError):
    """The certificate or key cannot serve TLS (unreadable, malformed, not a pair, encrypted)."""


def tls_files(cert: str | None, key: str | None) -> TlsFiles | None:
    """Return the certificate and key to serve with, checked now, or None for neither.

    Loading them here means a wrong file is one line at start-up, not a failure of
    the first connection; uvicorn loads the same files again to serve them.

    Raises:
        TlsError: one given without the other, or the pair does not load.
    """
    if cert is None and key is None:
        return None
    if not cert or not key:
        raise TlsError("TLS takes both --tls-cert FILE and --tls-key FILE")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # A password callback that gives none: an encrypted key is refused here instead of
        # OpenSSL asking for its passphrase on the terminal of a server.
        context.load_cert_chain(cert, key, password=_no_password)
    except ssl.SSLError as exc:  # before OSError, of which it is one
        why = f"OpenSSL: {exc.reason}" if exc.reason else "not a certificate chain and its key"
        raise TlsError(_tls_refusal(cert, key, why)) from None
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise TlsError(_tls_refusal(cert, key, why)) from None
    return TlsFiles(cert=cert, key=key)


def _tls_refusal(cert: str, key: str, why: str) -> str:
    return (
        f"cannot serve TLS with --tls-cert {cert} and --tls-key {key}: {why}"
        " (PEM files, the key unencrypted and matching the certificate)"
    )


def _no_password() -> bytes:
    raise ValueError("the key is encrypted")


def plain_http_refusal(host: str, *, tls: bool, insecure_http: bool) -> str | None:
    """Return why a server may not listen on ``host`` without TLS, or None when it may."""
    if tls or insecure_http or is_loopback(host):
        return None
    return (
        f"refusing to serve plain HTTP on {host}: passwords, session cookies and bearer"
        " tokens would cross the network readable. Give --tls-cert FILE and --tls-key FILE,"
        " or listen on 127.0.0.1 (behind a TLS proxy on this machine), or say"
        " --insecure-http if you must"
    )


def insecure_http_warning(host: str) -> str:
    """What a server prints, every time it starts, when told to serve plain HTTP off loopback."""
    return (
        f"WARNING: --insecure-http: serving plain HTTP on {host}. Passwords, session cookies"
        " and bearer tokens cross the network readable to anyone on the path; use it only"
        " behind a TLS proxy on a network you control, and prefer --tls-cert/--tls-key."
    )
