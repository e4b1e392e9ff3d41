"""Two commits per flow: a synchronous agent's context, proposal, verdict and intent in one append.

Issue 35's fourth lever. A synchronous agent decides on its context before that context is
durable; the DIM records the compiler's events (trigger, flow, context) with the proposal,
its verdict and its intent in one append, and the outcome is the flow's second commit.
Nothing acts before that append, ``trigger()`` answers after it, and an agent that reasons
in its crew still gets its context only once it is durable. A trigger that carries facts is
recorded before its agents reason (the DIM judges against committed facts). The journal
records the same events either way (tests/hosting/test_run_to_completion.py compares the
paths flow by flow; tests/execution/test_execution_crash.py kills a kernel in between).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from kernel import FlowStatus, Proposal, WorkingContext
from kernel.audit import open_journal, payload_of, verify_journal
from kernel.audit.reverify import rejudge
from kernel.core.events import Event, MessageDeadLettered
from tests.support.helpers import (
    PACK,
    POISON_CRASHES,
    Bank,
    ScriptedAgent,
    kernel_for,
    transfer,
)
from tests.support.hostile import hostile_values

Commits = list[list[Event]]
POISON = lambda ctx: ctx.propose({"kind": "test.poison", "text": "poison"})  # noqa: E731


class Synchronous(ScriptedAgent):
    """The suite's scripted clerk, saying its decide never waits (with no hold, it does not)."""

    synchronous = True


class Durable(ScriptedAgent):
    """A clerk in its crew that notes whether each context's flow was durable when it came."""

    def __init__(self, agent_id: str, known: Any) -> None:
        super().__init__(agent_id)
        self._known = known
        self.durable: list[bool] = []

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        self.durable.append(ctx.dfid in self._known())
        return await super().decide(ctx)


def commits_of(commits: Commits, dfid: str) -> list[list[str]]:
    """The types each commit holding an event of ``dfid`` recorded (all of its events)."""
    return [[e.type for e in batch] for batch in commits if any(e.dfid == dfid for e in batch)]


@pytest.mark.parametrize(("agent", "count"), [(Synchronous, 2), (ScriptedAgent, 3)])
async def test_a_synchronous_agents_flow_commits_twice_and_a_crewed_one_three_times(
    tmp_path: Path, agent: type[ScriptedAgent], count: int
) -> None:
    path = tmp_path / "j.db"
    commits: Commits = []
    async with kernel_for(path) as kernel:
        await kernel.register(agent())
        kernel.journal.add_listener(lambda batch: commits.append(list(batch)))
        [dfid] = await kernel.trigger("bank.invoice")
        # trigger() answers once the flow is durable, whichever path it took.
        assert dfid in kernel.projections.flows
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        assert kernel.stopped is None
    assert (await verify_journal(path)).ok
    seen = commits_of(commits, dfid)
    assert len(seen) == count
    first = ["TriggerFired", "FlowCreated", "ContextCompiled"]
    if count == 2:
        first += ["ProposalSubmitted", "ProposalAccepted", "ExecutionStarted"]
    assert seen[0] == first
    assert seen[-1] == ["ExecutionSucceeded", "FlowClosed"]


