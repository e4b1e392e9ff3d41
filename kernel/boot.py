"""Opening a kernel: restore, wire, supervise, run the embedding code, and stop cleanly.

:func:`open_kernel` is the one way to obtain a :class:`~kernel.api.Kernel`. It
restores the projections from the journal (latest trusted snapshot, then the
events after it, whose chain it checks first), records ``KernelStarted`` with
the head it found, ends the flows an earlier run left
in an agent's mind, starts the supervised actors and the kernel's own tasks
(operator inbox, checkpoints, span export), and on the way out records
``KernelStopped`` and flushes the spans.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import itertools
import logging
import os
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from os import PathLike

import anyio

from kernel.adapters.contract import Adapter
from kernel.api import Kernel
from kernel.config import KernelConfig
from kernel.core import events
from kernel.core.errors import KernelShutdown
from kernel.core.events import Draft, FlowAborted, KernelStarted
from kernel.core.flow import FlowStatus
from kernel.core.ports import Clock, IdSource, RandomIds, SeededIds, SystemClock
from kernel.core.reasons import ReasonCode, StopReason
from kernel.core.wall import clip
from kernel.inbox import Intake, read_keyring
from kernel.inbox.keyring import ENV as KEYRING_ENV
from kernel.journal.opening import open_journal
from kernel.journal.store import (
    Journal,
    JournalClosed,
    JournalCorrupt,
    JournalError,
    JournalWriteFailed,
    chain_key_from,
    chain_key_from_env,
)
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
    record_erasures,
    run_erasures,
)
from kernel.proofs.publish import Publisher, open_publishers
from kernel.proofs.signing import (
    Signer,
    default_origin,
    load_signing_key,
    record_key,
    run_signing,
    sign_head,
    signing_from_env,
)
from kernel.registry import KERNEL_VERSION
from kernel.runtime.actors import MailboxClosed, RestartIntensityExceeded, Supervisor
from kernel.runtime.messages import Recover, Tick
from kernel.state.projections import FOLD, Projections, built_in
from kernel.state.snapshots import Checkpointer, restore
from kernel.telemetry import Telemetry
from kernel.webhooks import Webhooks

log = logging.getLogger(__name__)


async def _tick_desk(kernel: Kernel, clock: Clock, interval_s: float) -> None:
    """Tell the escalation desk, every ``interval_s`` on the clock, that time passed.

    A task of its own with nothing between two sleeps but the send: a test that
    advances a manual clock once always finds it asleep, so the desk sees the new time
    (the inbox poller, which used to tick it, hops to threads between its sleeps).
    """
    with contextlib.suppress(KernelShutdown, MailboxClosed):
        while True:
            await clock.sleep(interval_s)
            await kernel.actors.escalation.send(Tick())


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
    # The kernel's own executors are built in (kernel.wiring adds them where a pack needs them).
    missing = [n for n in catalog.adapters_needed() if n not in adapters and n not in built_in()]
    if missing:
        raise PackError(f"no adapter registered for {', '.join(missing)}")
    clock = config.ports.clock or SystemClock()
    telemetry = config.telemetry
    if telemetry is None:
        provider = config.tracer_provider
        telemetry = (
            Telemetry.from_provider(provider) if provider is not None else Telemetry.from_env()
        )
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
    key = chain_key_from(storage.chain_key, where) if storage.chain_key is not None else None
    key = key or chain_key_from_env(None, where)
    async with (
        open_journal(
            path,
            clock=clock,
            synchronous=storage.synchronous,
            faults=storage.faults,
            chain_key=key,
            compress=storage.compress,
        ) as journal,
        open_publishers(signing.publish if signing is not None else ()) as publishers,
    ):
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
            ids=ids,
        )
        kernel.operator_keyring = lambda: keyring
        kernel._sealer = sealer
        if storage.checkpoint_every > 0:
            kernel._checkpointer = Checkpointer(storage.checkpoint_every, journal.head_seq)
        journal.set_transition_check(projections.transition_check)
        journal.add_listener(kernel._on_commit)
        if telemetry.measures:
            # Commit latency and mailbox depths: measured, not recorded.
            telemetry.install(journal, lambda: _mailbox_depths(kernel))
        await journal.append(
            [
                Draft(
                    payload=KernelStarted(
                        kernel_version=KERNEL_VERSION,
                        packs=catalog.refs(),
                        head_seq=journal.head_seq,
                        head_hash=journal.head_hash,
                        fold=FOLD,
                        allow=_recordable(allow),
                    )
                )
            ]
        )
        await _abort_interrupted(journal, projections)
        if sealer is not None:
            await record_erasures(journal, sealer.keys)
        signer: Signer | None = None
        if signing is not None and signing_key is not None:
            signer = Signer(signing_key, signing.origin or default_origin(journal.journal_id))
            await record_key(journal, signer)
        supervisor = Supervisor(
            kernel.actors.specs,
            append=journal.append,
            projections=projections,
            clock=clock,
            on_dead_letter=kernel._on_dead_letter,
            max_restarts=config.supervision.max_restarts,
            period_s=config.supervision.restart_period_s,
            fatal=(JournalError,),
        )
        failure: KernelShutdown | None = None
        body_error: Exception | None = None
        exported = [journal.head_seq]
        if telemetry.enabled:
            # Flows an earlier run left open: their spans need their beginnings too.
            for flow in list(projections.flows.values()):
                if not flow.terminal:
                    telemetry.resume(await journal.read(stop=exported[0] + 1, dfid=flow.dfid))
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_supervise, kernel, supervisor, name="supervisor")
                tg.start_soon(_check_history, kernel, journal, name="history-check")
                poll_s = config.supervision.inbox_poll_s
                if poll_s is not None:
                    intake = Intake(
                        journal,
                        projections,
                        keyring,
                        keyring_path,
                        kernel.apply,
                    )
                    # The roles a quorum counts come from the keyring as last read.
                    kernel.operator_keyring = lambda: intake.keyring
                    tg.start_soon(intake.run, clock, poll_s, name="operator-inbox")
                    tg.start_soon(_tick_desk, kernel, clock, poll_s, name="desk-ticker")
                if kernel._checkpointer is not None:
                    tg.start_soon(kernel._checkpointer.run, journal, name="checkpoints")
                if config.webhooks:
                    # Beside the kernel, never in its way: they follow what commits.
                    hooks = Webhooks(config.webhooks, journal, projections, clock)
                    tg.start_soon(hooks.run, journal.head_seq + 1, name="webhooks")
                if sealer is not None and poll_s is not None:
                    # On the inbox's cadence (and at open and close, always).
                    tg.start_soon(
                        run_erasures, journal, sealer.keys, clock, poll_s, name="erasures"
                    )
                if signer is not None and signing is not None and signing.every_s is not None:
                    tg.start_soon(
                        run_signing,
                        journal,
                        signer,
                        clock,
                        signing.every_s,
                        publishers,
                        name="signed-checkpoints",
                    )
                if telemetry.enabled:
                    tg.start_soon(_export, telemetry, journal, exported, name="telemetry")
                async with (
                    anyio.create_task_group() as agents_tg,
                    anyio.create_task_group() as effects_tg,
                ):
                    kernel.actors.agents.tg = agents_tg
                    if telemetry.enabled:
                        kernel.actors.agents.trace_scope = telemetry.reasoning
                    kernel._effects_tg = effects_tg
                    # What an earlier run left between acceptance and a recorded end.
                    kernel.actors.execution.send_nowait(Recover())
                    try:
                        async with _bus(kernel, config):
                            yield kernel
                    except Exception as exc:
                        # Re-raised outside the task groups: the caller sees it, not a group.
                        body_error = exc
                    finally:
                        agents_tg.cancel_scope.cancel()
                        effects_tg.cancel_scope.cancel()
                kernel._stop(StopReason.KERNEL_CLOSED)
                tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            leaves = _leaves(group)
            stopped = [e for e in leaves if isinstance(e, KernelShutdown)]
            faults = [e for e in leaves if isinstance(e, Exception)]
            if stopped:
                failure = stopped[0]
            elif faults:
                # A task raised what nothing handles: recorded as the fault it is, never as
                # a clean close, and raised as a KernelShutdown that carries it.
                log.error("the kernel stopped on a fault", exc_info=faults[0])
                failure = KernelShutdown(StopReason.KERNEL_FAILED, _fault(faults[0]))
                failure.__cause__ = faults[0]
                kernel._stop(failure.reason, failure.detail)
            else:
                raise
        finally:
            kernel._stop(StopReason.KERNEL_CLOSED)
            for mailbox in [
                *(spec.mailbox for spec in kernel.actors.specs),
                *kernel._hosts.values(),
                *kernel.actors.agents.retired,
            ]:
                mailbox.close()
            with anyio.CancelScope(shield=True):
                if sealer is not None:
                    with contextlib.suppress(JournalClosed, JournalWriteFailed):
                        await record_erasures(journal, sealer.keys)
                    sealer.keys.close()
                reason = failure.reason if failure else StopReason.KERNEL_CLOSED
                detail = failure.detail if failure else ""
                with contextlib.suppress(JournalClosed, JournalWriteFailed):
                    # Not recordable when the journal failed or was closed under us.
                    await journal.append(
                        [
                            Draft(
                                payload=events.KernelStopped(
                                    reason=reason,
                                    detail=detail,
                                    head_seq=journal.head_seq,
                                    head_hash=journal.head_hash,
                                )
                            )
                        ]
                    )
                if signer is not None:
                    await _sign_last(journal, signer, publishers)
                if telemetry.enabled:
                    # Spans of what committed after the exporter's last batch.
                    telemetry.emit(await journal.read(exported[0] + 1))
                    await anyio.to_thread.run_sync(telemetry.shutdown)
                with contextlib.suppress(Exception):
                    await kernel._close_artifacts()
        if failure is not None:
            raise failure
        if body_error is not None:
            raise body_error


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


async def _sign_last(journal: Journal, signer: Signer, publishers: list[Publisher]) -> None:
    """Sign a checkpoint of the whole journal as the kernel leaves it (KernelStopped included)."""
    if journal.failed:
        return
    try:
        await sign_head(journal, signer, publishers)
    except JournalError as exc:
        log.warning("the closing checkpoint was not signed: %s", exc.detail)


def _recordable(allow: Collection[str]) -> list[str]:
    """The allowed agent ids KernelStarted records: the strings that are UTF-8 text.

    Clients read them to refuse a request for an agent the kernel would not know; an id
    that cannot be recorded cannot register either.
    """
    ids = []
    for agent_id in allow:
        if not isinstance(agent_id, str):
            continue
        try:
            agent_id.encode("utf-8")
        except UnicodeEncodeError:
            continue
        ids.append(agent_id)
    return sorted(ids)


def _mailbox_depths(kernel: Kernel) -> dict[str, int]:
    """How many messages wait in each actor's mailbox and each agent host's."""
    depths = {spec.name: spec.mailbox.pending() for spec in kernel.actors.specs}
    for agent_id, mailbox in list(kernel._hosts.items()):
        depths[f"agent:{agent_id}"] = mailbox.pending()
    return depths


async def _abort_interrupted(journal: Journal, projections: Projections) -> None:
    """End the flows an earlier run left in memory (an agent thinking), saying so.

    Their reasoning died with that process; nothing was accepted, so there is
    nothing to resume, and a flow never just disappears.
    """
    interrupted = [
        projections.flows[dfid]
        for dfid in sorted(projections.moving)
        if projections.flows[dfid].status
        in (FlowStatus.CREATED, FlowStatus.ACTIVE, FlowStatus.VALIDATING)
    ]
    detail = "the kernel stopped while this flow was being reasoned about; it was not resumed"
    await journal.append(
        [
            Draft(
                payload=FlowAborted(reason_code=ReasonCode.INTERRUPTED, detail=detail),
                dfid=flow.dfid,
                parent_dfid=flow.parent_dfid,
                agent_id=flow.agent_id,
                caused_by=flow.last_seq,
            )
            for flow in interrupted
        ]
    )


async def _export(telemetry: Telemetry, journal: Journal, exported: list[int]) -> None:
    """Feed committed events to telemetry as they commit."""
    async with journal.subscribe(exported[0] + 1) as batches:
        async for batch in batches:
            telemetry.emit(batch)
            exported[0] = batch[-1].seq


async def _supervise(kernel: Kernel, supervisor: Supervisor) -> None:
    try:
        await supervisor.run()
    except RestartIntensityExceeded as exc:
        kernel._stop(StopReason.RESTART_INTENSITY_EXCEEDED, str(exc))
        raise kernel._stop_reason from exc  # type: ignore[misc]
    except JournalError as exc:
        kernel._stop(StopReason.JOURNAL_FAILED, str(exc))
        raise kernel._stop_reason from exc  # type: ignore[misc]


async def _check_history(kernel: Kernel, journal: Journal) -> None:
    """Check the chain before the snapshot the kernel opened from; stop the kernel if it fails.

    Opening checked only the events after that snapshot, to be ready at once; reads of
    the events before it wait for this check. A journal edited there is refused as one
    edited after it is at open: the kernel stops (HISTORY_CORRUPT, recorded).
    """
    try:
        await journal.check_history()
    except JournalCorrupt as exc:
        kernel._stop(StopReason.HISTORY_CORRUPT, str(exc))
        raise kernel._stop_reason from exc  # type: ignore[misc]


def _fault(exc: BaseException) -> str:
    """What a fault's record says: its type and message, printable, bounded."""
    return clip(f"{type(exc).__name__}: {exc}", 1000)


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            leaves.extend(_leaves(exc))
        else:
            leaves.append(exc)
    return leaves
