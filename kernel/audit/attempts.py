"""One audit record per attempt: every call an agent made for someone, and what became of it.

An attempt is an agent's proposal in a flow with the first verdict it got, whichever
layer gave it (ProposalAccepted: allow; ProposalRejected: deny, with the layer that
refused; FlowEscalated: escalate), or a call decided while the journal's store was away
(DecidedWithoutJournal, marked ``without_journal`` and never shown as an ordinary
allow), or a call a door refused before any flow for a caller it had authenticated
(InputRefused with a ``principal``: layer ``door``, kind the door's entry, no trace id; a
refusal before authentication is nobody's attempt: its claim is not trusted). Whom it
was for (tenant, user, email, tier, delegation chain) is its flow's
``FlowCreated.on_behalf``: the principal, tier and chain of a verdict are its flow's.

The rows are derived from the journal alone, in its order, streaming: the events are
read a page at a time, only the types an attempt is made of, and what is kept between
pages is one small entry per open flow. A flow a kernel opened before principals
existed has no ``on_behalf``: its rows have an empty tenant and user, and say so
(``principal`` False). A later verdict of the same proposal (a human's approval, the
re-judgement just before an approved action runs) is not another attempt: the human's
acts have their own audit (the console's audit page).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec

from kernel.core import events as ev
from kernel.core.events import Event
from kernel.journal.store import Journal

__all__ = ["ALLOW", "DENY", "ESCALATE", "Attempt", "attempts"]

ALLOW = "allow"
DENY = "deny"
ESCALATE = "escalate"

_PAGE = 2000
"""Events read from the store at a time."""

_TYPES = tuple(
    sorted(
        cls.__name__
        for cls in (
            ev.FlowCreated,
            ev.ProposalSubmitted,
            ev.ProposalAccepted,
            ev.ProposalRejected,
            ev.FlowEscalated,
            ev.DecidedWithoutJournal,
            ev.InputRefused,
        )
    )
)
"""The event types an attempt is made of: the only ones read."""


class Attempt(msgspec.Struct, frozen=True, kw_only=True):
    """One call an agent made for a principal, and its verdict.

    Attributes:
        seq: the journal seq of the verdict (or of the DecidedWithoutJournal record).
        ts_ns: when it was decided, on the kernel's clock (ns since the epoch).
        time: the same, ISO 8601 UTC to the millisecond.
        tenant: the principal's tenant ("" when the flow recorded none).
        user: the principal's user id ("" when the flow recorded none).
        email: the principal's email, when its door knew it.
        vouched_by: which door authenticated the principal.
        principal: whether the flow recorded a principal at all (old journals: False).
        kind: the policy kind (the tool) called.
        decision: ``allow``, ``deny`` or ``escalate``.
        reason_code: why it was refused or escalated ("" when allowed).
        detail: what the caller was told.
        layer: the DIM layer that refused it ("" when allowed or escalated).
        trace_id: the flow's DFID (what ``dirk show`` takes, what spans are keyed by).
        chain: the agents the authority passed through, the calling agent last; empty
            for a direct call.
        delegation: the delegation it acted under, or "".
        tier: the calling agent's tier.
        agent: the calling agent.
        attempt: the proposal's attempt number within its flow (0 without the journal).
        without_journal: decided while the journal's store could not be reached, by its
            tenant's fail mode, and appended once the store was back.
    """

    seq: int
    ts_ns: int
    time: str
    tenant: str
    user: str
    email: str
    vouched_by: str
    principal: bool
    kind: str
    decision: str
    reason_code: str
    detail: str
    layer: str
    trace_id: str
    chain: list[str]
    delegation: str
    tier: str
    agent: str
    attempt: int
    without_journal: bool = False


@dataclass
class _Flow:
    """What is kept of an open flow between its events: whom for, and its pending proposal."""

    on_behalf: ev.OnBehalf | None
    agent: str
    kind: str = ""
    attempt: int = 0
    pending: bool = False


@dataclass(frozen=True)
class _Verdict:
    decision: str
    reason_code: str = ""
    detail: str = ""
    layer: str = ""


def _iso(ts_ns: int) -> str:
    return dt.datetime.fromtimestamp(ts_ns / 1e9, tz=dt.UTC).isoformat(timespec="milliseconds")


def _kept(on_behalf: ev.OnBehalf | None, tenant: str | None, user: str | None) -> bool:
    """Whether rows for ``on_behalf`` pass the filters ("" selects flows with no principal)."""
    found_tenant = on_behalf.principal.tenant if on_behalf is not None else ""
    found_user = on_behalf.principal.user if on_behalf is not None else ""
    return (tenant is None or found_tenant == tenant) and (user is None or found_user == user)


def _row(
    event: Event, on_behalf: ev.OnBehalf | None, verdict: _Verdict, flow: _Flow, ts_ns: int
) -> Attempt:
    principal = on_behalf.principal if on_behalf is not None else None
    return Attempt(
        seq=event.seq,
        ts_ns=ts_ns,
        time=_iso(ts_ns),
        tenant=principal.tenant if principal else "",
        user=principal.user if principal else "",
        email=principal.email if principal else "",
        vouched_by=principal.vouched_by if principal else "",
        principal=principal is not None,
        kind=flow.kind,
        decision=verdict.decision,
        reason_code=verdict.reason_code,
        detail=verdict.detail,
        layer=verdict.layer,
        trace_id=event.dfid or "",
        chain=list(on_behalf.chain) if on_behalf else [],
        delegation=on_behalf.delegation if on_behalf else "",
        tier=str(on_behalf.tier) if on_behalf else "",
        agent=flow.agent,
        attempt=flow.attempt,
        without_journal=False,
    )


def _verdict_of(payload: object) -> _Verdict | None:
    """The verdict an event gives its flow's pending proposal; None for any other event."""
    match payload:
        case ev.ProposalAccepted(by_human=False, rechecked=False):
            return _Verdict(ALLOW)
        case ev.ProposalRejected(feedback=feedback):
            return _Verdict(DENY, str(feedback.reason_code), feedback.detail, feedback.layer)
        case ev.FlowEscalated(reason_code=code, detail=detail):
            return _Verdict(ESCALATE, str(code), detail)
    return None


