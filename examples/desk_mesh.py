"""The driver's side of ``python -m examples.trading --bus``: the desk's agents in host processes.

:func:`hosted_desk` starts one ``python -m agents_sdk.serve`` process per agent, one at a
time (each handshakes before the next starts, so the sessions are made in the same order
as in one process), hands each its credential in the environment, and gives the driver
what it needs of the agents: their stalls (answered over NATS, see
:mod:`examples.desk_hosts`) and a way to resend a recorded proposal.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc

from examples.desk import Stall
from examples.desk_hosts import HOSTS, stall_subject

START_S = 120.0
"""The longest one host may take to start and handshake."""


class HostFailed(Exception):
    """An agent host process did not start (its output says why)."""


class RemoteStall(Stall):
    """The driver's view of a hosted agent's stall: the host asks, the driver's resume answers."""

    async def on_stall(self, msg: Any) -> None:
        self.stalled.set()
        await self.resume.wait()
        self.stalled, self.resume = anyio.Event(), anyio.Event()
        await msg.respond(b"")


class RemoteAgent:
    """What the driver reaches of an agent hosted in another process."""

    def __init__(self) -> None:
        self.stall = RemoteStall()
        self.sent: dict[str, Any] = {}  # the proposals stay in the host process


def credential_env(agent_id: str) -> str:
    """The environment variable ``agents_sdk.serve`` reads ``agent_id``'s credential from."""
    return "DIRK_CREDENTIAL_" + agent_id.upper().replace("-", "_")


async def _start(command: list[str], env: dict[str, str]) -> anyio.abc.Process:
    process = await anyio.open_process(command, env=env, stdout=subprocess.PIPE, stderr=None)
    assert process.stdout is not None
    buffer = b""
    with anyio.fail_after(START_S):
        while b"READY" not in buffer:
            try:
                buffer += await process.stdout.receive()
            except anyio.EndOfStream:
                failed = f"the agent host {command[-1]} exited before it was ready"
                raise HostFailed(failed) from None
    return process


@asynccontextmanager
async def hosted_desk(
    url: str,
    journal_id: str,
    credentials: Mapping[str, str],
    *,
    seed: int,
    minutes: int,
    llm: str,
) -> AsyncIterator[tuple[dict[str, RemoteAgent], Callable[[str, str], Awaitable[None]]]]:
    """Start a host process per agent of ``credentials``; yield the agents and a resender."""
    import nats

    run = secrets.token_hex(6)
    agents = {agent_id: RemoteAgent() for agent_id in credentials}
    nc = await nats.connect(url, name="trading-driver")
    processes: list[anyio.abc.Process] = []
    try:
        for agent_id, agent in agents.items():
            await nc.subscribe(stall_subject(run, agent_id), cb=agent.stall.on_stall)
        base = dict(
            os.environ,
            DIRK_BUS=url,
            TRADING_SEED=str(seed),
            TRADING_MINUTES=str(minutes),
            TRADING_LLM=llm,
            TRADING_RUN=run,
        )
        for agent_id, credential in credentials.items():
            env = base | {credential_env(agent_id): credential}
            spec = f"examples.desk_hosts:{HOSTS[agent_id]}"
            command = [sys.executable, "-m", "agents_sdk.serve", "--bus", url, spec]
            processes.append(await _start(command, env))
        js = nc.jetstream()

        async def resend(owner: str, dfid: str) -> None:
            # The host's client sends its last proposal for the flow again: the same
            # message, id and all. JetStream's duplicate window absorbs it on the bus.
            import nats.js.errors

            try:
                last = await js.get_last_msg("DIRK_PROPOSALS", f"dirk.proposals.{owner}")
            except nats.js.errors.NotFoundError:
                return
            headers = dict(last.headers or {})
            if not headers.get("Nats-Msg-Id", "").startswith(f"{journal_id}:{dfid}:"):
                return
            if not (last.data or b"").startswith(b'{"proposal"'):
                return  # it withdrew: nothing to send again
            await js.publish(f"dirk.proposals.{owner}", last.data or b"", headers=headers)

        yield agents, resend
    finally:
        for process in processes:
            if process.returncode is None:
                process.terminate()
        with anyio.CancelScope(shield=True):
            for process in processes:
                with anyio.move_on_after(10):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                await process.aclose()
            await nc.close()
