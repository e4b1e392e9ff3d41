"""What travels together in one row: the events a row stands for, and staging one more.

The journal stores one row where events always travel together with nothing recorded
between them (issue 45's fourth lever): a FlowCreated and its flow's first context, a
closing success and its FlowClosed, a submission and its acceptance, an acceptance and
its start. Every reader gets the events a row stands for right after it
(:func:`kernel.core.events.with_derived`); this module says which, for a row being staged
(:meth:`kernel.runtime.actors.Outbox.travel_with`) and for one being read.
"""

from __future__ import annotations

from msgspec.structs import replace

from kernel.core.events import (
    ContextCompiled,
    Event,
    ExecutionStarted,
    FlowCreated,
    Payload,
    ProposalAccepted,
    ProposalSubmitted,
    derived_of,
)


def derived_chain(event: Event) -> list[Event]:
    """Return every event ``event``'s row stands for, in order (none for most rows).

    A derived event may stand for one more: a submission carrying its acceptance stands
    for that ProposalAccepted, which may carry its start (an ExecutionStarted after it).
    """
    chain: list[Event] = []
    derived = derived_of(event)
    while derived is not None:
        chain.append(derived)
        derived = derived_of(derived)
    return chain


def carrying(row: Payload, payload: Payload) -> Payload | None:
    """Return ``row`` standing for ``payload`` too (the next event of its flow), or None.

    A FlowCreated carries its flow's first context, a submission its acceptance (one
    without a start yet), an acceptance its start, also when the acceptance is itself
    carried by its submission.
    """
    kind, carried = type(row), type(payload)
    if kind is ProposalSubmitted:
        return _submission(row, payload)  # type: ignore[arg-type]
    if kind is FlowCreated and carried is ContextCompiled and row.context is None:  # type: ignore[attr-defined]
        return replace(row, context=payload)
    if kind is ProposalAccepted and carried is ExecutionStarted and row.start is None:  # type: ignore[attr-defined]
        return replace(row, start=payload.intent)  # type: ignore[attr-defined]
    return None


def _submission(row: ProposalSubmitted, payload: Payload) -> Payload | None:
    accepted = row.accepted
    if accepted is not None:
        inner = carrying(accepted, payload)
        return None if inner is None else replace(row, accepted=inner)
    if type(payload) is ProposalAccepted and payload.start is None:
        return replace(row, accepted=payload)
    return None


__all__ = ["carrying", "derived_chain"]
