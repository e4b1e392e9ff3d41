"""One call in the core: Kernel.propose and Kernel.await_decision, on a real journal.

The scenario of the embedding trial (shared/notes/mission-gaps-and-frameworks.md,
section 4): a framework's agent books rooms through the booking pack; one cheap, one
over the approval threshold, one over the agent's limit, one with a room type that
does not exist; and a model that repeats the same over-limit call.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from kernel import (
    AgentStatus,
    Decision,
    DecisionVerdict,
    FlowStatus,
    Kernel,
    KernelConfig,
    Manifest,
    ReasonCode,
    open_kernel,
)
from kernel.adapters import ExecutionIntent, Receipt
from kernel.audit import rejudge
from kernel.config import Limits, Ports
from kernel.core import events as ev
from kernel.state.projections import fold
from kernel.telemetry import spans_for_events
from kernel.testing import ManualClock, SeededIds, action_of
from policies.booking import BOOKING
from tests.support.principals import LOCAL

AGENT = "sdk-agent"


class Hotel:
    """A hotel at the edge of the world: it books once per idempotency key."""

    def __init__(self) -> None:
        self.calls: list[ExecutionIntent] = []
        self.bookings: dict[str, Receipt] = {}
        self._refs = itertools.count(1)

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        self.calls.append(intent)
        if intent.key not in self.bookings:
            ref = f"bk-{next(self._refs)}"
            self.bookings[intent.key] = Receipt(external_id=ref, detail={"ref": ref})
        return self.bookings[intent.key]


def room(rate: int = 10_000, nights: int = 2, room_type: str = "double") -> dict[str, Any]:
    return {
        "traveller": "cy",
        "hotel": "Miramar",
        "room_type": room_type,
        "nights": nights,
        "nightly_rate_cents": rate,
    }


CHEAP = room()
OVER_THRESHOLD = room(rate=60_000, nights=4)  # 240,000: a human must approve
OVER_LIMIT = room(rate=90_000, nights=5, room_type="suite")  # 450,000 > max_booking 300,000
NO_SUCH_ROOM = room(room_type="penthouse")


@asynccontextmanager
async def booking_kernel(
    path: Path, hotel: Hotel, *, keep_finished: int = 1000, max_attempts: int = 3
) -> AsyncIterator[Kernel]:
    """A kernel with the booking pack, and a session for the framework's agent."""
    config = KernelConfig(
        principal=LOCAL,
        limits=Limits(keep_finished=keep_finished),
        ports=Ports(clock=ManualClock(), ids=SeededIds(11)),
    )
    async with open_kernel(
        path, packs=[BOOKING], adapters={"hotel": hotel}, allow=[AGENT, "other"], config=config
    ) as kernel:
        await kernel.handshake(manifest(AGENT, max_attempts))
        yield kernel


def manifest(
    agent_id: str, max_attempts: int = 3, subscriptions: list[str] | None = None
) -> Manifest:
    return Manifest(
        agent_id=agent_id,
        version="1.0.0",
        capabilities=["booking.reserve_room"],
        subscriptions=subscriptions or ["travel"],
        max_attempts=max_attempts,
    )


async def book(kernel: Kernel, params: dict[str, Any], **kw: Any) -> Decision:
    return await kernel.propose(
        AGENT, "booking.reserve_room", params, explain="book the trip", confidence=0.9, **kw
    )


async def test_one_call_is_judged_executed_and_answered_with_its_receipt(tmp_path: Path) -> None:
    hotel = Hotel()
    async with booking_kernel(tmp_path / "j.db", hotel) as kernel:
        decision = await book(kernel, CHEAP, conversation="run-1", tool_call_id="call-1")
        assert decision.verdict is DecisionVerdict.EXECUTED
        assert decision.result == {"external_id": "bk-1", "ref": "bk-1"}
        assert decision.settled and decision.tool_call_id == "call-1"
        flow = kernel.flow(decision.dfid)
        assert flow is not None and flow.status is FlowStatus.CLOSED
        assert len(hotel.calls) == 1
        [created] = await kernel.journal.read(dfid=decision.dfid, types=["FlowCreated"])
        assert isinstance(created.payload, ev.FlowCreated)
        assert created.payload.conversation_id == "run-1"
        assert created.payload.tool_call_id == "call-1"
        assert created.agent_id == AGENT
        # No trigger, no agent host: the flow's context is recorded for the DIM only.
        types = [e.type for e in await kernel.journal.flow_events(decision.dfid)]
        assert types[:3] == ["FlowCreated", "ContextCompiled", "ProposalSubmitted"]
        assert not await kernel.journal.read(types=["TriggerFired"])


