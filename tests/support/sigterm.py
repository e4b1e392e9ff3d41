"""SIGTERM to a server process while a client holds a keep-alive connection open.

What an orchestrator does to stop a server (systemd, Kubernetes: SIGTERM, then SIGKILL
later): the server must exit on it, even while a client it answered keeps its
connection open, idle, over TLS or not. The wait is a guard against a server that
never exits, not a measure of how fast it does.
"""

from __future__ import annotations

import http.client
import signal
import ssl
import subprocess
import urllib.parse

EXIT_GUARD_S = 20.0
"""How long a server may take to exit after SIGTERM before the test says it never does."""


def held_open(url: str, context: ssl.SSLContext | None = None) -> http.client.HTTPConnection:
    """Open a keep-alive connection to ``url``, ask once (no credential), read the answer.

    The connection is left open and idle, as a client that got a 401 and lingers leaves it.
    """
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port
    connection = (
        http.client.HTTPSConnection(host, port, context=context, timeout=30)
        if parts.scheme == "https"
        else http.client.HTTPConnection(host, port, timeout=30)
    )
    connection.request(
        "POST",
        parts.path or "/",
        body=b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}',
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Connection": "keep-alive",
        },
    )
    response = connection.getresponse()
    response.read()
    assert not response.will_close, "the server closed the connection: nothing is held open"
    return connection


def exits_on_sigterm(
    proc: subprocess.Popen[str], url: str, context: ssl.SSLContext | None = None
) -> int | None:
    """SIGTERM ``proc`` while a connection to ``url`` is held open; its exit code (None: none)."""
    connection = held_open(url, context)
    try:
        proc.send_signal(signal.SIGTERM)
        try:
            # Reading what it prints as it stops (a full pipe would hold it), then closing.
            proc.communicate(timeout=EXIT_GUARD_S)
        except subprocess.TimeoutExpired:
            return None
        return proc.returncode
    finally:
        connection.close()
