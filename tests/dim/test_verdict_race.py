"""Verdicts replay when an agent's saga fails while its next proposal is judged (issue 44, 0).

The executor records a saga failing (ExecutionFailed, FlowDirty) while the DIM judges the
same agent's next proposal; both can land in one group commit, or the failure in the
transaction in flight while the DIM judges. Whatever the interleaving, the verdict must be
what replay finds from the events recorded before it: ``dirk verify --verdicts`` (here
:func:`kernel.audit.reverify.rejudge`) reports no difference on an untouched journal.

Many flows per journal, each a two-leg trip whose second leg fails every other time,
triggered in waves so that proposals and failures keep crossing: a few journals reach
thousands of races, on SQLite and on PostgreSQL, with synchronous and crewed agents.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from kernel.adapters import AdapterError, ExecutionIntent, Receipt
from kernel.audit import open_journal
from kernel.audit.reverify import rejudge
from kernel.core.events import (
    Event,
    Feedback,
    ProposalAccepted,
    ProposalRecord,
    ProposalRejected,
    ProposalSubmitted,
)
from kernel.core.flow import FlowState, FlowStatus, StaleVerdict
from kernel.core.reasons import ReasonCode
from kernel.dim import _raced as raced
from kernel.dim._gate import unsettled_detail
from kernel.state.projections import Projections
from tests.support.execution_domain import DESK, Desk, Trip, agent, desk_kernel
from tests.support.postgres import PostgresServer, postgres_server  # noqa: F401

LANES = 3
FLOWS = 150


class Flaky(Desk):
    """A desk whose hotel is full every other booking: half the trips unwind."""

    def __init__(self) -> None:
        super().__init__()
        self.hotels = 0

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        if intent.action == "book_hotel" and not intent.compensation:
            self.hotels += 1
            if self.hotels % 2 == 0:
                self.calls.append(intent)
                raise AdapterError("full")
        return await super().execute(intent)


@pytest.fixture(params=["sqlite", "postgres"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the journal goes: a file, or an empty PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "j.db")
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.new_url()


@pytest.mark.parametrize("synchronous", [True, False], ids=["synchronous", "crewed"])
async def test_no_verdict_differs_when_sagas_fail_beside_the_next_proposal(
    location: str, synchronous: bool
) -> None:
    trip = Trip(legs=["flight", "hotel"])
    clerk = agent(trip, max_attempts=1)
    # The host reads the agent's own attribute: its decide never waits.
    clerk.synchronous = synchronous  # type: ignore[attr-defined]
    flows: list[str] = []
    async with desk_kernel(location, Flaky()) as kernel:  # type: ignore[arg-type]
        await kernel.register(clerk)

        async def fire() -> None:
            # One trigger after another: each proposal is judged while the trips
            # before it execute, fail and unwind.
            for _ in range(FLOWS):
                flows.extend(await kernel.trigger("desk.go"))

        async with anyio.create_task_group() as tg:
            for _ in range(LANES):
                tg.start_soon(fire)
        await kernel.wait_quiet()
    async with open_journal(location) as journal:
        result = await rejudge(journal, [DESK])
        accepted = await journal.read(types=["ProposalAccepted"])
        passive = [
            e
            for e in await journal.read(types=["ProposalRejected"])
            if isinstance(e.payload, ProposalRejected)
            and e.payload.feedback.reason_code == "AGENT_PASSIVE"
        ]
    assert result.changes == [] and result.mismatches == []
    assert all(isinstance(e.payload, ProposalAccepted) for e in accepted)
    # The race was run: proposals were judged while this agent's sagas were unwinding.
    assert accepted and passive
    assert result.judged == len(flows)


def _state(dfid: str, status: FlowStatus) -> FlowState:
    return FlowState(
        dfid=dfid,
        root_dfid=dfid,
        parent_dfid=None,
        agent_id="clerk",
        topic="desk.go",
        status=status,
        created_ts=0,
        updated_ts=0,
        last_seq=1,
        done=1,
    )


def _append(verdict: ProposalAccepted | ProposalRejected, by_human: bool = False) -> list[Event]:
    record = ProposalRecord(kind="desk.ping", params={"text": "hi"})
    submitted = ProposalSubmitted(attempt=1, proposal=record, by_human=by_human)
    return [
        Event(seq=10, ts=0, payload=submitted, dfid="next", agent_id="clerk"),
        Event(seq=11, ts=0, payload=verdict, dfid="next", agent_id="clerk"),
    ]


def _rejected(layer: str, code: ReasonCode, detail: str) -> ProposalRejected:
    return ProposalRejected(
        attempt=1, feedback=Feedback(reason_code=code, detail=detail, layer=layer)
    )


def test_the_check_refuses_a_verdict_that_missed_a_saga_staged_before_it() -> None:
    projections = Projections()
    unwinding = {"trip": _state("trip", FlowStatus.DIRTY)}
    accepted = ProposalAccepted(attempt=1)
    with pytest.raises(StaleVerdict):
        raced.check(projections, _append(accepted), unwinding)
    # Nothing staged before it: the verdict saw what precedes it.
    raced.check(projections, _append(accepted), {})
    # A human's modification and a refusal before the status layer never read sagas.
    raced.check(projections, _append(accepted, by_human=True), unwinding)
    schema = _rejected("schema", ReasonCode.SCHEMA_INVALID, "no")
    raced.check(projections, _append(schema), unwinding)
    # A refusal for the very flows staged before it stands; one for other flows does not.
    passive = _rejected("status", ReasonCode.AGENT_PASSIVE, unsettled_detail("clerk", ["trip"]))
    raced.check(projections, _append(passive), unwinding)
    with pytest.raises(StaleVerdict):
        raced.check(projections, _append(passive), {})
