"""Fail modes: what a call gets while the journal's store cannot be reached (issue 40 item 7).

While the journal's store is away past its grace (``Storage.outage_grace_s``;
:mod:`kernel.journal.outage` rides shorter outages out and the call is judged as ever),
nothing can be judged on the record, so :class:`Outage` answers instead, by the fail
mode of the call's tenant (``TenantSpec.policy.fail_mode``, as last committed):

- ``closed`` (the default, and for a tenant not declared): refused
  GOVERNANCE_UNAVAILABLE;
- ``open``: a kind its pack marks read-only (``PolicyKind.read_only``) is allowed
  (ALLOWED_WITHOUT_JOURNAL), any other refused as when closed.

A call that came while the store was still thought reachable waits for its flow to be
opened on record (:meth:`Outage.opened`) for as long as the store is not lost past its
grace. Lost longer, the call is answered by its fail mode as above, under its flow's
DFID; its opening commits once the store is back, and the flow is then aborted
GOVERNANCE_UNAVAILABLE unjudged, so nothing it proposed is ever carried out. A flow
opened on record is judged as ever: its later appends wait for the store.

Either way the call is kept first in the spool (:mod:`kernel.journal.spool`, a local
SQLite file fsynced before the answer), so nothing acts unrecorded, and once the store
is back every spooled call is appended in spool order, exactly once, as one
``DecidedWithoutJournal`` (never an ordinary allow), before any call is judged
normally again. A spool row that cannot be read is appended as a refusal saying so,
and the drain goes on. An agent without a session, a kind no pack defines, and a call
with no principal are refused.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import anyio
import msgspec

from kernel.api.decisions import Decision, DecisionVerdict
from kernel.core import wall
from kernel.core.events import (
    DecidedWithoutJournal,
    Draft,
    FailMode,
    FlowAborted,
    OnBehalf,
    Principal,
    digest,
)
from kernel.core.ports import Clock, IdSource
from kernel.core.reasons import ReasonCode
from kernel.journal.outage import StoreState
from kernel.journal.spool import Spool, SpoolRow
from kernel.journal.store import Journal
from kernel.policy.packs import PolicyCatalog
from kernel.runtime.actors import Effects
from kernel.state.principals import Principals
from kernel.state.projections import Projections

log = logging.getLogger(__name__)

T = TypeVar("T")

_TYPE = "DecidedWithoutJournal"
_DRAIN_BATCH = 100
_REFUSED = (
    "the journal's store cannot be reached: this call was refused"
    " (GOVERNANCE_UNAVAILABLE) and is on record once the store is back"
)
_UNJUDGED = (
    "the journal's store was lost past its grace while this flow was being opened: the"
    " call was answered by its tenant's fail mode (decided without the journal), and the"
    " flow is not judged"
)
_ALLOWED = (
    "the journal's store cannot be reached: this read-only call is allowed by its"
    " tenant's fail-open mode, decided without the journal, and recorded as such once"
    " the store is back"
)


def spool_beside(journal: Journal, configured: str | None) -> str:
    """Return where ``journal``'s spool lives (``Storage.spool``, or the default place)."""
    if configured is not None:
        return configured
    location = journal.path
    if location.startswith(("postgresql://", "postgres://")):
        return os.path.abspath(f"dirk-spool-{journal.journal_id}.db")
    path = Path(location)
    return str(path.with_name(f"{path.stem}.spool{path.suffix or '.db'}"))


def fail_mode_of(projections: Projections, tenant: str) -> str:
    """Return ``tenant``'s fail mode as last committed (closed for a tenant never declared)."""
    spec = projections.domain(Principals).tenants.get(tenant)
    return spec.policy.fail_mode if spec is not None else FailMode.CLOSED


