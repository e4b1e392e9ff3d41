"""Any input to Kernel.propose and Kernel.await_decision: a Decision with a code, never a crash.

Each example drives a real kernel on a real journal file with hostile strings (lone
surrogates, C0/C1 controls, terminal escapes) and hostile values in every argument:
every call answers a Decision (a refusal names a reason code), nothing raises, the
kernel keeps running (a call made afterwards executes), and the journal verifies and
folds to the live state.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel import Decision, DecisionVerdict, ReasonCode
from kernel.audit import verify_journal
from kernel.state.projections import fold
from tests.proposals.test_propose import AGENT, CHEAP, Hotel, book, booking_kernel
from tests.support.hostile import hostile_scalars, hostile_text, hostile_values

EXAMPLES = itertools.count()

ids = st.one_of(st.none(), hostile_text(max_size=30), st.sampled_from([AGENT, "run-1", ""]))
calls = st.fixed_dictionaries(
    {
        "agent_id": st.one_of(st.just(AGENT), hostile_text(max_size=30), hostile_scalars()),
        "kind": st.one_of(st.just("booking.reserve_room"), hostile_text(max_size=30)),
        "params": st.one_of(st.just(CHEAP), hostile_values(max_leaves=8)),
        "explain": st.one_of(hostile_text(max_size=60), hostile_scalars()),
        "confidence": hostile_scalars(),
        "conversation": st.one_of(ids, hostile_scalars()),
        "tool_call_id": st.one_of(ids, hostile_scalars()),
        "trace_context": st.one_of(st.none(), hostile_text(max_size=60), hostile_scalars()),
    }
)


def answered(decision: Any) -> None:
    assert isinstance(decision, Decision)
    if decision.verdict is not DecisionVerdict.EXECUTED:
        assert isinstance(decision.reason_code, ReasonCode) or (
            decision.verdict is DecisionVerdict.ESCALATED
        )


@settings(
    max_examples=30,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(proposed=st.lists(calls, min_size=1, max_size=4), dfids=st.lists(ids, max_size=2))
async def test_no_input_to_propose_stops_the_kernel(
    tmp_path: Path, proposed: list[dict[str, Any]], dfids: list[Any]
) -> None:
    path = tmp_path / f"j{next(EXAMPLES)}.db"  # tmp_path is shared by the examples
    async with booking_kernel(path, Hotel()) as kernel:
        for call in proposed:
            answered(await kernel.propose(**call))
            assert kernel.stopped is None
        for dfid in dfids:
            answered(await kernel.await_decision(dfid, timeout=0))
        assert (await book(kernel, CHEAP)).verdict is DecisionVerdict.EXECUTED
        assert fold(await kernel.journal.read()).digest() == kernel.projections.digest()
    report = await verify_journal(path)
    assert report.ok, report
