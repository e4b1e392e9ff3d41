"""Opening a kernel: read the configuration, restore, construct, and enter it.

:func:`open_kernel` is the one way to obtain a :class:`~kernel.api.Kernel`. It
reads what the configuration names (the packs and their adapters, the operator
keyring, telemetry, the chain key, the checkpoint key, the subject key store of
personal fields), opens the journal and the checkpoints' publishers, restores the projections
from it (latest trusted snapshot, then the events after it, whose chain it checks
first), constructs the kernel and enters it: the kernel starts, recovers, runs and
stops itself (:mod:`kernel.api.lifetime`). With a bus configured, the mesh serves
agents in other processes for the body of the block.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import os
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from os import PathLike

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kernel.adapters.contract import Adapter
from kernel.api import Kernel
from kernel.api.lifetime import Checkpoints
from kernel.config import KernelConfig, Storage
from kernel.core.ports import Clock, IdSource, RandomIds, SeededIds, SystemClock
from kernel.inbox import read_keyring
from kernel.inbox.keyring import ENV as KEYRING_ENV
from kernel.journal.opening import open_journal
from kernel.journal.store import chain_key_from, chain_key_from_env
from kernel.policy.packs import PackError, PolicyCatalog, PolicyPack
from kernel.proofs.erasure import (
    KEYS_ENV,
    ErasureError,
    OpeningAdapter,
    Sealer,
    SubjectKeys,
    check_personal,
    keys_location,
    personal_fields,
)
from kernel.proofs.publish import Publisher, open_publishers
from kernel.proofs.signing import (
    Signer,
    Signing,
    default_origin,
    load_signing_key,
    signing_from_env,
)
from kernel.state.projections import built_in
from kernel.state.snapshots import restore
from kernel.telemetry import Telemetry


@asynccontextmanager
async def _bus(kernel: Kernel, config: KernelConfig) -> AsyncIterator[None]:
    """Serve agents hosted in other processes over the bus, if one is configured."""
    url = config.bus or os.environ.get("DIRK_BUS")
    if not url:
        yield
        return
    from kernel.mesh import kernel_auth, open_mesh  # imports nats: only with a bus

    timeout_s = config.limits.reasoning_timeout_s
    auth = kernel_auth(config.bus_key, config.bus_tls)
    async with open_mesh(kernel, url, reasoning_timeout_s=timeout_s, auth=auth):
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
    # The kernel's own executors are built in (kernel.api.wiring adds them where a pack needs them).
    _check_adapters(catalog, adapters)
    clock = config.ports.clock or SystemClock()
    telemetry = _telemetry_of(config)
    # The checkpoint key, read before anything starts: a bad key stops the open (its
    # message names where the key came from, never the key).
    signing = config.signing or signing_from_env()
    signing_key = load_signing_key(signing.key_file) if signing is not None else None
    storage = config.storage
    where = os.fspath(path)
    # Personal fields are sealed before anything judges them: a pack whose rules read one
    # is refused (a verdict must not depend on what erasure can take).
    check_personal(catalog)
    ids = config.ports.ids or RandomIds()
    sealer = _sealer(catalog, where, config, ids, clock)
    if sealer is not None:
        adapters = _opening(adapters, catalog, sealer)
    key = _chain_key(storage, where)
    async with (
        open_journal(
            path,
            clock=clock,
            synchronous=storage.synchronous,
            faults=storage.faults,
            chain_key=key,
            compress=storage.compress,
            grace_s=storage.outage_grace_s,
            probe_s=storage.outage_probe_s,
        ) as journal,
        open_publishers(signing.publish if signing is not None else ()) as publishers,
    ):
        # The latest snapshot that matches its checkpoint, then the events after it.
        projections = await restore(journal, config.limits.keep_finished)
        # What replay built lives as long as the kernel: keep the collector off it.
        gc.freeze()
        checkpoints = _checkpoints(signing, signing_key, publishers, journal.journal_id)
        kernel = Kernel(
            journal,
            projections,
            catalog,
            adapters,
            allow,
            config,
            clock=clock,
            ids=ids,
            telemetry=telemetry,
            keyring=keyring,
            keyring_path=keyring_path,
            sealer=sealer,
            checkpoints=checkpoints,
        )
        async with kernel, _bus(kernel, config):
            yield kernel


def _check_adapters(catalog: PolicyCatalog, adapters: Mapping[str, Adapter]) -> None:
    """Refuse to start without an adapter for every kind (the kernel's own are built in)."""
    missing = [n for n in catalog.adapters_needed() if n not in adapters and n not in built_in()]
    if missing:
        raise PackError(f"no adapter registered for {', '.join(missing)}")


def _telemetry_of(config: KernelConfig) -> Telemetry:
    """The kernel's telemetry: as configured, else from its tracer provider or the environment."""
    if config.telemetry is not None:
        return config.telemetry
    provider = config.tracer_provider
    return Telemetry.from_provider(provider) if provider is not None else Telemetry.from_env()


def _chain_key(storage: Storage, where: str) -> bytes | None:
    """The journal's chain key: configured, else ``DIRK_CHAIN_KEY``, else none."""
    key = chain_key_from(storage.chain_key, where) if storage.chain_key is not None else None
    return key or chain_key_from_env(None, where)


def _checkpoints(
    signing: Signing | None,
    signing_key: Ed25519PrivateKey | None,
    publishers: list[Publisher],
    journal_id: str,
) -> Checkpoints | None:
    """The signer of the journal's checkpoints, when a signing key is configured."""
    if signing is None or signing_key is None:
        return None
    signer = Signer(signing_key, signing.origin or default_origin(journal_id))
    return Checkpoints(signer, publishers, signing.every_s)


def _sealer(
    catalog: PolicyCatalog, where: str, config: KernelConfig, ids: IdSource, clock: Clock
) -> Sealer | None:
    """The sealer of personal fields, if a kind has any (its key store opened)."""
    if not any(personal_fields(kind) for kind in catalog.kinds.values()):
        return None
    location = keys_location(where, config.subject_keys)
    if location is None:
        raise ErasureError(
            "a kind has personal fields: give the subject key store (KernelConfig.subject_keys"
            f" or {KEYS_ENV}) for a journal on PostgreSQL"
        )

    # OS randomness, except in a simulation on seeded ids, whose runs must repeat: its keys
    # come from its seed (never drawn from the ids, which would move every DFID after).
    if isinstance(ids, SeededIds):
        seed = hashlib.sha256(f"dirk-seal {ids.seed}".encode()).digest()
    else:
        seed = os.urandom(32)
    counter = itertools.count()

    def random(n: int) -> bytes:
        # SHA-256 in counter mode over a 256-bit secret: keys and nonces nobody predicts
        # from the nonces they see.
        return hashlib.sha256(b"dirk-seal" + seed + next(counter).to_bytes(8, "big")).digest()[:n]

    return Sealer(catalog, SubjectKeys(location), random, clock.now_ns)


def _opening(
    adapters: Mapping[str, Adapter], catalog: PolicyCatalog, sealer: Sealer
) -> dict[str, Adapter]:
    """Wrap the adapters of kinds with personal fields: they get the values, nobody else."""
    names = {kind.adapter for kind in catalog.kinds.values() if personal_fields(kind)}
    return {
        name: OpeningAdapter(adapter, sealer) if name in names else adapter
        for name, adapter in adapters.items()
    }