class Outage:
    """Answers calls while the journal's store is away, and drains the spool once it is back.

    Args:
        journal: the journal whose store is watched.
        projections: the principals domain (each tenant's fail mode, as last committed).
        catalog: which kinds are read-only.
        clock: when a call was decided.
        ids: the DFIDs of the calls answered.
        spool: the spool file's path (``spool_beside``).
        spawn: runs an opening beside its caller (:meth:`opened`); None: openings are
            waited for, however long the store is away.
    """

    def __init__(
        self,
        journal: Journal,
        projections: Projections,
        catalog: PolicyCatalog,
        *,
        clock: Clock,
        ids: IdSource,
        spool: str,
        spawn: Effects | None = None,
    ) -> None:
        self._spawn = spawn
        self._journal = journal
        self._projections = projections
        self._catalog = catalog
        self._clock = clock
        self._ids = ids
        self._path = spool
        self._spool: Spool | None = None
        self._maybe_pending = os.path.exists(spool)
        self._lock = anyio.Lock()
        self._overtaken = 0
        """Openings answered by the fail mode whose flows are not ended yet."""
        self._settled = anyio.Event()
        if journal.store.rides_out:
            journal.store.on_back(self.drain)

    @property
    def watches_opening(self) -> bool:
        """Whether :meth:`opened` may answer a call before its flow's opening commits.

        Its proposal is then judged only once the flow is open (never in the opening's
        append: an opening overtaken by the fail mode is aborted unjudged).
        """
        return self._journal.store.rides_out and self._spawn is not None

    async def answer(
        self, call: Any, params: Any, session: bool, behalf: OnBehalf | None
    ) -> Decision | None:
        """Return the fail mode's answer while the store is away; None: judge as ever.

        ``call`` names the agent and the kind (``agent_id``, ``kind``); ``session``:
        whether the agent has one; ``behalf``: whom it acts for (None: nobody, refused).
        A store lost within its grace is waited for; a store reachable first gets what
        the spool holds appended, so no call is judged normally before them.
        """
        store = self._journal.store
        if not store.rides_out:
            return None
        if await store.settled() is StoreState.REACHABLE:
            await self.drain()
            return None
        return await self._lost(call, params, session, behalf, self._ids.new_dfid())

    async def opened(
        self,
        open_flow: Callable[[], Awaitable[T]],
        dfid: str,
        call: Any,
        params: Any,
        behalf: OnBehalf | None,
    ) -> T | Decision:
        """Return what ``open_flow`` returns, or the fail mode's answer if the store is lost first.

        ``open_flow`` opens flow ``dfid`` for ``call`` (its first append). Should the
        store be lost past its grace before that append commits, the call is answered
        by its fail mode (a Decision under ``dfid``), and the opening goes on beside:
        once it commits, the flow is aborted unjudged (see the module's text).

        Raises:
            Exception: what ``open_flow`` raised.
        """
        store = self._journal.store
        if not store.rides_out or self._spawn is None:
            return await open_flow()
        box: list[Any] = []
        done = anyio.Event()
        overtaken = False

        async def opening() -> None:
            try:
                box.append(await open_flow())
            except Exception as exc:
                box.append(exc)
            finally:
                done.set()
            if overtaken:
                try:
                    if isinstance(box[0], str):
                        await self._abort_unjudged(dfid)
                finally:
                    self._overtaken -= 1
                    self._settled.set()

        if not self._spawn.running:
            return await open_flow()  # the kernel is stopping: as it says
        self._spawn(opening)
        async with anyio.create_task_group() as race:

            async def lost() -> None:
                await store.until(StoreState.UNREACHABLE)
                race.cancel_scope.cancel()

            race.start_soon(lost)
            await done.wait()
            race.cancel_scope.cancel()
        if done.is_set():
            if isinstance(box[0], Exception):
                raise box[0]
            result: T = box[0]
            return result
        overtaken = True
        self._overtaken += 1
        return await self._lost(call, params, True, behalf, dfid)

    async def settle(self) -> None:
        """Wait until nothing decided without the journal is left to record.

        That is: the spool drained into the journal (the store is waited for), and every
        flow whose opening the fail mode overtook ended.
        """
        while self._maybe_pending or self._overtaken:
            if self._maybe_pending:
                await self._journal.store.until(StoreState.REACHABLE)
                await self.drain()
                continue
            self._settled = anyio.Event()
            await self._settled.wait()

    async def _abort_unjudged(self, dfid: str) -> None:
        """End an opened flow whose call the fail mode answered: nothing of it is judged."""
        flow = self._projections.flows.get(dfid)
        if flow is None or flow.terminal:
            return
        payload = FlowAborted(reason_code=ReasonCode.GOVERNANCE_UNAVAILABLE, detail=_UNJUDGED)
        draft = Draft(
            payload=payload,
            dfid=dfid,
            parent_dfid=flow.parent_dfid,
            agent_id=flow.agent_id,
            caused_by=flow.last_seq,
        )
        try:
            await self._journal.append([draft])
        except Exception as exc:  # the kernel stopping; its next start aborts it INTERRUPTED
            log.warning("flow %s, answered without the journal, is left open: %r", dfid, exc)

    async def _lost(
        self, call: Any, params: Any, session: bool, behalf: OnBehalf | None, dfid: str
    ) -> Decision:
        """Answer ``call`` by its tenant's fail mode, kept in the spool first."""
        record = self._decided(str(call.agent_id), str(call.kind), params, session, behalf, dfid)
        try:
            spool_id = await self._keep(record)
        except Exception as exc:
            # Not kept, so not allowed: a refusal acts on nothing.
            log.error("outage spool %s: %r; the call is refused unrecorded", self._path, exc)
            return _refusal(record.dfid, f"{_REFUSED.split(':')[0]}, and the spool failed")
        if record.allowed:
            return Decision(
                verdict=DecisionVerdict.ALLOWED_WITHOUT_JOURNAL,
                dfid=record.dfid,
                detail=record.detail,
                result={"decided_without_journal": True, "spool_id": spool_id},
            )
        return _refusal(record.dfid, record.detail)

    def _decided(
        self,
        agent_id: str,
        kind: str,
        params: Any,
        session: bool,
        behalf: OnBehalf | None,
        dfid: str,
    ) -> DecidedWithoutJournal:
        """Decide a call by its tenant's fail mode (see the module's table)."""
        allowed = session and behalf is not None and self._fails_open(kind, behalf.principal)
        return DecidedWithoutJournal(
            spool_id=0,
            decided_ns=self._clock.now_ns(),
            dfid=dfid,
            agent_id=agent_id,
            kind=kind,
            on_behalf=behalf,
            allowed=allowed,
            reason_code=None if allowed else ReasonCode.GOVERNANCE_UNAVAILABLE,
            detail=_ALLOWED if allowed else _REFUSED,
            params_digest=_digest(params),
        )

    def _fails_open(self, kind: str, who: Principal) -> bool:
        """Whether ``kind`` is read-only and ``who``'s tenant fails open."""
        read_only = getattr(self._catalog.kinds.get(kind), "read_only", False)
        return read_only is True and fail_mode_of(self._projections, who.tenant) == FailMode.OPEN

    async def _keep(self, record: DecidedWithoutJournal) -> int:
        async with self._lock:
            spool = await self._open()
            self._maybe_pending = True
            body = msgspec.json.encode(record)
            return await anyio.to_thread.run_sync(spool.add, record.dfid, body)

    async def _open(self) -> Spool:
        if self._spool is None:
            journal_id = self._journal.journal_id
            self._spool = await anyio.to_thread.run_sync(Spool, self._path, journal_id)
        return self._spool

    async def drain(self) -> int:
        """Append what the spool holds, in order, exactly once; return how many were appended.

        Runs when the store is back (``StoreWatch.on_back``) and before a call is judged
        normally. A row whose event the journal already holds (a kernel killed between
        the append and the mark) is only marked.
        """
        if not self._maybe_pending:
            return 0
        async with self._lock:
            spool = await self._open()
            rows = await anyio.to_thread.run_sync(spool.pending)
            held = await self._held() if rows else set()
            appended = 0
            for start in range(0, len(rows), _DRAIN_BATCH):
                chunk = rows[start : start + _DRAIN_BATCH]
                events = [recorded(row) for row in chunk]
                fresh = [e for e in events if (e.spool_id, e.dfid) not in held]
                if fresh:
                    await self._journal.append([Draft(payload=event) for event in fresh])
                    appended += len(fresh)
                for row in chunk:
                    await anyio.to_thread.run_sync(spool.mark_drained, row.id)
            self._maybe_pending = False
            return appended

    async def _held(self) -> set[tuple[int, str]]:
        """The (spool id, dfid) of every DecidedWithoutJournal the journal holds."""
        events = await self._journal.read(types=[_TYPE])
        return {
            (event.payload.spool_id, event.payload.dfid)
            for event in events
            if isinstance(event.payload, DecidedWithoutJournal)
        }

    def close(self) -> None:
        """Close the spool file."""
        if self._spool is not None:
            self._spool.close()
            self._spool = None