async def test_a_refusal_tells_the_model_why_and_ends_its_flow(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db", Hotel()) as kernel:
        over = await book(kernel, OVER_LIMIT)
        assert over.verdict is DecisionVerdict.REFUSED
        assert over.reason_code is ReasonCode.RISK_LIMIT_EXCEEDED
        assert over.detail == "total 450000 cents is above 300000"
        assert (over.field, over.limit) == ("params.nightly_rate_cents", "300000")
        assert "RISK_LIMIT_EXCEEDED" in over.message() and "limit 300000" in over.message()
        flow = kernel.flow(over.dfid)
        # One proposal per call: its flow ends with the refusal's own reason.
        assert flow is not None and flow.status is FlowStatus.ABORTED
        assert flow.reason_code is ReasonCode.RISK_LIMIT_EXCEEDED
        unknown = await book(kernel, NO_SUCH_ROOM)
        assert unknown.verdict is DecisionVerdict.REFUSED
        assert unknown.reason_code is ReasonCode.CONSTRAINT_VIOLATION
        assert (unknown.field, unknown.limit) == (
            "params.room_type",
            "accessible,double,single,suite",
        )


async def test_an_escalated_call_is_followed_until_a_human_decides(tmp_path: Path) -> None:
    hotel = Hotel()
    async with booking_kernel(tmp_path / "j.db", hotel) as kernel:
        escalated = await book(kernel, OVER_THRESHOLD, conversation="run-1", tool_call_id="c1")
        assert escalated.verdict is DecisionVerdict.ESCALATED
        assert escalated.reason_code is ReasonCode.APPROVAL_REQUIRED
        assert not escalated.settled and not hotel.calls
        # A bounded wait answers the decision as it stands.
        waited = await kernel.await_decision(escalated.dfid, timeout=0)
        assert waited.verdict is DecisionVerdict.ESCALATED

        async def approve() -> None:
            await kernel.decide(
                escalated.dfid,
                "approve",
                operator="ana",
                reason="within the trip's budget",
                action_hash=action_of(kernel, escalated.dfid),
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(approve)
            done = await kernel.await_decision(escalated.dfid)
        assert done.verdict is DecisionVerdict.EXECUTED
        assert done.result["external_id"] == "bk-1"
        assert (done.tool_call_id, done.conversation_dfid) == ("c1", escalated.conversation_dfid)
        assert len(hotel.calls) == 1


async def test_await_decision_on_a_flow_that_does_not_exist(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db", Hotel()) as kernel:
        unknown = await kernel.await_decision("no-such-flow", timeout=None)
        assert unknown.verdict is DecisionVerdict.REFUSED
        assert unknown.reason_code is ReasonCode.FLOW_NOT_ACTIVE


async def test_25_identical_over_limit_calls_in_one_conversation_trip_the_governor(
    tmp_path: Path,
) -> None:
    async with booking_kernel(tmp_path / "j.db", Hotel()) as kernel:
        decisions = [
            await book(kernel, OVER_LIMIT, conversation="loop", tool_call_id=f"call-{n}")
            for n in range(25)
        ]
        assert all(d.verdict is DecisionVerdict.REFUSED for d in decisions)
        codes = [d.reason_code for d in decisions]
        assert codes[:2] == [ReasonCode.RISK_LIMIT_EXCEEDED] * 2
        # The third refusal in a row reaches max_attempts: the conversation stops there.
        assert codes[2:] == [ReasonCode.REASONING_EXHAUSTION] * 23
        assert "3 calls in a row refused" in decisions[2].detail
        assert "RISK_LIMIT_EXCEEDED" in decisions[2].detail
        # Three flows were judged, in one tree; the 22 after the stop opened none.
        judged = [d.dfid for d in decisions[:3]]
        assert all(judged) and not any(d.dfid for d in decisions[3:])
        root = decisions[0].dfid
        assert {d.conversation_dfid for d in decisions} == {root}
        for dfid in judged[1:]:
            flow = kernel.flow(dfid)
            assert flow is not None and flow.parent_dfid == root and flow.root_dfid == root
        tripped = kernel.flow(judged[2])
        assert tripped is not None and tripped.reason_code is ReasonCode.REASONING_EXHAUSTION
        # Each refusal after the stop is on the conversation's record.
        refusals = await kernel.journal.read(dfid=root, types=["SubmissionRefused"])
        assert len(refusals) == 1 + 22
        # The agent is still ACTIVE: its other conversations go on.
        assert kernel.projections.agents[AGENT].status is AgentStatus.ACTIVE
        other = await book(kernel, CHEAP, conversation="another")
        assert other.verdict is DecisionVerdict.EXECUTED


async def test_an_accepted_or_escalated_call_starts_the_count_again(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db", Hotel()) as kernel:
        run = [OVER_LIMIT, OVER_LIMIT, CHEAP, OVER_LIMIT, OVER_LIMIT, OVER_THRESHOLD, OVER_LIMIT]
        verdicts = [(await book(kernel, p, conversation="c")).verdict for p in run]
        refused, executed, escalated = (
            DecisionVerdict.REFUSED,
            DecisionVerdict.EXECUTED,
            DecisionVerdict.ESCALATED,
        )
        assert verdicts == [refused, refused, executed, refused, refused, escalated, refused]
        last = await book(kernel, OVER_LIMIT, conversation="c")
        assert last.reason_code is ReasonCode.RISK_LIMIT_EXCEEDED  # two in a row: not yet


async def test_a_stopped_conversation_stays_stopped_after_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with booking_kernel(db, Hotel(), max_attempts=1) as kernel:
        stopped = await book(kernel, OVER_LIMIT, conversation="loop")
        assert stopped.reason_code is ReasonCode.REASONING_EXHAUSTION
    async with booking_kernel(db, Hotel(), keep_finished=0, max_attempts=1) as kernel:
        again = await book(kernel, CHEAP, conversation="loop")
        assert again.verdict is DecisionVerdict.REFUSED
        assert again.reason_code is ReasonCode.REASONING_EXHAUSTION
        assert "start a new conversation" in again.detail
        fresh = await book(kernel, CHEAP, conversation="loop-2")
        assert fresh.verdict is DecisionVerdict.EXECUTED


async def test_a_call_proposed_twice_has_one_effect(tmp_path: Path) -> None:
    hotel = Hotel()
    async with booking_kernel(tmp_path / "j.db", hotel) as kernel:
        first = await book(kernel, CHEAP, conversation="run", tool_call_id="call-1")
        second = await book(kernel, CHEAP, conversation="run", tool_call_id="call-1")
        assert second.replayed and not first.replayed
        assert (second.dfid, second.verdict, second.result) == (
            first.dfid,
            first.verdict,
            first.result,
        )
        # A later call of the same run, then the first again: still one booking each.
        other = await book(kernel, room(rate=20_000), conversation="run", tool_call_id="call-2")
        again = await book(kernel, CHEAP, conversation="run", tool_call_id="call-1")
        assert other.dfid != first.dfid and again.dfid == first.dfid
        assert len(hotel.calls) == 2
        noticed = await kernel.journal.read(dfid=first.dfid, types=["DuplicateSuppressed"])
        assert [e.payload.source for e in noticed] == ["tool_call", "tool_call"]  # type: ignore[union-attr]


async def test_the_same_call_at_once_twice_has_one_effect(tmp_path: Path) -> None:
    hotel = Hotel()
    async with booking_kernel(tmp_path / "j.db", hotel) as kernel:
        answers: list[Decision] = []

        async def call(conversation: str | None) -> None:
            answers.append(await book(kernel, CHEAP, conversation=conversation, tool_call_id="t"))

        async with anyio.create_task_group() as tg:
            for conversation in ("run", "run", None, None):
                tg.start_soon(call, conversation)
        assert sorted(a.replayed for a in answers) == [False, False, True, True]
        assert len({a.dfid for a in answers}) == 2  # one flow per key
        assert len(hotel.calls) == 2


async def test_a_saved_run_resumed_after_a_restart_gets_the_recorded_decision(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    hotel = Hotel()
    async with booking_kernel(db, hotel) as kernel:
        executed = await book(kernel, CHEAP, conversation="run", tool_call_id="call-1")
        escalated = await book(kernel, OVER_THRESHOLD, conversation="run", tool_call_id="call-2")
        assert escalated.verdict is DecisionVerdict.ESCALATED
        await kernel.decide(
            escalated.dfid,
            "approve",
            operator="ana",
            reason="ok",
            action_hash=action_of(kernel, escalated.dfid),
        )
        await kernel.await_decision(escalated.dfid)
    assert len(hotel.calls) == 2
    # The framework resumes its saved run twice, in a new process: nothing runs again.
    for _ in range(2):
        async with booking_kernel(db, hotel, keep_finished=0) as kernel:
            again = await book(kernel, CHEAP, conversation="run", tool_call_id="call-1")
            approved = await book(kernel, OVER_THRESHOLD, conversation="run", tool_call_id="call-2")
            assert again.replayed and again.dfid == executed.dfid
            assert again.result == executed.result
            assert approved.replayed and approved.verdict is DecisionVerdict.EXECUTED
    assert len(hotel.calls) == 2


async def test_a_call_cites_the_state_its_conversation_last_saw(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db", Hotel()) as kernel:
        assert (await book(kernel, CHEAP, conversation="c")).verdict is DecisionVerdict.EXECUTED
        # The world the agent may see changes while the model thinks.
        await kernel.trigger("travel.news", {"travel.advisory": "strike on Friday"})
        stale = await book(kernel, CHEAP, conversation="c")
        assert stale.verdict is DecisionVerdict.REFUSED
        assert stale.reason_code is ReasonCode.STALE_CONTEXT
        # Told, the model calls again: judged against what it was told.
        fresh = await book(kernel, CHEAP, conversation="c")
        assert fresh.verdict is DecisionVerdict.EXECUTED
        # A call outside any conversation is judged against the state as it opens.
        await kernel.trigger("travel.news", {"travel.advisory": "strike called off"})
        assert (await book(kernel, CHEAP)).verdict is DecisionVerdict.EXECUTED


async def test_replay_and_a_fold_agree_with_the_live_kernel(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with booking_kernel(db, Hotel()) as kernel:
        for params in (CHEAP, OVER_THRESHOLD, OVER_LIMIT, NO_SUCH_ROOM):
            await book(kernel, params, conversation="trial", tool_call_id=str(params))
        await kernel.trigger("travel.news", {"travel.advisory": "fog"})
        for n in range(4):
            await book(kernel, OVER_LIMIT, conversation="trial", tool_call_id=f"loop-{n}")
        live = kernel.projections.digest()
        assert fold(await kernel.journal.read()).digest() == live
        judged = await rejudge(kernel.journal, [BOOKING])
    # Judged: the four calls, then the first of the loop (STALE_CONTEXT: the advisory
    # came after the conversation's last answer), the third refusal in a row, which
    # stopped the conversation: the other three were refused before any flow.
    assert judged.changes == [] and judged.judged == 5


async def test_an_agent_that_may_not_act_gets_no_flow(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db", Hotel()) as kernel:
        await kernel.set_agent_status(AGENT, "SUSPENDED", operator="ana", reason="review")
        suspended = await book(kernel, CHEAP, conversation="c")
        assert suspended.verdict is DecisionVerdict.REFUSED
        assert suspended.reason_code is ReasonCode.AGENT_SUSPENDED and suspended.dfid == ""
        nobody = await kernel.propose(
            "other", "booking.reserve_room", CHEAP, explain="", confidence=1.0
        )
        assert nobody.reason_code is ReasonCode.INVALID_SESSION
        [refused] = await kernel.journal.read(types=["SubmissionRefused"])
        assert refused.payload == ev.SubmissionRefused(
            reason_code=ReasonCode.INVALID_SESSION,
            detail=nobody.detail,
            claimed_agent="other",
        )
        assert not [f for f in kernel.flows() if f.agent_id == "other"]


async def test_the_conversation_and_the_tool_call_reach_the_spans(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db", Hotel()) as kernel:
        first = await book(kernel, CHEAP, conversation="thread-7", tool_call_id="call_a")
        second = await book(kernel, room(rate=20_000), conversation="thread-7", tool_call_id="b")
        spans = spans_for_events(await kernel.journal.read())
    by_flow: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        attrs = dict(span.attributes or {})
        if "dir.child_dfid" in attrs:
            continue  # the parent's trace saying where its child went
        by_flow.setdefault(str(attrs.get("dir.dfid")), []).append(attrs)
    for decision, call in ((first, "call_a"), (second, "b")):
        flow_spans = by_flow[decision.dfid]
        assert all(a.get("gen_ai.conversation.id") == "thread-7" for a in flow_spans)
        tools = [a for a in flow_spans if a.get("gen_ai.operation.name") == "execute_tool"]
        assert [a["gen_ai.tool.call.id"] for a in tools] == [call]
