"""One kernel's life: start, recover, run and stop, from KernelStarted to KernelStopped.

A :class:`~kernel.api.Kernel` is an async context manager, and entering it is
:meth:`Lifetime.running`: it records ``KernelStarted`` with the head it found, ends
the flows an earlier run left in an agent's mind, records the erasures done while no
kernel ran and the checkpoint key, starts the supervised actors and the kernel's own
tasks (operator inbox, the escalation desk's ticker, checkpoints, span export, the
history check, webhooks, erasures, signed checkpoints), resumes the executions an
earlier run left unfinished, and runs the body. On the way out it stops the kernel
(every caller and waiter is released), closes the mailboxes, records the last
erasures and ``KernelStopped`` with why, signs a checkpoint of the whole journal,
flushes the spans and closes the artifact store.

A task that fails stops the kernel: the supervisor past its restart intensity or on
a journal failure, the history check on an edited journal, anything unhandled as
KERNEL_FAILED. The stop is recorded, and raised to the embedding code as a
:class:`~kernel.core.errors.KernelShutdown`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskGroup

from kernel.api.calls import Calls, Flows
from kernel.api.documents import Artifacts
from kernel.api.drift import DriftWatch
from kernel.api.wiring import Actors
from kernel.config import KernelConfig
from kernel.core import events
from kernel.core.errors import KernelFault, KernelShutdown
from kernel.core.events import Draft, Feedback, FlowAborted, KernelStarted
from kernel.core.flow import FlowStatus
from kernel.core.ports import Clock
from kernel.core.reasons import ReasonCode, StopReason
from kernel.core.wall import clip
from kernel.inbox import InboxRequest, Intake, Keyring, Proof
from kernel.journal.store import (
    Journal,
    JournalClosed,
    JournalCorrupt,
    JournalError,
    JournalWriteFailed,
)
from kernel.policy.contracts import Outcome, Verdict
from kernel.policy.packs import PolicyCatalog
from kernel.proofs.erasure import Sealer, record_erasures, run_erasures
from kernel.proofs.publish import Publisher
from kernel.proofs.signing import Signer, record_key, run_signing, sign_head
from kernel.registry import KERNEL_VERSION
from kernel.runtime.actors import (
    Effects,
    Mailbox,
    MailboxClosed,
    Outbox,
    Reply,
    RestartIntensityExceeded,
)
from kernel.runtime.messages import AgentMessage, Carry, Recover, Tick
from kernel.runtime.supervision import Supervisor
from kernel.state.drift import monitors_of
from kernel.state.projections import FOLD, Projections
from kernel.telemetry import Telemetry
from kernel.webhooks import Webhooks

Apply = Callable[[InboxRequest, Proof], Awaitable[Any]]
"""Turns a verified inbox request into acts (the inbox's poller calls it per row)."""

log = logging.getLogger("kernel.boot")


@dataclass(frozen=True)
class Checkpoints:
    """Signed checkpoints of the journal's tree (kernel.proofs.signing), when configured.

    Attributes:
        signer: holds the checkpoint key and the origin it signs under.
        publishers: where each signed checkpoint is published besides the journal.
        every_s: the interval between checkpoints (None: only when the kernel stops).
    """

    signer: Signer
    publishers: list[Publisher]
    every_s: float | None = None


class Lifetime:
    """Starts, recovers, runs and stops one kernel (its ``async with``).

    Args:
        journal: the open journal.
        projections: what was restored from it.
        catalog: the policy packs (recorded in KernelStarted).
        allow: the agent ids allowed to register (recorded in KernelStarted).
        config: supervision, the inbox's poll interval, limits.
        clock: the kernel's clock.
        telemetry: spans and metrics (off when not configured).
        keyring: the operator keyring and its file, when the inbox trusts keys.
        actors: the actors' mailboxes and child specs.
        calls: the calls into the actors; stopping it releases every caller.
        flows: what waits on commits; it is the journal's listener.
        hosts: the mailboxes of the agents hosted or routed, by id.
        effects: the task group adapter calls and guards run on, opened while it runs.
        artifacts: the artifact store, closed when the kernel stops.
        sealer: seals personal fields; its erasures are recorded (None: no kind has any).
        checkpoints: signs checkpoints of the journal (None: not configured).
    """

    def __init__(
        self,
        *,
        journal: Journal,
        projections: Projections,
        catalog: PolicyCatalog,
        allow: Collection[str],
        config: KernelConfig,
        clock: Clock,
        telemetry: Telemetry,
        keyring: tuple[Keyring | None, str | None],
        actors: Actors,
        calls: Calls,
        flows: Flows,
        hosts: Mapping[str, Mailbox[AgentMessage]],
        effects: Effects,
        artifacts: Artifacts | None = None,
        sealer: Sealer | None = None,
        checkpoints: Checkpoints | None = None,
    ) -> None:
        self._journal = journal
        self._projections = projections
        self._catalog = catalog
        self._allow = allow
        self._config = config
        self._clock = clock
        self._telemetry = telemetry
        self._keyring, self._keyring_path = keyring
        self._actors = actors
        self._calls = calls
        self._flows = flows
        self._hosts = hosts
        self._effects = effects
        self._apply: Apply | None = None
        self._artifacts = artifacts
        self._sealer = sealer
        self._checkpoints = checkpoints
        self._intake: Intake | None = None
        self._drift: DriftWatch | None = None
        self._entered = False

    def operator_keyring(self) -> Keyring | None:
        """The operator keyring as last read (the roles a quorum counts come from it).

        The inbox's poller reads the file again when it changes; without a poller,
        the keyring read at open.
        """
        return self._intake.keyring if self._intake is not None else self._keyring

    @asynccontextmanager
    async def running(self, apply: Apply) -> AsyncIterator[None]:
        """Start the kernel, run the body of the block, and stop it cleanly.

        ``apply`` turns each verified inbox request into acts
        (:meth:`kernel.api.acts.OperatorActs.apply`).

        Raises:
            KernelShutdown: the kernel had to stop (restart intensity, journal failure,
                an edited history, a fault).
            RuntimeError: the kernel ran before (a kernel runs once).
        """
        if self._entered:
            raise RuntimeError("a kernel runs once: open another with open_kernel")
        self._entered = True
        self._apply = apply
        journal, projections, telemetry = self._journal, self._projections, self._telemetry
        journal.set_transition_check(projections.transition_check)
        journal.add_listener(self._flows.on_commit)
        if telemetry.measures:
            # Commit latency and mailbox depths: measured, not recorded.
            telemetry.install(journal, self._mailbox_depths)
        await self._started()
        await self._abort_interrupted()
        if self._sealer is not None:
            # Erasures done while no kernel ran (``dirk erase`` never waits for one).
            await record_erasures(journal, self._sealer.keys)
        if self._checkpoints is not None:
            await record_key(journal, self._checkpoints.signer)
        supervisor = Supervisor(
            self._actors.specs,
            append=journal.append,
            projections=projections,
            clock=self._clock,
            on_dead_letter=_on_dead_letter,
            max_restarts=self._config.supervision.max_restarts,
            period_s=self._config.supervision.restart_period_s,
            fatal=(JournalError,),
            carry=self._actors.carry,
            lazy=self._config.storage.group_reads,
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
                self._start_tasks(tg, supervisor, exported)
                async with (
                    anyio.create_task_group() as agents_tg,
                    anyio.create_task_group() as effects_tg,
                ):
                    self._actors.agents.tg = agents_tg
                    if telemetry.enabled:
                        self._actors.agents.trace_scope = telemetry.reasoning
                    self._effects.tg = effects_tg
                    # What an earlier run left between acceptance and a recorded end.
                    self._actors.execution.send_nowait(Recover())
                    try:
                        yield
                    except Exception as exc:
                        # Re-raised outside the task groups: the caller sees it, not a group.
                        body_error = exc
                    finally:
                        agents_tg.cancel_scope.cancel()
                        effects_tg.cancel_scope.cancel()
                self._calls.stop(StopReason.KERNEL_CLOSED)
                tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            failure = self._failure(group)
        finally:
            self._calls.stop(StopReason.KERNEL_CLOSED)
            await self._stopped(failure, exported)
        if failure is not None:
            raise failure
        if body_error is not None:
            raise body_error

    async def wait_watched(self) -> None:
        """Wait until the drift monitors judged what committed (none: at once)."""
        if self._drift is not None:
            await self._drift.wait_judged(self._journal.head_seq)

    def _start_tasks(self, tg: TaskGroup, supervisor: Supervisor, exported: list[int]) -> None:
        tg.start_soon(self._supervise, supervisor, name="supervisor")
        tg.start_soon(self._check_history, name="history-check")
        poll_s = self._config.supervision.inbox_poll_s
        if poll_s is not None:
            assert self._apply is not None
            intake = Intake(
                self._journal,
                self._projections,
                self._keyring,
                self._keyring_path,
                self._apply,
            )
            self._intake = intake
            tg.start_soon(intake.run, self._clock, poll_s, name="operator-inbox")
            tg.start_soon(self._tick_desk, poll_s, name="desk-ticker")
            if self._sealer is not None:
                # On the inbox's cadence (and at open and close, always).
                keys = self._sealer.keys
                tg.start_soon(
                    run_erasures, self._journal, keys, self._clock, poll_s, name="erasures"
                )
        checkpointer = self._flows.checkpointer
        if checkpointer is not None:
            tg.start_soon(checkpointer.run, self._journal, name="checkpoints")
        monitors = monitors_of(self._catalog.packs)
        if monitors:  # no task, and no work per event, for a kernel without monitors
            watch = DriftWatch(self._journal, self._projections, monitors)
            self._drift = watch
            tg.start_soon(watch.run, self._journal.head_seq + 1, name="drift-watch")
        if self._config.webhooks:
            # Beside the kernel, never in its way: they follow what commits.
            hooks = Webhooks(self._config.webhooks, self._journal, self._projections, self._clock)
            tg.start_soon(hooks.run, self._journal.head_seq + 1, name="webhooks")
        signing = self._checkpoints
        if signing is not None and signing.every_s is not None:
            tg.start_soon(
                run_signing,
                self._journal,
                signing.signer,
                self._clock,
                signing.every_s,
                signing.publishers,
                name="signed-checkpoints",
            )
        if self._telemetry.enabled:
            tg.start_soon(self._export, exported, name="telemetry")

    async def _tick_desk(self, interval_s: float) -> None:
        """Tell the escalation desk, every ``interval_s`` on the clock, that time passed.

        A task of its own with nothing between two sleeps but the send: a test that
        advances a manual clock once always finds it asleep, so the desk sees the new time
        (the inbox poller, which used to tick it, hops to threads between its sleeps).
        """
        with contextlib.suppress(KernelShutdown, MailboxClosed):
            while True:
                await self._clock.sleep(interval_s)
                await self._actors.escalation.send(Tick())

    def _failure(self, group: BaseExceptionGroup[BaseException]) -> KernelShutdown:
        """Return why the kernel stopped, from what its tasks raised.

        Raises:
            BaseExceptionGroup: when nothing in it is a stop or a fault (a cancellation).
        """
        leaves = _leaves(group)
        stopped = [e for e in leaves if isinstance(e, KernelShutdown)]
        faults = [e for e in leaves if isinstance(e, Exception)]
        if stopped:
            return stopped[0]
        if not faults:
            raise group
        # A task raised what nothing handles: recorded as the fault it is, never as
        # a clean close, and raised as a KernelShutdown that carries it.
        log.error("the kernel stopped on a fault", exc_info=faults[0])
        failure = KernelShutdown(StopReason.KERNEL_FAILED, _fault(faults[0]))
        failure.__cause__ = faults[0]
        self._calls.stop(failure.reason, failure.detail)
        return failure

    async def _started(self) -> None:
        journal = self._journal
        started = KernelStarted(
            kernel_version=KERNEL_VERSION,
            packs=self._catalog.refs(),
            head_seq=journal.head_seq,
            head_hash=journal.head_hash,
            fold=FOLD,
            allow=_recordable(self._allow),
        )
        await journal.append([Draft(payload=started)])

    async def _stopped(self, failure: KernelShutdown | None, exported: list[int]) -> None:
        """Close the mailboxes, record why the kernel stopped, sign, flush, close the store."""
        for mailbox in [
            *(spec.mailbox for spec in self._actors.specs),
            *self._hosts.values(),
            *self._actors.agents.retired,
        ]:
            mailbox.close()
        journal = self._journal
        with anyio.CancelScope(shield=True):
            if self._sealer is not None:
                with contextlib.suppress(JournalClosed, JournalWriteFailed):
                    await record_erasures(journal, self._sealer.keys)
                self._sealer.keys.close()
            reason = failure.reason if failure else StopReason.KERNEL_CLOSED
            detail = failure.detail if failure else ""
            with contextlib.suppress(JournalClosed, JournalWriteFailed):
                # Not recordable when the journal failed or was closed under us.
                stopped = events.KernelStopped(
                    reason=reason,
                    detail=detail,
                    head_seq=journal.head_seq,
                    head_hash=journal.head_hash,
                )
                await journal.append([Draft(payload=stopped)])
            if self._checkpoints is not None:
                await self._sign_last(self._checkpoints)
            if self._telemetry.enabled:
                # Spans of what committed after the exporter's last batch, within a bound.
                await self._telemetry.finish(journal, exported)
            if self._artifacts is not None:
                with contextlib.suppress(Exception):
                    await self._artifacts.aclose()

    async def _sign_last(self, checkpoints: Checkpoints) -> None:
        """Sign a checkpoint of the whole journal as the kernel leaves it (KernelStopped in)."""
        journal = self._journal
        if journal.failed:
            return
        try:
            await sign_head(journal, checkpoints.signer, checkpoints.publishers)
        except JournalError as exc:
            log.warning("the closing checkpoint was not signed: %s", exc.detail)

    def _mailbox_depths(self) -> dict[str, int]:
        """How many messages wait in each actor's mailbox and each agent host's."""
        depths = {spec.name: spec.mailbox.pending() for spec in self._actors.specs}
        for agent_id, mailbox in list(self._hosts.items()):
            depths[f"agent:{agent_id}"] = mailbox.pending()
        return depths

    async def _abort_interrupted(self) -> None:
        """End the flows an earlier run left in memory (an agent thinking), saying so.

        Their reasoning died with that process; nothing was accepted, so there is
        nothing to resume, and a flow never just disappears.
        """
        projections = self._projections
        interrupted = [
            projections.flows[dfid]
            for dfid in sorted(projections.moving)
            if projections.flows[dfid].status
            in (FlowStatus.CREATED, FlowStatus.ACTIVE, FlowStatus.VALIDATING)
        ]
        detail = "the kernel stopped while this flow was being reasoned about; it was not resumed"
        await self._journal.append(
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

    async def _export(self, exported: list[int]) -> None:
        """Feed committed events to telemetry as they commit, at the exporter's pace."""
        await self._telemetry.follow(self._journal, exported)

    async def _supervise(self, supervisor: Supervisor) -> None:
        try:
            await supervisor.run()
        except RestartIntensityExceeded as exc:
            raise self._calls.stop(StopReason.RESTART_INTENSITY_EXCEEDED, str(exc)) from exc
        except JournalError as exc:
            raise self._calls.stop(StopReason.JOURNAL_FAILED, str(exc)) from exc

    async def _check_history(self) -> None:
        """Check the chain before the snapshot the kernel opened from; stop the kernel if it fails.

        Opening checked only the events after that snapshot, to be ready at once; reads of
        the events before it wait for this check. A journal edited there is refused as one
        edited after it is at open: the kernel stops (HISTORY_CORRUPT, recorded).
        """
        try:
            await self._journal.check_history()
        except JournalCorrupt as exc:
            raise self._calls.stop(StopReason.HISTORY_CORRUPT, str(exc)) from exc


def _on_dead_letter(actor: str, msg: Any, exc: BaseException, out: Outbox) -> None:
    """End the flow of a message no actor could handle, and answer its caller."""
    dfid = getattr(msg, "dfid", None)
    flow = out.flow(dfid) if isinstance(dfid, str) else None
    # Twice crashed on, or its events could not be sealed (kernel.runtime.actors).
    detail = clip(
        f"actor {actor} could not handle this flow's message: {type(exc).__name__}: {exc}", 500
    )
    if flow is not None and not flow.terminal and flow.status is not FlowStatus.DIRTY:
        out.emit(FlowAborted(reason_code=ReasonCode.KERNEL_FAULT, detail=detail), dfid=flow.dfid)
    if isinstance(msg, Carry):
        # Nothing of the compiler's batch was recorded: it records it itself.
        out.reply(msg.done, None)
        return
    reply = getattr(msg, "reply", None)
    if isinstance(reply, Reply):
        if isinstance(dfid, str):
            feedback = Feedback(reason_code=ReasonCode.KERNEL_FAULT, detail=detail, layer=actor)
            out.reply(reply, Verdict(outcome=Outcome.ABORTED, dfid=dfid, feedback=feedback))
        else:
            out.reply(reply, KernelFault(detail))


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
