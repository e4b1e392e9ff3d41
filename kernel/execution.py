"""The execution engine: accepted intents cross into the world exactly once.

Only this actor mints ExecutionIntents, and only from a flow the DIM (or a
human) accepted. The intent's idempotency key is derived from (dfid, action,
step). ExecutionStarted is committed before the adapter is called and the
result after; a key that already has a recorded result, or a call in flight,
is answered from the record and never reaches the adapter again.

The adapter contract: an adapter receives the intent, including its key, and
must honour the key (the system behind it deduplicates on it), so that a call
repeated after a crash has at most one effect. It raises
:class:`AdapterError` with ``transient`` set when a retry could succeed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgspec

from kernel.actors import Mailbox, Outbox
from kernel.contracts import Outcome, Verdict
from kernel.events import (
    DuplicateSuppressed,
    ExecutionFailed,
    ExecutionIntent,
    ExecutionStarted,
    ExecutionSucceeded,
    FlowAborted,
    FlowClosed,
)
from kernel.flow import FlowStatus
from kernel.integrity import Execute
from kernel.packs import PolicyCatalog
from kernel.reasons import ReasonCode


class Receipt(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """What an adapter returns for an effect it carried out."""

    external_id: str
    detail: dict[str, Any] = {}


class AdapterError(Exception):
    """An adapter call that failed; ``transient`` says whether a retry could succeed."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class Adapter(Protocol):
    """The port to a broker, a booking system, a database or a notifier."""

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        """Carry out ``intent`` at most once per ``intent.key``."""
        ...


def idempotency_key(dfid: str, action: str, step: int = 0) -> str:
    """Return the key of one step of one flow's action."""
    return hashlib.sha256(f"{dfid}|{action}|{step}".encode()).hexdigest()[:32]


class AdapterDone(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """An adapter call finished (successfully or not)."""

    dfid: str
    key: str
    receipt: Receipt | None = None
    error: str = ""
    transient: bool = False


Spawn = Callable[[Callable[[], Any]], None]


class ExecutionEngine:
    """The execution engine actor.

    Args:
        spawn: starts a coroutine function in the kernel's task group (adapter calls
            run beside the actor, so one slow adapter never stalls other flows).
    """

    def __init__(
        self,
        catalog: PolicyCatalog,
        adapters: Mapping[str, Adapter],
        mailbox: Mailbox[Any],
        spawn: Spawn,
    ) -> None:
        self._catalog = catalog
        self._adapters = adapters
        self._mailbox = mailbox
        self._spawn = spawn

    async def handle(self, msg: Execute | AdapterDone, out: Outbox) -> None:
        match msg:
            case Execute():
                self._execute(msg, out)
            case AdapterDone():
                self._done(msg, out)

    def _execute(self, msg: Execute, out: Outbox) -> None:
        flow = out.flow(msg.dfid)
        if flow is None or flow.proposal is None:
            return
        if flow.status is not FlowStatus.ACCEPTED:
            # Delivered again (or late): answer from the record, never call twice.
            out.emit(DuplicateSuppressed(key=flow.intent_key, source="delivery"), dfid=msg.dfid)
            outcome = Outcome.DUPLICATE if flow.status is FlowStatus.CLOSED else Outcome.ACCEPTED
            out.reply(
                msg.reply,
                Verdict(
                    outcome=outcome,
                    dfid=msg.dfid,
                    attempt=flow.attempts,
                    external_id=flow.external_id,
                ),
            )
            return
        proposal = flow.proposal
        kind = self._catalog.kinds[proposal.kind]
        # Normalise the parameters through the kind's type, so the adapter sees
        # exactly what the DIM validated.
        policy = msgspec.convert({"kind": proposal.kind, **proposal.params}, kind)
        params = msgspec.to_builtins(policy)
        params.pop("kind", None)
        intent = ExecutionIntent(
            key=idempotency_key(msg.dfid, proposal.kind),
            kind=proposal.kind,
            adapter=kind.adapter,
            params=params,
            valid_until_ns=proposal.valid_until_ns,
        )
        out.emit(ExecutionStarted(intent=intent), dfid=msg.dfid)
        adapter = self._adapters[kind.adapter]
        out.after_commit(lambda: self._spawn(lambda: self._call(adapter, msg.dfid, intent)))
        out.reply(
            msg.reply, Verdict(outcome=Outcome.ACCEPTED, dfid=msg.dfid, attempt=flow.attempts)
        )

    async def _call(self, adapter: Adapter, dfid: str, intent: ExecutionIntent) -> None:
        try:
            receipt = await adapter.execute(intent)
            done = AdapterDone(dfid=dfid, key=intent.key, receipt=receipt)
        except AdapterError as exc:
            done = AdapterDone(dfid=dfid, key=intent.key, error=str(exc), transient=exc.transient)
        except Exception as exc:
            done = AdapterDone(dfid=dfid, key=intent.key, error=f"{type(exc).__name__}: {exc}")
        await self._mailbox.send(done)

    def _done(self, msg: AdapterDone, out: Outbox) -> None:
        flow = out.flow(msg.dfid)
        if flow is None or flow.status is not FlowStatus.EXECUTING:
            return
        if msg.receipt is not None:
            succeeded = out.emit(
                ExecutionSucceeded(
                    key=msg.key, external_id=msg.receipt.external_id, detail=msg.receipt.detail
                ),
                dfid=msg.dfid,
            )
            out.emit(FlowClosed(), dfid=msg.dfid, after=succeeded)
            return
        failed = out.emit(
            ExecutionFailed(key=msg.key, error=msg.error, transient=msg.transient), dfid=msg.dfid
        )
        out.emit(
            FlowAborted(reason_code=ReasonCode.EXECUTION_FAILED, detail=msg.error),
            dfid=msg.dfid,
            after=failed,
        )
