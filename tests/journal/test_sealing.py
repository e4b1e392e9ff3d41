"""Sealing: a draft's own envelope values are refused as the event's fault, never a crash."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.core import events as ev
from kernel.core.events import GENESIS_HASH, Draft
from kernel.journal.sealing import EventUnreadable, seal
from tests.support.hostile import hostile_values


@settings(max_examples=150, derandomize=True, deadline=None)
@given(cause=st.one_of(hostile_values(max_leaves=4), st.tuples(st.integers()), st.sets(st.text())))
def test_a_cause_of_any_type_is_sealed_or_refused_as_the_events_fault(cause: Any) -> None:
    drafts = [
        Draft(payload=ev.TriggerFired(topic="t")),
        Draft(payload=ev.FlowCreated(root_dfid="d"), dfid="d", caused_by=cause),
    ]
    try:
        rows, events = seal(drafts, 0, GENESIS_HASH, 1)
    except EventUnreadable:
        return
    except ValueError as exc:
        # A relative cause (-k) that reaches before its append.
        assert "reaches outside its append" in str(exc)
        return
    # Sealed: the cause is an integer (or none) and reads back as itself.
    assert type(events[1].caused_by) in (int, type(None))
    assert rows[1][0] == 2


def test_a_tuple_for_a_cause_is_refused_not_a_type_error() -> None:
    draft = Draft(payload=ev.FlowClosed(), dfid="d", caused_by=(1,))  # type: ignore[arg-type]
    with pytest.raises(EventUnreadable):
        seal([draft], 0, GENESIS_HASH, 1)
