"""Agents that decide synchronously run to completion where their context is delivered.

Issue 35's second lever: an agent that says ``synchronous = True`` is called in the context
compiler's after-commit step, and its proposal goes straight to the DIM's mailbox: no crew
task, no mailbox, no reply to wait for. What must not change is what the journal records:
each test runs the same script through a synchronous agent and through the crew (the same
agent saying False) in one kernel, and compares the flows event by event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec
from hypothesis import HealthCheck, given, settings

from kernel import FlowStatus, Proposal, ReasonCode, WorkingContext
from kernel.audit import verify_journal
from kernel.core.events import Event
from kernel.core.flow import FlowState
from tests.support.helpers import ScriptedAgent, kernel_for, transfer
from tests.support.hostile import hostile_text

Step = Callable[[WorkingContext], Proposal | None]


class Synchronous(ScriptedAgent):
    """The suite's scripted clerk, saying its decide never waits (with no hold, it does not)."""

    synchronous = True

    def __init__(self, agent_id: str, steps: Sequence[Step], **kw: Any) -> None:
        super().__init__(agent_id, steps, **kw)
        self.tasks: list[str] = []

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        task = asyncio.current_task()
        self.tasks.append(task.get_name() if task is not None else "")
        return await super().decide(ctx)


class Crewed(Synchronous):
    """The same agent, decided by its crew (the path every agent took before)."""

    synchronous = False


VARYING = frozenset(
    {
        "context_ref",
        "key",
        "intent_id",
        "proposal_hash",
        "action",
        "context_hash",
        "dfid",
        "external_id",
    }
)
"""Fields that differ between two flows of one trigger whatever path they took (ids, hashes)."""


def _without_ids(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_ids(v) for k, v in value.items() if k not in VARYING}
    if isinstance(value, list):
        return [_without_ids(v) for v in value]
    return value


def shape(events: Sequence[Event]) -> list[tuple[str, Any]]:
    """A flow's events without what differs between two flows: seqs, times, ids, hashes."""
    return [(e.type, _without_ids(msgspec.to_builtins(e.payload))) for e in events]


async def run_both(
    path: Path, steps: Sequence[Step], **kw: Any
) -> tuple[Synchronous, Crewed, list[FlowState], list[list[tuple[str, Any]]]]:
    """Open a kernel, host both agents on one topic, fire once; return both flows' ends."""
    sync = Synchronous("clerk", steps)
    crew = Crewed("other", steps)
    async with kernel_for(path, **kw) as kernel:
        await kernel.register(sync)
        await kernel.register(crew)
        dfids = await kernel.trigger("bank.invoice")
        ends = [await kernel.wait_flow(dfid) for dfid in dfids]
        await kernel.wait_quiet()
        shapes = [shape(await kernel.journal.read(dfid=dfid)) for dfid in dfids]
        assert kernel.stopped is None
    assert (await verify_journal(path)).ok
    by_agent = dict(zip([e.agent_id for e in ends], zip(ends, shapes, strict=True), strict=True))
    order = ["clerk", "other"]
    return (
        sync,
        crew,
        [by_agent[a][0] for a in order],
        [[s for s in by_agent[a][1] if s[0] != "FlowCreated"] for a in order],
    )


async def test_a_synchronous_agent_decides_in_the_compilers_step_and_records_the_same(
    tmp_path: Path,
) -> None:
    sync, crew, (fast, slow), (fast_events, slow_events) = await run_both(
        tmp_path / "j.db", [transfer()]
    )
    assert fast.status is slow.status is FlowStatus.CLOSED
    assert sync.tasks == ["actor:context"]  # no task of its own: the compiler's
    assert crew.tasks == ["agent:0"]
    assert fast_events == slow_events
    assert [t for t, _ in fast_events][:3] == [
        "ContextCompiled",
        "ProposalSubmitted",
        "ProposalAccepted",
    ]


