"""Counterfactual replay: which recorded verdicts would change in another history.

``whatif`` replays the journal with some events removed, or with a constraint
added at a point, and judges every recorded agent proposal again with the
memory layer of the DIM (:func:`kernel.state.constraints.check`) against the memory of
that other history. It reports the verdicts that flip: accepted then, refused
now (and why), or refused by memory then, passing the memory layer now; and
the accepted ones whose advisories (preferred constraints touched, recorded
as ConstraintAdvisory) would differ.

Consequences follow: a memory write that would now be refused writes nothing
in the other history, so a query that would not have happened verifies
nothing later. Everything else is replayed as recorded. The journal is only
read: a counterfactual never writes.
"""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from kernel.core.events import (
    ConstraintAdded,
    ConstraintAdvisory,
    Event,
    FlowAborted,
    FlowCreated,
    FlowEscalated,
    ProposalAccepted,
    ProposalRecord,
    ProposalRejected,
    ProposalSubmitted,
)
from kernel.journal.store import Journal
from kernel.state.constraints import advisories, check
from kernel.state.memory import MEMORY_EVENTS, MemoryState

INJECTED_ID = 0
"""The id an injected constraint carries (real constraints are ids of recorded events)."""


class Change(msgspec.Struct, frozen=True, kw_only=True):
    """A recorded verdict that the other history would change."""

    seq: int
    dfid: str
    agent_id: str
    kind: str
    then: str
    now: str
    reason_code: str = ""
    detail: str = ""

    def line(self) -> str:
        """Return the change as one line of text."""
        why = f": {self.reason_code}" if self.reason_code else ""
        detail = f" ({self.detail})" if self.detail else ""
        return (
            f"#{self.seq} flow {self.dfid} {self.kind} by {self.agent_id}:"
            f" {self.then} then, {self.now}{why}{detail}"
        )


class WhatIf(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of a counterfactual replay."""

    judged: int
    changes: list[Change]


class _Judged(msgspec.Struct, kw_only=True):
    dfid: str
    agent_id: str
    proposal: ProposalRecord
    refused_now: str
    detail_now: str
    advised_now: list[int] = []
    advised_then: list[int] = []


async def whatif(
    journal: Journal,
    *,
    exclude: Collection[int] = (),
    constraint: str | None = None,
    at: int = 1,
    priority: str = "required",
) -> WhatIf:
    """Replay ``journal`` in another history and return the verdicts that would change.

    Args:
        journal: the journal to read (never written).
        exclude: seqs of events the other history does not have.
        constraint: a constraint text the other history adds ...
        at: ... in force from the event with this seq on.
        priority: the injected constraint's priority.
    """
    excluded = frozenset(exclude)
    replay = _Replay()
    injected = constraint is None
    async for batch in journal.scan():
        for event in batch:
            if not injected and event.seq >= at:
                added = ConstraintAdded(text=constraint or "", priority=priority)
                replay.memory.apply(Event(seq=INJECTED_ID, ts=0, payload=added, agent_id="whatif"))
                injected = True
            if event.seq not in excluded:
                replay.feed(event)
    return WhatIf(judged=replay.count, changes=replay.changes)


class _Replay:
    """The other history as it is replayed: memory, the proposals judged again, the changes."""

    def __init__(self) -> None:
        self.memory = MemoryState()
        self.roots: dict[str, str] = {}
        self.judged: dict[int, _Judged] = {}
        self.waiting: dict[str, int] = {}  # dfid -> seq of its proposal awaiting its verdict
        self.refused_dfids: set[str] = set()
        self.changes: list[Change] = []
        self.count = 0

    def feed(self, event: Event) -> None:
        payload, dfid = event.payload, event.dfid or ""
        if type(payload) in MEMORY_EVENTS:
            if dfid not in self.refused_dfids:
                self.memory.apply(event)
        elif isinstance(payload, FlowCreated):
            self.roots[dfid] = payload.root_dfid
        elif isinstance(payload, ProposalSubmitted) and not payload.by_human:
            self.proposed(event, payload, dfid)
        elif isinstance(payload, ProposalAccepted | ProposalRejected | FlowEscalated):
            self.verdict(payload, dfid)
        elif isinstance(payload, ConstraintAdvisory) and event.caused_by in self.judged:
            self.judged[event.caused_by].advised_then = list(payload.constraints)
        elif isinstance(payload, FlowAborted):
            self.waiting.pop(dfid, None)

    def proposed(self, event: Event, payload: ProposalSubmitted, dfid: str) -> None:
        """Judge an agent's proposal against the other history's memory."""
        agent = event.agent_id or ""
        root = self.roots.get(dfid, dfid)
        feedback = check(self.memory, payload.proposal, agent, root)
        self.judged[event.seq] = _Judged(
            dfid=dfid,
            agent_id=agent,
            proposal=payload.proposal,
            refused_now=str(feedback.reason_code) if feedback else "",
            detail_now=feedback.detail if feedback else "",
            advised_now=advisories(self.memory, payload.proposal, agent, root),
        )
        self.waiting[dfid] = event.seq
        self.count += 1
        if feedback is not None:
            self.refused_dfids.add(dfid)

    def verdict(
        self, payload: ProposalAccepted | ProposalRejected | FlowEscalated, dfid: str
    ) -> None:
        """Compare the recorded verdict with the one the other history gave."""
        seq = self.waiting.pop(dfid, None)
        if seq is not None:
            change = _compare(seq, self.judged.pop(seq), payload)
            if change is not None:
                self.changes.append(change)
        if isinstance(payload, ProposalRejected):
            # A rejected attempt wrote nothing; the flow's next attempt is judged anew.
            self.refused_dfids.discard(dfid)


def _compare(
    seq: int, judged: _Judged, verdict: ProposalAccepted | ProposalRejected | FlowEscalated
) -> Change | None:
    base = Change(
        seq=seq,
        dfid=judged.dfid,
        agent_id=judged.agent_id,
        kind=judged.proposal.kind,
        then="",
        now="",
    )
    if isinstance(verdict, ProposalRejected):
        then = verdict.feedback
        if then.layer == "memory" and not judged.refused_now:
            return msgspec.structs.replace(
                base,
                then=f"refused ({then.reason_code})",
                now="would have passed the memory layer",
            )
        return None
    if not judged.refused_now:
        if sorted(judged.advised_now) == sorted(judged.advised_then):
            return None
        # Preferred constraints never refuse: what changes is the advisory on the record.
        then_word = "accepted" if isinstance(verdict, ProposalAccepted) else "escalated"
        return msgspec.structs.replace(
            base,
            then=f"{then_word} with advisories {_ids(judged.advised_then)}",
            now=f"would carry advisories {_ids(judged.advised_now)}",
        )
    then_word = "accepted" if isinstance(verdict, ProposalAccepted) else "escalated"
    return msgspec.structs.replace(
        base,
        then=then_word,
        now="would have been refused",
        reason_code=judged.refused_now,
        detail=judged.detail_now,
    )


def _ids(constraints: list[int]) -> str:
    return ", ".join(f"#{i}" for i in sorted(constraints)) or "none"
