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
import os
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from os import PathLike

import anyio

from kernel.adapters.contract import Adapter, RetryPolicy
from kernel.api import Kernel
from kernel.core import events
from kernel.core.errors import KernelShutdown
from kernel.core.events import Draft, FlowAborted, KernelStarted
from kernel.core.flow import FlowStatus
from kernel.core.ports import Clock, IdSource, RandomIds, SystemClock
from kernel.core.reasons import ReasonCode, StopReason
from kernel.escalation import EscalationPolicy
from kernel.guards import GUARD_TIMEOUT_S
from kernel.journal.store import (
    Journal,
    JournalClosed,
    JournalError,
    JournalFaults,
    JournalWriteFailed,
    chain_key_from,
    chain_key_from_env,
    open_journal,
)
from kernel.memory import MemoryExecutor
from kernel.policy.packs import PackError, PolicyCatalog, PolicyPack
from kernel.registry import KERNEL_VERSION
from kernel.runtime.actors import RestartIntensityExceeded, Supervisor
from kernel.runtime.messages import Recover
from kernel.state.memory import MEMORY_ADAPTER
from kernel.state.projections import Projections
from kernel.state.rulebook import Promoter, RuleSearch
from kernel.state.snapshots import CHECKPOINT_EVERY, Checkpointer, restore
from kernel.telemetry import Telemetry

KEEP_FINISHED = 10_000
"""Finished flows a kernel keeps in memory unless ``open_kernel`` is told otherwise."""