def recorded(row: SpoolRow) -> DecidedWithoutJournal:
    """Return the event a spool row becomes: as kept, or a refusal saying it was unreadable."""
    try:
        kept = msgspec.json.decode(row.body, type=DecidedWithoutJournal)
        if kept.dfid != row.dfid:
            raise ValueError("its dfid is not the row's")
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        return DecidedWithoutJournal(
            spool_id=row.id,
            decided_ns=0,
            dfid=wall.clip(row.dfid, 64),
            agent_id="",
            kind="",
            allowed=False,
            reason_code=ReasonCode.GOVERNANCE_UNAVAILABLE,
            detail=wall.clip(
                f"spool row {row.id} could not be read ({exc}): what was decided is not known",
                wall.MAX_DETAIL,
            ),
        )
    return msgspec.structs.replace(
        kept,
        spool_id=row.id,
        agent_id=wall.clip(kept.agent_id, 128),
        kind=wall.clip(kept.kind, 128),
        detail=wall.clip(kept.detail, wall.MAX_DETAIL),
    )


def _refusal(dfid: str, detail: str) -> Decision:
    return Decision(
        verdict=DecisionVerdict.REFUSED,
        dfid=dfid,
        reason_code=ReasonCode.GOVERNANCE_UNAVAILABLE,
        detail=detail,
    )


def _digest(params: Any) -> str:
    try:
        return digest(params if isinstance(params, Mapping) else {"params": params})
    except (TypeError, msgspec.EncodeError):
        return ""
