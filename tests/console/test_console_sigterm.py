"""``dirk console`` over TLS exits on SIGTERM while a client holds its connection open."""

from __future__ import annotations

from pathlib import Path

from tests.support.browser import console_extra, running_console, running_kernel
from tests.support.sigterm import exits_on_sigterm
from tests.support.tls import certificates

console_extra()


def test_sigterm_stops_it_while_a_refused_client_holds_its_connection(tmp_path: Path) -> None:
    certs = certificates(tmp_path)
    db = tmp_path / "j.db"
    tls = ("--tls-cert", str(certs.cert), "--tls-key", str(certs.key))
    with running_kernel(db), running_console(db, *tls) as console:
        # A sign-in without its nonce is refused; the client keeps the connection, idle.
        code = exits_on_sigterm(console.proc, console.url + "/login", certs.client_context())
        assert code is not None, "still running"
