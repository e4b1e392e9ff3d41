"""What the mesh tests share: host and executor processes, a kernel on the bus, principals' clients.

Hosts and executors are real processes (``python -m agents_sdk.serve``, ``python -m
kernel.mesh.executor``) logging in as their principals of ``tests.support.nats``; a crash
is a SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.abc

from kernel.mesh import (
    GuardedClient,
    MeshConfig,
    RemoteAdapter,
    agent_inbox,
    connect,
    executor_inbox,
    open_mesh,
    reader_inbox,
)
from kernel.registry import agent_key, credential_verifier
from tests.support.helpers import kernel_for
from tests.support.nats import NatsServer, Principals, reset_bus

STEP_S = 60
"""The most one step of a test may take before it fails."""
FAST = MeshConfig(ack_wait_s=2.0, max_deliver=5)
"""A killed host's context comes back soon."""
EXECUTOR_ACK_WAIT_S = 2.0
"""A killed executor's intent comes back soon."""


class Host:
    """A host (or executor) process and the lines it printed."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._buffer = b""

    async def line(self, prefix: str) -> str:
        """Return the first line starting with ``prefix`` (reading on until there is one)."""
        assert self.process.stdout is not None
        try:
            with anyio.fail_after(STEP_S):
                while True:
                    for line in self.lines:
                        if line.startswith(prefix):
                            return line
                    try:
                        chunk = await self.process.stdout.receive()
                    except anyio.EndOfStream:
                        raise AssertionError(
                            f"no {prefix!r} line; it printed {self.lines}"
                        ) from None
                    self._buffer += chunk
                    *done, self._buffer = self._buffer.split(b"\n")
                    self.lines += [d.decode(errors="replace") for d in done]
        except TimeoutError:  # say what it did print: a slow step is then told from a stuck one
            raise AssertionError(
                f"no {prefix!r} line in {STEP_S} s; it printed {self.lines}"
            ) from None

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)


def principals_of(server: NatsServer) -> Principals:
    assert server.principals is not None
    return server.principals


def _env(server: NatsServer, **extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    if server.extra.get("ca_file"):
        env["DIRK_BUS_CA"] = server.extra["ca_file"]
    return env


@asynccontextmanager
async def host(
    server: NatsServer, credential: str | None = None, mode: str = "", agent: str = "Clerk"
) -> AsyncIterator[Host]:
    """A host of agent ``clerk`` (tests.support.mesh_agents: class ``agent``), logged in
    with its credential."""
    shown = credential if credential is not None else principals_of(server).clerk
    env = _env(server, DIRK_CREDENTIAL_CLERK=shown, MESH_AGENT_MODE=mode)
    command = [sys.executable, "-m", "agents_sdk.serve", "--bus", server.url, "--concurrency", "2"]
    async with running([*command, f"tests.support.mesh_agents:{agent}"], env) as process:
        yield process


@asynccontextmanager
async def executor(
    server: NatsServer, ledger: Path, mode: str = "", ack_wait_s: float = EXECUTOR_ACK_WAIT_S
) -> AsyncIterator[Host]:
    """An executor of adapter ``bank`` (tests.support.mesh_executor), with the bank's key."""
    env = _env(server, LEDGER_DB=str(ledger), EXECUTOR_MODE=mode)
    command = [sys.executable, "-m", "kernel.mesh.executor", "--bus", server.url]
    command += ["--ack-wait", str(ack_wait_s), "--adapter", "bank"]
    command += ["--key", str(principals_of(server).bank_key)]
    async with running([*command, "tests.support.mesh_executor:Ledger"], env) as process:
        yield process


@asynccontextmanager
async def running(command: list[str], env: dict[str, str]) -> AsyncIterator[Host]:
    process = await anyio.open_process(command, env=env, stderr=subprocess.STDOUT)
    started = Host(process)
    try:
        await started.line("READY")
        yield started
    finally:
        if process.returncode is None:
            process.kill()
        with anyio.CancelScope(shield=True):
            await process.wait()
            await process.aclose()


async def provision(kernel: Any, server: NatsServer) -> str:
    """Issue agent ``clerk`` the credential its hosts log in with; return it."""
    secret = principals_of(server).clerk
    await kernel.issue_credential(
        "clerk", credential_verifier(secret), operator="ana", reason="host"
    )
    return secret


@asynccontextmanager
async def meshed(
    path: Path, server: NatsServer, config: MeshConfig = FAST, **options: Any
) -> AsyncIterator[Any]:
    """A kernel on a fresh journal at ``path``, on the bus as the kernel principal."""
    await reset_bus(server)
    async with (
        kernel_for(path, **options) as kernel,
        open_mesh(kernel, server.url, config, auth=server.kernel) as mesh,
    ):
        cast(Any, kernel).mesh = mesh  # the tests reach the mesh through the kernel they hold
        yield kernel


def remote_bank(server: NatsServer, **options: Any) -> RemoteAdapter:
    """The kernel's RemoteAdapter for ``bank``, trusting the bank executors' key."""
    options.setdefault("result_timeout_s", STEP_S)
    options.setdefault("ack_wait_s", EXECUTOR_ACK_WAIT_S)
    return RemoteAdapter(
        server.url,
        "bank",
        executor_key=principals_of(server).bank_public,
        auth=server.kernel,
        **options,
    )


async def as_agent(server: NatsServer, agent_id: str, credential: str) -> GuardedClient:
    """A client logged in as the hosts of ``agent_id`` (the credential seeds its key)."""
    auth = server.auth(agent_key(credential), agent_inbox(agent_id))
    return await connect(server.url, name=f"test-{agent_id}", auth=auth, reconnect=False)


async def as_clerk(server: NatsServer) -> GuardedClient:
    return await as_agent(server, "clerk", principals_of(server).clerk)


async def as_mallory(server: NatsServer) -> GuardedClient:
    return await as_agent(server, "mallory", principals_of(server).mallory)


async def as_executor(server: NatsServer, adapter: str, key: Path) -> GuardedClient:
    auth = server.auth(key, executor_inbox(adapter))
    return await connect(server.url, name=f"test-exec-{adapter}", auth=auth, reconnect=False)


async def as_reader(server: NatsServer) -> GuardedClient:
    auth = server.auth(principals_of(server).reader_key, reader_inbox("audit"))
    return await connect(server.url, name="test-reader", auth=auth, reconnect=False)


async def as_admin(server: NatsServer) -> GuardedClient:
    """The tests' own unrestricted principal (a server that grants too much)."""
    return await connect(server.url, name="test-admin", auth=server.admin, reconnect=False)
