"""Whatever an agent sends, the roadmap answers with a reason code and the kernel goes on.

The roadmap's layer of the DIM is a pure function: drawn over hostile parameters it
refuses or lets through, never raises. Through a real kernel, hostile proposals of
every ``esaa.*`` kind each end their flow with a reason code, the repository is
untouched, and the kernel still does the next honest thing.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel import FlowStatus, ReasonCode
from kernel.audit import verify_journal
from kernel.core.events import ExecutionSucceeded, Feedback
from kernel.state.roadmap import effects, gate
from kernel.state.roadmap.model import KINDS, RoadmapState
from tests.esaa.kit import CONTRACT, TASKS, claim, desk, git
from tests.support.hostile import hostile_text, hostile_values


def opened() -> RoadmapState:
    state = RoadmapState()
    done = effects.Done(
        params={"contract": CONTRACT, "tasks": TASKS, "commit": "a" * 40},
        receipt=ExecutionSucceeded(key="k", detail={"commit": "a" * 40}),
        seq=3,
        agent="lead",
    )
    effects.apply(state, "esaa.open", done)
    assert state.open
    return state


OPENED = opened()
kinds = st.sampled_from(sorted(KINDS))
agents = st.sampled_from(["ada", "bo", "eve", "quinn"]) | hostile_text()
params = st.dictionaries(
    st.sampled_from(["task", "patches", "check", "summary", "title", "contract", "tasks", "files"])
    | hostile_text(),
    hostile_values() | st.dictionaries(hostile_text(), hostile_text() | hostile_values()),
    max_size=4,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(kind=kinds, values=params, agent=agents, fresh=st.booleans())
def test_the_roadmaps_layer_refuses_or_lets_through_and_never_raises(
    kind: str, values: dict[str, Any], agent: str, fresh: bool
) -> None:
    state = RoadmapState() if fresh else OPENED.copy()
    found = gate.check(state, kind, values, agent)
    assert found is None or (isinstance(found, Feedback) and found.reason_code in ReasonCode)
    gate.transform(state, kind, values)  # never raises either
    effects.apply(
        state,
        kind,
        effects.Done(params=values, receipt=ExecutionSucceeded(key="k"), seq=9, agent=agent),
    )


EXAMPLES = itertools.count()
diffs = hostile_text(max_size=80) | st.builds(
    lambda body: "diff --git a/pkg/one.py b/pkg/one.py\n" + body, hostile_text(max_size=80)
)
proposals = st.one_of(
    st.builds(lambda t: {"kind": "esaa.claim", "task": t}, hostile_text()),
    st.builds(
        lambda t, p: {"kind": "esaa.file_patch", "task": t, "patches": p},
        st.sampled_from(["T-1"]) | hostile_text(),
        st.dictionaries(
            st.sampled_from(["pkg/one.py", ".git/x"]) | hostile_text(), diffs, max_size=2
        ),
    ),
    st.builds(lambda c: {"kind": "esaa.run_check", "task": "T-1", "check": c}, hostile_text()),
    st.builds(
        lambda t, s: {"kind": "esaa.report", "task": "T-1", "title": t, "severity": s},
        hostile_text(),
        hostile_text(),
    ),
    st.builds(
        lambda c: {"kind": "esaa.open", "commit": "0" * 40, "contract": c, "tasks": TASKS},
        hostile_text(max_size=100),
    ),
    st.builds(
        lambda f: (
            {"kind": "esaa.open", "commit": "0" * 40, "contract": CONTRACT, "tasks": TASKS}
            | {"files": f}
        ),
        st.dictionaries(hostile_text(), hostile_text() | st.just("1" * 40), max_size=3)
        | hostile_values(),
    ),
)


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sent=st.lists(proposals, min_size=1, max_size=4))
async def test_hostile_proposals_end_with_a_reason_code_and_change_no_file(
    tmp_path: Path, sent: list[dict[str, Any]]
) -> None:
    where = tmp_path / f"run{next(EXAMPLES)}"
    async with desk(where) as d:
        await d.open()
        await d.act("ada", claim("T-1"))
        head = git(d.repo, "rev-parse", "HEAD")
        for proposal in sent:
            agent = "lead" if proposal["kind"] == "esaa.open" else "ada"
            outcome = await d.act(agent, proposal)
            assert outcome.status in (FlowStatus.CLOSED, FlowStatus.ABORTED), outcome
            if not outcome.done:
                assert ReasonCode(outcome.code), outcome
            assert d.kernel.stopped is None
        assert git(d.repo, "rev-parse", "HEAD") == head
        assert git(d.repo, "status", "--porcelain") == ""
        assert (await d.act("ada", {"kind": "esaa.run_check", "task": "T-1", "check": "ok"})).done
        assert d.kernel.flow((await d.act("ada", claim("T-3"))).dfid) is not None
    assert (await verify_journal(where / "j.db")).ok