async def test_a_trigger_with_facts_is_recorded_before_its_agents_reason(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    commits: Commits = []
    async with kernel_for(path) as kernel:
        await kernel.register(Synchronous())
        kernel.journal.add_listener(lambda batch: commits.append(list(batch)))
        [dfid] = await kernel.trigger("bank.invoice", {"invoice": "inv-1"})
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
    seen = commits_of(commits, dfid)
    assert seen[0] == ["TriggerFired", "FlowCreated", "ContextCompiled"]
    assert len(seen) == 3
    assert (await verify_journal(path)).ok


async def test_a_crewed_agent_beside_a_synchronous_one_gets_its_context_once_durable(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    commits: Commits = []
    async with kernel_for(path) as kernel:
        crewed = Durable("other", lambda: kernel.projections.flows)
        await kernel.register(Synchronous())
        await kernel.register(crewed)
        kernel.journal.add_listener(lambda batch: commits.append(list(batch)))
        dfids = await kernel.trigger("bank.invoice")
        ends = [await kernel.wait_flow(dfid) for dfid in dfids]
        assert kernel.stopped is None
    assert [e.status for e in ends] == [FlowStatus.CLOSED, FlowStatus.CLOSED]
    assert crewed.durable == [True]
    by_agent = {e.agent_id: commits_of(commits, e.dfid) for e in ends}
    # One append opened both flows and judged the synchronous agent's proposal.
    assert by_agent["clerk"][0] == by_agent["other"][0]
    assert len(by_agent["clerk"]) == 2 and len(by_agent["other"]) == 3
    assert (await verify_journal(path)).ok


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=hostile_values())
async def test_hostile_params_decided_before_the_context_is_durable_end_with_a_record(
    tmp_path_factory: Any, value: Any
) -> None:
    def hostile(ctx: WorkingContext) -> Proposal:
        return ctx.propose({"kind": "test.transfer", "account": value, "amount_cents": 5})

    path = tmp_path_factory.mktemp("hostile") / "j.db"
    async with kernel_for(path) as kernel:
        await kernel.register(Synchronous(steps=[hostile, transfer()]))
        [dfid] = await kernel.trigger("bank.invoice")
        end = await kernel.wait_flow(dfid)
        assert end.terminal
        assert kernel.stopped is None
        events: Sequence[Event] = await kernel.journal.read(dfid=dfid)
    # Refused with a reason, then revised: never a stopped kernel or an unreadable record.
    assert [e.type for e in events][:3] == ["FlowCreated", "ContextCompiled", "ProposalSubmitted"]
    assert (await verify_journal(path)).ok


async def test_verdicts_recorded_in_one_append_with_their_context_are_judged_the_same_again(
    tmp_path: Path,
) -> None:
    def bad(ctx: WorkingContext) -> Proposal:
        return ctx.propose({"kind": "test.transfer", "account": "acc-1", "amount_cents": "x"})

    path = tmp_path / "j.db"
    async with kernel_for(path) as kernel:
        # A rejection, then an acceptance, each decided before its context was durable.
        await kernel.register(Synchronous(steps=[bad, transfer()]))
        [dfid] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        types = [e.type for e in await kernel.journal.read(dfid=dfid)]
    assert types.count("ProposalSubmitted") == 2
    assert "ProposalRejected" in types and "ProposalAccepted" in types
    async with open_journal(path, readonly=True) as journal:
        again = await rejudge(journal, [PACK])
    assert (again.judged, again.changes, again.mismatches) == (2, [], [])


async def test_a_carried_batch_the_dim_cannot_handle_is_recorded_by_the_compiler_and_reasoned_again(
    tmp_path: Path,
) -> None:
    # Judging the proposal crashes the DIM twice: the Carry is dead-lettered, nothing of
    # it was recorded, and the compiler records its own batch; the agent reasons again.
    POISON_CRASHES["remaining"] = 2
    bank = Bank()
    path = tmp_path / "j.db"
    async with kernel_for(path, bank=bank) as kernel:
        agent = Synchronous(capabilities=["test.poison"], steps=[POISON])
        await kernel.register(agent)
        [dfid] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        assert kernel.stopped is None
        [letter] = await kernel.journal.read(types=["MessageDeadLettered"])
        types = [e.type for e in await kernel.journal.read(dfid=dfid)]
    assert payload_of(letter, MessageDeadLettered).message.startswith("Carry(")
    assert [ctx.attempt for ctx in agent.contexts] == [1, 1]
    assert types.count("FlowCreated") == types.count("ProposalSubmitted") == 1
    assert len(bank.calls) == 1
    assert (await verify_journal(path)).ok