async def test_a_rejected_synchronous_attempt_is_revised_with_its_feedback(
    tmp_path: Path,
) -> None:
    def bad(ctx: WorkingContext) -> Proposal:
        return ctx.propose({"kind": "test.transfer", "account": "acc-1", "amount_cents": "x"})

    sync, crew, ends, (fast_events, slow_events) = await run_both(
        tmp_path / "j.db", [bad, transfer()]
    )
    assert [e.status for e in ends] == [FlowStatus.CLOSED, FlowStatus.CLOSED]
    assert len(sync.contexts) == len(crew.contexts) == 2
    assert sync.contexts[1].feedback == crew.contexts[1].feedback
    assert sync.contexts[1].feedback is not None
    assert sync.contexts[1].feedback.reason_code is ReasonCode.SCHEMA_INVALID
    assert fast_events == slow_events


async def test_a_synchronous_agent_that_fails_or_declines_ends_its_flow_as_in_the_crew(
    tmp_path: Path,
) -> None:
    def broken(ctx: WorkingContext) -> Proposal:
        raise RuntimeError("no model")

    def declines(ctx: WorkingContext) -> None:
        return None

    cases: list[tuple[list[Step], ReasonCode]] = [
        ([broken], ReasonCode.AGENT_ERROR),
        ([declines], ReasonCode.AGENT_DECLINED),
    ]
    for n, (steps, code) in enumerate(cases):
        _, _, ends, (fast_events, slow_events) = await run_both(tmp_path / f"{n}.db", steps)
        assert [e.reason_code for e in ends] == [code, code]
        assert fast_events == slow_events


async def test_tokens_spent_by_a_synchronous_agent_count_across_its_attempts(
    tmp_path: Path,
) -> None:
    def spend_bad(ctx: WorkingContext) -> Proposal:
        ctx.report_usage(tokens=60)
        return ctx.propose({"kind": "test.transfer", "account": "acc-1", "amount_cents": "x"})

    def spend_good(ctx: WorkingContext) -> Proposal:
        ctx.report_usage(tokens=60)
        return transfer()(ctx)

    # 60 + 60 is over the budget of 100: the second attempt ends the flow, in both paths.
    _, _, ends, (fast_events, slow_events) = await run_both(
        tmp_path / "j.db", [spend_bad, spend_good], token_budget=100
    )
    assert [e.reason_code for e in ends] == [ReasonCode.TOKEN_BUDGET_EXHAUSTED] * 2
    assert fast_events == slow_events


async def test_an_agent_that_says_synchronous_but_waits_is_handed_to_its_crew(
    tmp_path: Path,
) -> None:
    hold = anyio.Event()
    liar = Synchronous("clerk", [transfer()], hold=hold)
    path = tmp_path / "j.db"
    async with kernel_for(path) as kernel:
        await kernel.register(liar)
        [first] = await kernel.trigger("bank.invoice")
        await liar.wait_context(2)  # closed at its wait, then reasoned again by the crew
        hold.set()
        assert (await kernel.wait_flow(first)).status is FlowStatus.CLOSED
        [second] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(second)).status is FlowStatus.CLOSED
        assert kernel.stopped is None
    # Once it waited, the crew takes its contexts: each later attempt is reasoned once.
    assert liar.tasks[0] == "actor:context"
    assert len(liar.tasks) == 3 and all(t.startswith("agent:") for t in liar.tasks[1:])
    assert (await verify_journal(path)).ok


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(explain=hostile_text(max_size=60), account=hostile_text(max_size=20))
async def test_hostile_proposals_end_the_same_through_either_path(
    tmp_path_factory: Any, explain: str, account: str
) -> None:
    def hostile(ctx: WorkingContext) -> Proposal:
        return ctx.propose(
            {"kind": "test.transfer", "account": account, "amount_cents": 5}, explain=explain
        )

    path = tmp_path_factory.mktemp("hostile") / "j.db"
    _, _, (fast, slow), (fast_events, slow_events) = await run_both(path, [hostile])
    assert (fast.status, fast.reason_code) == (slow.status, slow.reason_code)
    assert fast_events == slow_events
