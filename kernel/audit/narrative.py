"""A flow's narrative in plain words: what ``dirk show`` prints and the console shows.

One line per event, the same words everywhere a person reads a flow. The words for each event
type are a small function in one table (``kernel.audit._words.WORDS``), entered with ``@says``
by the modules of words beside this one: a new event type is a new entry, never a longer
``match``.
"""

from __future__ import annotations

import msgspec

from kernel.audit import _flow_words, _state_words
from kernel.audit._words import WORDS
from kernel.core import events as ev
from kernel.core.events import Event
from kernel.core.flow import FlowState

_MODULES_OF_WORDS = (_flow_words, _state_words)
"""Imported for their entries in the table."""


def outcome(flow: FlowState) -> str:
    """Return how a flow ended (or where it stands), in one line."""
    tries = f"{flow.attempts} attempt{'s' if flow.attempts != 1 else ''}"
    line = f"final status {flow.status} after {tries}"
    if flow.reason_code:
        line += f", reason {flow.reason_code}"
    if flow.external_id:
        line += f", external id {flow.external_id}"
    if flow.needs_review:
        line += "; NEEDS_REVIEW (see the flags above)"
    return line


def narrate(event: Event) -> str:
    """Return what one event of a flow says, in one line (two for a proposal's explanation)."""
    payload = event.payload
    if isinstance(payload, ev.FlowCreated):
        return f"trigger {payload.topic!r}" + (
            f" (caused by #{event.caused_by})" if event.caused_by else ""
        )
    line = _words_of(payload)
    if line is not None:
        return line
    # An event type this module does not know yet (a domain's): its fields, in words.
    fields = msgspec.structs.asdict(payload) if isinstance(payload, msgspec.Struct) else {}
    shown = ", ".join(f"{k}={v!r}" for k, v in list(fields.items())[:6])
    return f"{event.type}: {shown}"[:300]


def _words_of(payload: object) -> str | None:
    """Return the line the table has for this payload's type; None for a type it lacks."""
    words = WORDS.get(type(payload))
    return None if words is None else words(payload)
