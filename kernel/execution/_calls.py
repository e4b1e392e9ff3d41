"""Calling adapters, beside the execution engine: one call, its answer back as a message.

A call runs on the kernel's call pool, never inside the actor, so one slow
adapter never stalls other flows; whatever happens (a receipt, an error, a
violated bound, a lookup's finding) comes back to the engine's mailbox as one
:class:`~kernel.runtime.messages.AdapterDone`, and these methods never raise.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from kernel.adapters.constraints import Violation, check
from kernel.adapters.contract import Adapter, AdapterError, Quote, Receipt, recordable
from kernel.core.events import ExecutionIntent, Payload
from kernel.core.ports import Clock
from kernel.core.wall import clip
from kernel.runtime.actors import Mailbox
from kernel.runtime.messages import AdapterDone, ExecutionMessage
from kernel.state.domain import RecordingReceipt

Records = Mapping[str, frozenset[type[Payload]]]
"""The domains' executors by adapter name, and the event types each may return to record."""


def _records_checked(intent: ExecutionIntent, receipt: Receipt, records: Records) -> Receipt:
    """Return ``receipt`` if the events it brings to record are a domain executor's own.

    Only the executors the domains declare (``memory``, ``beliefs``: Domain.records)
    return events, and only their own events under the intent's key: any other is
    refused before anything is recorded (the effect of such an intent is its record,
    so nothing happened).

    Raises:
        AdapterError: terminal, naming what was refused.
    """
    if not isinstance(receipt, RecordingReceipt) or not receipt.records:
        return receipt
    allowed = records.get(intent.adapter)
    if allowed is None:
        raise AdapterError(f"adapter {intent.adapter!r} may not return events to record")
    for record in receipt.records:
        if type(record) not in allowed or getattr(record, "key", None) != intent.key:
            raise AdapterError(
                f"the {intent.adapter} executor returned {type(record).__name__}"
                " outside its intent's key"
            )
    return receipt


class AdapterCalls:
    """Calls the adapters of one kernel and reports each outcome to the engine."""

    def __init__(
        self,
        adapters: Mapping[str, Adapter],
        mailbox: Mailbox[ExecutionMessage],
        clock: Clock | None,
        records: Records,
    ) -> None:
        self._adapters = adapters
        self._mailbox = mailbox
        self._clock = clock
        self._records = records

    async def call(
        self, dfid: str, intent: ExecutionIntent, attempt: int, fresh: bool, at_ns: int | None
    ) -> None:
        """Call the adapter once for ``intent`` and report back; never raises."""
        adapter = self._adapters[intent.adapter]
        done = AdapterDone(dfid=dfid, key=intent.key, attempt=attempt)
        looking = False
        try:
            await self._until(at_ns)
            lookup = getattr(adapter, "lookup", None)
            if not fresh and callable(lookup):
                looking = True
                found = await lookup(intent.key)
                if found is not None:
                    await self._mailbox.send(
                        msgspec.structs.replace(done, receipt=recordable(found), found=True)
                    )
                    return
                fresh = True  # the adapter says no effect exists for this key
            looking = False
            if fresh and not intent.compensation:
                violation = await self._check(adapter, intent)
                if violation is not None:
                    await self._mailbox.send(msgspec.structs.replace(done, violation=violation))
                    return
            receipt = _records_checked(
                intent, recordable(await adapter.execute(intent)), self._records
            )
            done = msgspec.structs.replace(done, receipt=receipt)
        except Exception as exc:
            done = _failed(done, exc, looking)
        await self._mailbox.send(done)

    async def _until(self, at_ns: int | None) -> None:
        if at_ns is not None and self._clock is not None:
            # The due time was recorded: a clock moved past it meanwhile waits no more.
            await self._clock.sleep(max(0, at_ns - self._clock.now_ns()) / 1e9)

    async def look_up(self, dfid: str, intent: ExecutionIntent, last: AdapterDone) -> None:
        """Ask the adapter's lookup what became of ``intent`` before a human is asked."""
        lookup = getattr(self._adapters[intent.adapter], "lookup", None)
        assert callable(lookup)
        done = msgspec.structs.replace(last, looked_up=True)
        try:
            found = await lookup(intent.key)
            receipt = recordable(found) if found is not None else None
        except Exception as exc:
            error = clip(f"{last.error}; lookup failed: {type(exc).__name__}: {exc}", 500)
            done = msgspec.structs.replace(done, error=error, unknown=True)
        else:
            if receipt is not None:
                done = msgspec.structs.replace(done, receipt=receipt, found=True, error="")
            else:
                done = msgspec.structs.replace(done, unknown=False)
        await self._mailbox.send(done)

    async def _check(self, adapter: Adapter, intent: ExecutionIntent) -> Violation | None:
        if self._clock is None:
            # No clock, no way to tell whether the intent is still valid: refused, never
            # called unchecked (the kernel always wires one; a bare engine may not).
            return Violation(
                bound="valid_until_ns",
                detail="no clock to check the intent's validity and bounds against",
            )
        quote_fn = getattr(adapter, "quote", None)
        if not callable(quote_fn):
            # No live view of the world here: the bounds travel in the intent and the
            # system behind the adapter enforces them (a limit order at the exchange).
            return check({}, intent.valid_until_ns, None, self._clock.now_ns())
        quote: Quote | None = await quote_fn(intent) if intent.bounds else None
        return check(intent.bounds, intent.valid_until_ns, quote, self._clock.now_ns())


def _failed(done: AdapterDone, exc: Exception, looking: bool) -> AdapterDone:
    """What a call that raised reports: the adapter's classification, or unknown."""
    if isinstance(exc, AdapterError):
        return msgspec.structs.replace(
            done,
            error=clip(str(exc), 500),
            transient=exc.transient,
            # A lookup that failed leaves the outcome as unknown as before it.
            unknown=exc.outcome_unknown or looking,
        )
    # Unclassified: the call may have reached the system; fail closed.
    error = clip(f"{type(exc).__name__}: {exc}", 500)
    return msgspec.structs.replace(done, error=error, unknown=True)
