"""Opening a kernel: read the configuration, restore, construct, and enter it.

:func:`open_kernel` is the one way to obtain a :class:`~kernel.api.Kernel`. It
reads what the configuration names (the packs and their adapters, the operator
keyring, telemetry, the chain key), opens the journal, restores the projections
from it (latest trusted snapshot, then the events after it, whose chain it checks
first), constructs the kernel and enters it: the kernel starts, recovers, runs and
stops itself (:mod:`kernel.lifetime`). With a bus configured, the mesh serves
agents in other processes for the body of the block.
"""

from __future__ import annotations

import gc
import os
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from os import PathLike

from kernel.adapters.contract import Adapter
from kernel.api import Kernel
from kernel.config import KernelConfig
from kernel.core.ports import RandomIds, SystemClock
from kernel.inbox import read_keyring
from kernel.inbox.keyring import ENV as KEYRING_ENV
from kernel.journal.opening import open_journal
from kernel.journal.store import chain_key_from, chain_key_from_env
from kernel.policy.packs import PackError, PolicyCatalog, PolicyPack
from kernel.state.beliefs import BUILT_IN
from kernel.state.snapshots import restore
from kernel.telemetry import Telemetry


@asynccontextmanager
async def _bus(kernel: Kernel, config: KernelConfig) -> AsyncIterator[None]:
    """Serve agents hosted in other processes over the bus, if one is configured."""
    url = config.bus or os.environ.get("DIRK_BUS")
    if not url:
        yield
        return
    from kernel.mesh import open_mesh  # imports nats: only with a bus

    timeout_s = config.limits.reasoning_timeout_s
    async with open_mesh(kernel, url, reasoning_timeout_s=timeout_s):
        yield


@asynccontextmanager
async def open_kernel(
    path: str | PathLike[str],
    *,
    packs: Sequence[PolicyPack],
    adapters: Mapping[str, Adapter],
    allow: Collection[str],
    config: KernelConfig = KernelConfig(),
) -> AsyncIterator[Kernel]:
    """Open a kernel on the journal at ``path`` and run it for the body of the block.

    Args:
        path: the SQLite journal (created if missing).
        packs: the policy packs; the kernel refuses to start on an invalid one.
        adapters: the adapters by name; every policy kind's adapter must be present.
        allow: the agent ids allowed to register.
        config: limits, supervision, storage, ports, telemetry, escalation and retry
            (:class:`~kernel.config.KernelConfig`; the defaults suit production).

    Raises:
        PackError: on an invalid policy pack or a missing adapter.
        KeyringError: the operator keyring (``config.keyring`` or ``DIRK_KEYRING``) cannot
            be read, others may write it, or a line of it is bad.
        JournalError: when the journal cannot be opened (corrupt, foreign, too new), fails
            its chain check from the latest trusted snapshot on (``JournalCorrupt``,
            with the seq), or the chain key does not fit (``JournalKeyError``).
        KernelShutdown: when the kernel had to stop (restart intensity, journal failure).
    """
    catalog = PolicyCatalog(packs)
    # The inbox's root of trust, read before anything starts: a bad keyring stops the open.
    keyring_path = config.keyring or os.environ.get(KEYRING_ENV) or None
    keyring = read_keyring(keyring_path) if keyring_path else None
    # The kernel's own executors are built in (kernel.wiring adds them where a pack needs them).
    missing = [n for n in catalog.adapters_needed() if n not in adapters and n not in BUILT_IN]
    if missing:
        raise PackError(f"no adapter registered for {', '.join(missing)}")
    clock = config.ports.clock or SystemClock()
    telemetry = config.telemetry
    if telemetry is None:
        provider = config.tracer_provider
        telemetry = (
            Telemetry.from_provider(provider) if provider is not None else Telemetry.from_env()
        )
    storage = config.storage
    where = os.fspath(path)
    key = chain_key_from(storage.chain_key, where) if storage.chain_key is not None else None
    key = key or chain_key_from_env(None, where)
    async with open_journal(
        path,
        clock=clock,
        synchronous=storage.synchronous,
        faults=storage.faults,
        chain_key=key,
        compress=storage.compress,
    ) as journal:
        # The latest snapshot that matches its checkpoint, then the events after it.
        projections = await restore(journal, config.limits.keep_finished)
        # What replay built lives as long as the kernel: keep the collector off it.
        gc.freeze()
        kernel = Kernel(
            journal,
            projections,
            catalog,
            adapters,
            allow,
            config,
            clock=clock,
            ids=config.ports.ids or RandomIds(),
            telemetry=telemetry,
            keyring=keyring,
            keyring_path=keyring_path,
        )
        async with kernel, _bus(kernel, config):
            yield kernel
