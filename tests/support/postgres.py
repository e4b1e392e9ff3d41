"""A throwaway PostgreSQL server for the tests that need one, shared by the run.

``postgres_server`` (session scope) runs Debian's ``initdb`` and ``pg_ctl`` as
the ``postgres`` user (the server refuses to run as root) in a temporary
directory, on a free 127.0.0.1 port, and stops it at the end. Each test gets a
database of its own from ``postgres_url``. Outside CI a machine without the
server binaries or psycopg skips these tests with the reason; under
``CI=true`` the same absence fails them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.ports import free_port

_names = itertools.count(1)


def missing(reason: str) -> None:
    """Skip outside CI, fail under CI: a real server the suite needs is absent."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI needs PostgreSQL: {reason}")
    pytest.skip(reason)


def _bindir() -> Path | None:
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0 and (Path(out.stdout.strip()) / "initdb").exists():
            return Path(out.stdout.strip())
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PostgresServer:
    """A running server: its admin URL, and a fresh database per call of :meth:`new_url`."""

    def __init__(self, root: Path, bindir: Path, port: int) -> None:
        self.root = root
        self.bindir = bindir
        self.port = port
        self.data = root / "data"

    def url(self, database: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def admin(self, sql: str, database: str = "postgres", user: str = "postgres") -> list[Any]:
        """Run ``sql`` in ``database`` as ``user``; return its rows."""
        import psycopg

        with psycopg.connect(self.url(database, user), autocommit=True) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []

    def new_url(self) -> str:
        name = f"j{os.getpid()}_{next(_names)}"
        self.admin(f"CREATE DATABASE {name}")
        return self.url(name)

    def run(self, *args: str) -> None:
        cmd = [*_as_postgres(), str(self.bindir / args[0]), *args[1:]]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.root}"
        )
        self.run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "log"),
            "-w",
            "-o",
            options,
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self.run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")


def _as_postgres() -> list[str]:
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser")
    return [runuser, "-u", "postgres", "--"] if runuser else ["su", "postgres", "-c"]


class Unavailable(Exception):
    """No PostgreSQL server can be started here; the message says why."""


@contextlib.contextmanager
def throwaway_server() -> Iterator[PostgresServer]:
    """Start a server in a temporary directory on a free 127.0.0.1 port; stop it on exit.

    Raises:
        Unavailable: psycopg, the server binaries or a user to run them as is missing,
            or the server did not start.
    """
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise Unavailable("psycopg is not installed (pip install -e '.[postgres]')") from None
    bindir = _bindir()
    if bindir is None:
        raise Unavailable("the PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise Unavailable("running as root, and no postgres user to run the server") from None
    root = Path(tempfile.mkdtemp(prefix="dirk-pg-"))
    os.chmod(root, 0o755)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    server = PostgresServer(root, bindir, free_port())
    try:
        server.run(
            "initdb", "-D", str(server.data), "-A", "trust", "-U", "postgres",
            "--no-locale", "-E", "UTF8", "--no-sync",
        )  # fmt: skip
        with open(server.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write("\nmax_connections = 200\n")
        server.start()
    except (OSError, subprocess.SubprocessError) as exc:
        shutil.rmtree(root, ignore_errors=True)
        raise Unavailable(f"the PostgreSQL server did not start ({exc})") from None
    try:
        yield server
    finally:
        try:
            server.stop("immediate")
        finally:
            shutil.rmtree(root, ignore_errors=True)


def server_or_missing() -> Iterator[PostgresServer]:
    """A throwaway server for a fixture to yield; its absence skips (outside CI) or fails."""
    try:
        context = throwaway_server()
        server = context.__enter__()
    except Unavailable as exc:
        missing(str(exc))
    try:
        yield server
    finally:
        context.__exit__(None, None, None)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server for the run, in a temporary directory, stopped at the end."""
    yield from server_or_missing()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A URL to a fresh, empty database on the run's server."""
    return postgres_server.new_url()