def _unjournalled(event: Event, payload: ev.DecidedWithoutJournal) -> Attempt:
    on_behalf = payload.on_behalf
    flow = _Flow(on_behalf=on_behalf, agent=payload.agent_id, kind=payload.kind)
    verdict = (
        _Verdict(ALLOW, detail=payload.detail)
        if payload.allowed
        else _Verdict(DENY, str(payload.reason_code or ""), payload.detail)
    )
    row = _row(event, on_behalf, verdict, flow, payload.decided_ns)
    return msgspec.structs.replace(row, trace_id=payload.dfid, without_journal=True)


def _at_the_door(
    event: Event, payload: ev.InputRefused, tenant: str | None, user: str | None
) -> Attempt | None:
    """The row of a door's refusal of an authenticated caller (None: nobody's, or filtered)."""
    if payload.principal is None:
        return None
    on_behalf = ev.OnBehalf(principal=payload.principal)
    if not _kept(on_behalf, tenant, user):
        return None
    role, _, name = payload.operator.partition(":")
    flow = _Flow(on_behalf=on_behalf, agent=name if role == "agent" else "", kind=payload.entry)
    verdict = _Verdict(DENY, str(payload.reason_code), payload.detail, "door")
    row = _row(event, on_behalf, verdict, flow, event.ts)
    return msgspec.structs.replace(row, trace_id="", tier="")


class _Deriver:
    """Folds attempt events, one at a time, into rows; keeps only the open flows it needs."""

    def __init__(self, tenant: str | None, user: str | None) -> None:
        self._tenant = tenant
        self._user = user
        self._flows: dict[str, _Flow] = {}

    def feed(self, event: Event) -> Attempt | None:
        payload = event.payload
        if isinstance(payload, ev.DecidedWithoutJournal):
            if not _kept(payload.on_behalf, self._tenant, self._user):
                return None
            return _unjournalled(event, payload)
        if isinstance(payload, ev.InputRefused):
            return _at_the_door(event, payload, self._tenant, self._user)
        dfid = event.dfid or ""
        if isinstance(payload, ev.FlowCreated):
            # Another tenant's or user's flow is never kept: its verdicts find nothing.
            if _kept(payload.on_behalf, self._tenant, self._user):
                self._flows[dfid] = _Flow(payload.on_behalf, event.agent_id or "")
            return None
        flow = self._flows.get(dfid)
        return None if flow is None else _judged(flow, event)


def _judged(flow: _Flow, event: Event) -> Attempt | None:
    """Fold one event of a kept flow: a proposal waits; its first verdict is the row."""
    payload = event.payload
    if isinstance(payload, ev.ProposalSubmitted):
        if not payload.by_human:
            flow.kind, flow.attempt, flow.pending = payload.proposal.kind, payload.attempt, True
        return None
    verdict = _verdict_of(payload)
    if verdict is None or not flow.pending:
        return None
    flow.pending = False
    return _row(event, flow.on_behalf, verdict, flow, event.ts)


async def attempts(
    journal: Journal, *, tenant: str | None = None, user: str | None = None, start: int = 1
) -> AsyncIterator[Attempt]:
    """Yield one :class:`Attempt` per call, in the journal's order.

    Args:
        journal: an open journal (read-only is enough).
        tenant: only this tenant's attempts; "" for those of flows that recorded no
            principal; None for every tenant.
        user: only this user's (within ``tenant`` when both are given); None for all.
        start: the first seq to read.

    Raises:
        JournalCorrupt: an event read does not check out.
    """
    deriver = _Deriver(tenant, user)
    while True:
        page = await journal.read(start, types=_TYPES, limit=_PAGE)
        for event in page:
            row = deriver.feed(event)
            if row is not None:
                yield row
        if len(page) < _PAGE:
            return
        start = page[-1].seq + 1