@asynccontextmanager
async def open_kernel(
    path: str | PathLike[str],
    *,
    packs: Sequence[PolicyPack],
    adapters: Mapping[str, Adapter],
    allow: Collection[str],
    clock: Clock | None = None,
    ids: IdSource | None = None,
    telemetry: Telemetry | None = None,
    synchronous: str = "FULL",
    agent_concurrency: int = 64,
    max_in_flight: int = 2048,
    max_restarts: int = 3,
    restart_period_s: float = 5.0,
    faults: JournalFaults | None = None,
    retry: RetryPolicy | None = None,
    jitter_seed: int | None = None,
    escalation: EscalationPolicy | None = None,
    inbox_poll_s: float | None = 1.0,
    token_budget: int | None = None,
    reasoning_timeout_s: float | None = None,
    checkpoint_every: int = CHECKPOINT_EVERY,
    guard_timeout_s: float = GUARD_TIMEOUT_S,
    rule_search: RuleSearch | None = None,
    keep_finished: int | None = KEEP_FINISHED,
    chain_key: bytes | str | None = None,
) -> AsyncIterator[Kernel]:
    """Open a kernel on the journal at ``path`` and run it for the body of the block.

    Args:
        path: the SQLite journal (created if missing).
        packs: the policy packs; the kernel refuses to start on an invalid one.
        adapters: the adapters by name; every policy kind's adapter must be present.
        allow: the agent ids allowed to register.
        clock: the time port (default: the system clock).
        ids: the DFID and token port (default: OS randomness).
        telemetry: span export (default: configured from the ``OTEL_*`` environment).
        synchronous: SQLite's synchronous setting; FULL is the durable default.
        agent_concurrency: flows one hosted agent reasons about at once.
        max_in_flight: flows moving at once; triggers wait for room beyond it.
        max_restarts: actor restarts allowed within ``restart_period_s``.
        restart_period_s: the window of the restart intensity.
        faults: fault injection for tests.
        retry: the retry policy of adapters without a ``retry_policy`` of their own.
        jitter_seed: seeds the backoff jitter (default: OS randomness).
        escalation: approval expiry, the escalation budget per agent and the silence
            watchdog (default: approvals expire after an hour, 3 escalations per agent
            per hour, no watchdog).
        inbox_poll_s: how often (on ``clock``) to read the operator inbox and tick the
            escalation manager; None: neither (decisions only through :meth:`Kernel.decide`).
        token_budget: the most tokens one flow's reasoning may report spending in all
            attempts together (None: no cap).
        reasoning_timeout_s: the longest one reasoning step may take on ``clock`` (None: no cap).
        checkpoint_every: events between projection checkpoints and snapshots (0: none).
        guard_timeout_s: how long a soft guard may take before its flow is flagged anyway.
        rule_search: how rules relevant to a flow are found for its context (default:
            lexical search; a vector search plugs in through the same port).
        keep_finished: finished flows kept in memory for :meth:`Kernel.flow` and
            :meth:`Kernel.flows` (the most recently ended); older ones are read back
            from the journal by :meth:`Kernel.wait_flow` and when a request names
            them. None keeps every one (memory then grows with each flow).
        chain_key: the journal's chain key, at least 16 bytes (default: ``DIRK_CHAIN_KEY``,
            if set): every hash becomes an HMAC under it, so whoever can write the file
            but lacks the key cannot forge an event that verifies. A new journal is
            keyed with it; a keyed journal refuses to open without it or with another.

    Raises:
        PackError: on an invalid policy pack or a missing adapter.
        JournalError: when the journal cannot be opened (corrupt, foreign, too new), fails
            its chain check from the latest trusted snapshot on (``JournalCorrupt``,
            with the seq), or the chain key does not fit (``JournalKeyError``).
        KernelShutdown: when the kernel had to stop (restart intensity, journal failure).
    """
    catalog = PolicyCatalog(packs)
    # The memory executor is built in: it records memory events in this journal.
    missing = [
        name
        for name in catalog.adapters_needed()
        if name not in adapters and name != MEMORY_ADAPTER
    ]
    if missing:
        raise PackError(f"no adapter registered for {', '.join(missing)}")
    clock = clock or SystemClock()
    telemetry = telemetry if telemetry is not None else Telemetry.from_env()
    where = os.fspath(path)
    key = chain_key_from(chain_key, where) if chain_key is not None else None
    key = key or chain_key_from_env(None, where)
    async with open_journal(
        path, clock=clock, synchronous=synchronous, faults=faults, chain_key=key
    ) as journal:
        # The latest snapshot that matches its checkpoint, then the events after it.
        projections = await restore(journal, keep_finished)
        # One promoter for agents' rule proposals (the memory executor) and operators'.
        promoter = Promoter(lambda: projections.memory.rulebook, journal.append)
        if MEMORY_ADAPTER in catalog.adapters_needed() and MEMORY_ADAPTER not in adapters:
            adapters = {
                **adapters,
                MEMORY_ADAPTER: MemoryExecutor(projections, journal.append, promoter),
            }
        # What replay built lives as long as the kernel: keep the collector off it.
        gc.freeze()
        kernel = Kernel(
            journal,
            projections,
            catalog,
            adapters,
            clock,
            ids or RandomIds(),
            allow,
            agent_concurrency,
            max_in_flight,
            retry,
            jitter_seed,
            escalation,
            token_budget,
            reasoning_timeout_s,
            guard_timeout_s,
            rule_search,
            promoter=promoter,
        )
        if checkpoint_every > 0:
            kernel._checkpointer = Checkpointer(checkpoint_every, journal.head_seq)
        journal.set_guard(projections.guard)
        journal.add_listener(kernel._on_commit)
        await journal.append(
            [
                Draft(
                    payload=KernelStarted(
                        kernel_version=KERNEL_VERSION,
                        packs=catalog.refs(),
                        head_seq=journal.head_seq,
                        head_hash=journal.head_hash,
                    )
                )
            ]
        )
        await _abort_interrupted(journal, projections)
        supervisor = Supervisor(
            kernel.specs,
            append=journal.append,
            projections=projections,
            clock=clock,
            on_dead_letter=kernel._on_dead_letter,
            max_restarts=max_restarts,
            period_s=restart_period_s,
            fatal=(JournalError,),
        )
        failure: KernelShutdown | None = None
        body_error: Exception | None = None
        exported = [journal.head_seq]
        if telemetry.enabled:
            # Flows an earlier run left open: their spans need their beginnings too.
            for flow in list(projections.flows.values()):
                if not flow.terminal:
                    telemetry.emit(await journal.read(stop=exported[0] + 1, dfid=flow.dfid))
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_supervise, kernel, supervisor, name="supervisor")
                if inbox_poll_s is not None:
                    tg.start_soon(kernel._poll_inbox, inbox_poll_s, name="operator-inbox")
                if kernel._checkpointer is not None:
                    tg.start_soon(kernel._checkpointer.run, journal, name="checkpoints")
                if telemetry.enabled:
                    tg.start_soon(_export, telemetry, journal, exported, name="telemetry")
                async with (
                    anyio.create_task_group() as agents_tg,
                    anyio.create_task_group() as effects_tg,
                ):
                    kernel.agents.tg = agents_tg
                    kernel._effects_tg = effects_tg
                    # What an earlier run left between acceptance and a recorded end.
                    kernel.execution_mailbox.send_nowait(Recover())
                    try:
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
            stopped = [e for e in _leaves(group) if isinstance(e, KernelShutdown)]
            if not stopped:
                raise
            failure = stopped[0]
        finally:
            kernel._stop(StopReason.KERNEL_CLOSED)
            for mailbox in [*(spec.mailbox for spec in kernel.specs), *kernel._hosts.values()]:
                mailbox.close()
            with anyio.CancelScope(shield=True):
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
                if telemetry.enabled:
                    # Spans of what committed after the exporter's last batch.
                    telemetry.emit(await journal.read(exported[0] + 1))
                    await anyio.to_thread.run_sync(telemetry.shutdown)
        if failure is not None:
            raise failure
        if body_error is not None:
            raise body_error


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


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            leaves.extend(_leaves(exc))
        else:
            leaves.append(exc)
    return leaves
