"""The kernel's side of the inbox: read new rows, check their proof, apply each once.

Every ``interval_s`` on the kernel's clock (or at once when the store announces a
row), the poller reads the rows no event took yet.
Each row is decoded (kernel.inbox.requests) and its proof checked against the
keyring (kernel.inbox.proof); the kernel records who asked and who signed
(RequestVerified) and hands the request to the one ``apply`` that turns requests
into acts (``Kernel.apply``). Whatever goes wrong with a row (it does not decode,
its proof does not hold, it repeats another row's request, applying it raised) ends
in a recorded refusal naming the row (InputRefused), and the row is marked taken:
no row is ever tried again, none can stop the poller.

Exactly once: an event naming the row takes it (kernel.state.projections
``inbox_taken``); the ``taken_seq`` mark in the table only spares the next read. A
row whose request was verified but not yet applied when the kernel stopped is
applied on the next start, and only then.

The keyring (kernel.inbox.keyring) is read again whenever its file changes. A key
is recorded the first time a request signed with it is taken (OperatorKeyTrusted);
a key recorded before and gone from the file is recorded revoked, for good.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from kernel.core import events as ev
from kernel.core.errors import KernelShutdown
from kernel.core.events import Draft, InputRefused, Payload
from kernel.core.ports import Clock, SystemClock
from kernel.core.reasons import ReasonCode
from kernel.core.wall import MAX_DETAIL, clip
from kernel.inbox.keyring import Keyring, KeyringError, Principal, read_keyring, roles_of
from kernel.inbox.proof import Proof, ProofRefused, check, check_time
from kernel.inbox.requests import (
    DecideRequest,
    InboxRequest,
    Signed,
    decode_row,
    principal_of,
    request_type,
)
from kernel.journal.errors import JournalError, redact
from kernel.journal.inbox_store import InboxStore, StoredRow, open_inbox
from kernel.journal.store import Journal, JournalClosed, JournalWriteFailed
from kernel.runtime.actors import MailboxClosed
from kernel.state.projections import Projections

log = logging.getLogger(__name__)

Apply = Callable[[InboxRequest, Proof], Awaitable[None]]
"""Applies one verified request; the event it records names the row (``proof.inbox_id``)."""

_LISTEN_S = 0.5
"""How long one wait for an announced row lasts (a wait the clock interrupts ends within it)."""


class Intake:
    """The inbox poller of one kernel.

    Args:
        journal: the kernel's journal (its inbox, its id, where refusals are recorded).
        projections: the kernel's projections (which rows events took).
        keyring: the keys trusted at start (None: no keyring configured: every row is
            refused, SIGNATURE_INVALID).
        keyring_path: the file to read again when it changes.
        apply: turns a verified request into acts (``Kernel.apply``).
        clock: the clock a request's validity window is judged on (None: the machine's).
            Real time, whatever clock the kernel decides on: the window bounds how long a
            row may be held back, and doors sign on the machine's clock too, so a kernel
            serving a simulated day (``dirk serve --clock journal``) takes a decision
            signed a moment ago by ``dirk decide``.
    """

    def __init__(
        self,
        journal: Journal,
        projections: Projections,
        keyring: Keyring | None,
        keyring_path: str | None,
        apply: Apply,
        *,
        clock: Clock | None = None,
    ) -> None:
        self._clock: Clock = clock or SystemClock()
        self._journal = journal
        self._projections = projections
        self._keyring = keyring or Keyring()
        self._keyring_path = keyring_path if keyring is not None else None
        self._keyring_mark = _mark(keyring_path) if keyring is not None else None
        self._apply = apply
        self._trusted: dict[str, tuple[str, str]] = {}
        """The keys recorded trusted, by fingerprint: their names and keys."""
        self._revoked: set[str] = set()
        self._seen: dict[str, tuple[int, int]] = {}
        """Request ids taken, with the row that carried each and the seq that recorded it."""

    @property
    def keyring(self) -> Keyring:
        """The keyring as last read (the roles operators hold come from it)."""
        return self._keyring

    async def run(self, clock: Clock, interval_s: float) -> None:
        """Poll until the kernel stops, on ``clock``'s time."""
        try:
            while not await self.remember():
                await clock.sleep(interval_s)
            limiter = anyio.CapacityLimiter(1)
            waits = anyio.CapacityLimiter(1)  # waits for an announced row, on their own connection
            store = await self._opened(limiter)
            try:
                if store.announces:
                    # Listening before the first read: a row inserted after it is read or announced.
                    with contextlib.suppress(JournalError):  # the store away: polling finds it
                        await anyio.to_thread.run_sync(store.wait, 0.0, limiter=waits)
                while True:
                    await self._round(store, limiter)
                    await _pause(store, clock, interval_s, waits)
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(store.close, limiter=limiter)
        except (KernelShutdown, MailboxClosed, JournalClosed, JournalWriteFailed):
            return

    async def _opened(self, limiter: anyio.CapacityLimiter) -> InboxStore:
        """Open the inbox's store; a server that cannot be reached now is tried until it can.

        The journal's store away (a PostgreSQL server restarting) is an outage the kernel
        rides out, never a reason for it to stop; the retry's pause is the process's own
        time, as any I/O retry's (it decides nothing).
        """
        while True:
            try:
                return await anyio.to_thread.run_sync(
                    open_inbox, self._journal.path, limiter=limiter
                )
            except JournalError as exc:
                log.warning(
                    "operator inbox of %s: %r; trying again", redact(self._journal.path), exc
                )
                await anyio.sleep(_REOPEN_S)

    async def _round(self, store: InboxStore, limiter: anyio.CapacityLimiter) -> None:
        """Take every pending row once; a store that fails is tried again next round."""
        try:
            rows = await anyio.to_thread.run_sync(lambda: store.rows(pending=True), limiter=limiter)
        except JournalError as exc:
            log.warning("operator inbox of %s: %r; trying again", redact(self._journal.path), exc)
            return
        if rows:
            await self._reload()
        for row in rows:
            try:
                seq = await self.take(row)
            except (KernelShutdown, MailboxClosed, JournalClosed, JournalWriteFailed):
                raise
            except Exception as exc:
                # A fault of the poller itself: the row is marked, never a loop of retries.
                log.error("operator inbox row %d could not be taken: %r", row.id, exc)
                seq = -1
            try:
                await anyio.to_thread.run_sync(store.mark_taken, row.id, seq, limiter=limiter)
            except JournalError as exc:
                # The event took it; the mark only spares a read: the next round marks it.
                log.warning("operator inbox: marking row %d: %r", row.id, exc)

    async def take(self, row: StoredRow) -> int:
        """Take one row: apply it or record why not; return the seq of the event that took it.

        -1 remains for a row that was applied and recorded nothing, and for one whose
        refusal could not be recorded (logged): neither is read again.
        """
        taken = self._projections.inbox_taken.get(row.id)
        if taken is not None:
            return taken  # taken before a restart, and not marked yet: never applied twice
        try:
            signed = decode_row(row.body)
        except ValueError as exc:
            return await self._refuse(row, None, exc)
        try:
            signer = check(signed, self._keyring, self._journal.journal_id, self._revoked)
        except ProofRefused as exc:
            return await self._refuse(row, signed, exc)
        seen = self._seen.get(signed.request_id)
        try:
            self._check_new(signed, row, seen)
        except ProofRefused as exc:
            return await self._refuse(row, signed, exc)
        proof = Proof(
            inbox_id=row.id,
            request_id=signed.request_id,
            principal=principal_of(signed.request),
            signer=signer.name,
            role=signer.role,
            fingerprint=signer.fingerprint,
            roles=roles_of(self._keyring, principal_of(signed.request)),
        )
        try:
            verified = seen[1] if seen is not None else await self._verified(signed, signer, proof)
            await self._apply(signed.request, proof)
        except (KernelShutdown, MailboxClosed, JournalClosed, JournalWriteFailed):
            raise
        except Exception as exc:
            # Whatever the request holds, it is refused with a reason on record, never retried.
            log.warning("operator inbox row %d refused: %s", row.id, exc)
            if row.id not in self._projections.inbox_taken:
                return await self._refuse(row, signed, exc)
        return self._projections.inbox_taken.get(row.id, verified)

    def _check_new(self, signed: Signed, row: StoredRow, seen: tuple[int, int] | None) -> None:
        """Refuse a copy of a request taken before, or one taken outside its time window.

        Raises:
            ProofRefused: REQUEST_REPLAYED, REQUEST_EXPIRED or REQUEST_NOT_YET_VALID.
        """
        if seen is not None and seen[0] != row.id:
            raise ProofRefused(
                ReasonCode.REQUEST_REPLAYED,
                "request_id",
                f"this request was taken from inbox row {seen[0]}: a copy is never taken again",
            )
        if seen is None:
            # Where it is taken, on the machine's clock: an expired row is refused on
            # record, and replay reads that refusal (a row is never judged twice). A row
            # verified before a restart was judged in time then: it is applied now.
            check_time(signed, self._keyring.policy, self._clock.now_ns())

    async def _verified(self, signed: Signed, signer: Principal, proof: Proof) -> int:
        """Record who asked and who signed (and the signer's key, the first time)."""
        drafts: list[Payload] = []
        if signer.fingerprint not in self._trusted:
            drafts.append(
                ev.OperatorKeyTrusted(
                    name=signer.name,
                    role=signer.role,
                    key=signer.key,
                    fingerprint=signer.fingerprint,
                )
            )
        drafts.append(
            ev.RequestVerified(
                inbox_id=proof.inbox_id,
                request_id=proof.request_id,
                request=request_type(signed.request),
                principal=proof.principal,
                signer=proof.signer,
                fingerprint=proof.fingerprint,
            )
        )
        recorded = await self._journal.append([Draft(payload=p) for p in drafts])  # type: ignore[arg-type]
        self._trusted[signer.fingerprint] = (signer.name, signer.key)
        seq = recorded[-1].seq
        self._seen[proof.request_id] = (proof.inbox_id, seq)
        return seq

    async def _refuse(self, row: StoredRow, signed: Signed | None, exc: Exception) -> int:
        """Record why a row was refused (InputRefused naming it); return the event's seq."""
        request = signed.request if signed is not None else None
        # A refusal without a code of its own: a request the acts cannot apply (ValueError),
        # or a fault in applying it.
        fallback = (
            ReasonCode.SCHEMA_INVALID if isinstance(exc, ValueError) else ReasonCode.KERNEL_FAULT
        )
        refused = InputRefused(
            reason_code=getattr(exc, "reason_code", None) or fallback,
            entry=f"inbox:{request_type(request)}" if request is not None else "inbox",
            field=clip(getattr(exc, "field", "$"), 64),
            detail=clip(getattr(exc, "detail", None) or f"{type(exc).__name__}: {exc}", MAX_DETAIL),
            operator=clip(principal_of(request)) if request is not None else "",
            target=clip(_target(request)) if request is not None else "",
            inbox_id=row.id,
            request_id=signed.request_id if signed is not None else "",
        )
        try:
            [event] = await self._journal.append([Draft(payload=refused)])
        except (KernelShutdown, JournalClosed, JournalWriteFailed):
            raise
        except Exception as failure:
            # Not even the refusal records: the row is marked so it is never read again.
            log.error(
                "operator inbox row %d: its refusal could not be recorded: %r", row.id, failure
            )
            return -1
        if signed is not None:
            self._seen.setdefault(signed.request_id, (row.id, event.seq))
        return event.seq

    async def remember(self) -> bool:
        """Read what the journal says of keys and requests; whether it could be read.

        :meth:`run` does it first; a caller of :meth:`take` alone does it before.
        """
        try:
            found = await self._journal.read(
                types=[
                    "OperatorKeyTrusted",
                    "OperatorKeyRevoked",
                    "RequestVerified",
                    "InputRefused",
                ]
            )
        except JournalClosed:
            raise
        except JournalError as exc:
            log.warning("operator inbox: reading its record: %r; trying again", exc)
            return False
        for event in found:
            payload = event.payload
            if isinstance(payload, ev.OperatorKeyTrusted):
                self._trusted[payload.fingerprint] = (payload.name, payload.key)
            elif isinstance(payload, ev.OperatorKeyRevoked):
                self._revoked.add(payload.fingerprint)
                self._trusted.pop(payload.fingerprint, None)
            elif isinstance(payload, ev.RequestVerified):
                self._seen.setdefault(payload.request_id, (payload.inbox_id, event.seq))
            elif isinstance(payload, InputRefused) and payload.request_id:
                self._seen.setdefault(payload.request_id, (payload.inbox_id or 0, event.seq))
        await self._revoke_gone()
        return True

    async def _reload(self) -> None:
        """Read the keyring again if its file changed (a bad file keeps the last good one)."""
        if self._keyring_path is None:
            return
        mark = _mark(self._keyring_path)
        if mark == self._keyring_mark:
            return
        self._keyring_mark = mark
        try:
            self._keyring = await anyio.to_thread.run_sync(read_keyring, self._keyring_path)
        except KeyringError as exc:
            log.warning("operator inbox: %s; keeping the keyring read before", exc)
            return
        await self._revoke_gone()

    async def _revoke_gone(self) -> None:
        """Record each key trusted before that the keyring no longer holds, as revoked."""
        if self._keyring_path is None:
            return  # no keyring configured: nothing is trusted now, nothing is revoked for good
        held = {p.fingerprint for p in self._keyring.values()}
        gone = sorted(fp for fp in self._trusted if fp not in held)
        if not gone:
            return
        await self._journal.append(
            [
                Draft(
                    payload=ev.OperatorKeyRevoked(
                        name=self._trusted[fp][0],
                        key=self._trusted[fp][1],
                        fingerprint=fp,
                        detail="no longer in the keyring",
                    )
                )
                for fp in gone
            ]
        )
        for fp in gone:
            self._revoked.add(fp)
            del self._trusted[fp]


def _target(request: InboxRequest) -> str:
    """What a request names besides its principal: the flow, agent or rule it is about."""
    if isinstance(request, DecideRequest):
        return request.dfid
    for field in ("agent_id", "rule", "grant", "kind"):
        value = getattr(request, field, None)
        if isinstance(value, str):
            return value
    seq = getattr(request, "proposal_seq", None)
    return f"#{seq}" if seq is not None else ""


def _mark(path: str | None) -> tuple[int, int, int] | None:
    """What tells that a file changed: its inode, size and modification time."""
    if path is None:
        return None
    try:
        stat = os.stat(Path(path))
    except OSError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


_REOPEN_S = 0.5
"""The pause before the inbox's store is opened again when it could not be reached."""


async def _pause(
    store: InboxStore, clock: Clock, interval_s: float, limiter: anyio.CapacityLimiter
) -> None:
    """Wait ``interval_s`` on the clock; stop early when the store announces a row."""
    if not store.announces:
        await clock.sleep(interval_s)
        return
    async with anyio.create_task_group() as tg:

        async def tick() -> None:
            await clock.sleep(interval_s)
            tg.cancel_scope.cancel()

        async def announced() -> None:
            # Short waits, so a wait abandoned when the clock wins ends soon after.
            try:
                while not await anyio.to_thread.run_sync(
                    store.wait, _LISTEN_S, abandon_on_cancel=True, limiter=limiter
                ):
                    pass
            except JournalError as exc:
                log.warning("operator inbox of %s: %r; polling only", store.location, exc)
                return  # the clock's round still comes
            tg.cancel_scope.cancel()

        tg.start_soon(tick)
        tg.start_soon(announced)
