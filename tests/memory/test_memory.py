"""Governed memory: the DML scenarios, end to end through the kernel, and the pure parts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kernel import FlowStatus, Kernel, ReasonCode
from kernel.adapters import AdapterError
from kernel.audit import fold, payload_of, payloads
from kernel.core.events import (
    ConstraintAdded,
    ConstraintAdvisory,
    ExecutionStarted,
    ExecutionSucceeded,
    FactAdded,
    MemoryQueried,
    ProposalRecord,
    ProposalRejected,
)
from kernel.memory import MemoryExecutor
from kernel.state.constraints import advisories, check, mentions, parse
from kernel.state.domain import RecordingReceipt
from kernel.state.memory import MemoryState
from tests.support.helpers import flow_of
from tests.support.memory_domain import Planner, book, booking_kernel, note, remember, run

ACCESS = "verify accessibility before booking"


async def reasons(kernel: Kernel, dfid: str) -> list[ReasonCode]:
    events = await kernel.journal.flow_events(dfid)
    return [p.feedback.reason_code for p in payloads(events, ProposalRejected)]


async def test_never_use_eval_refuses_eval_and_not_evaluate(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db") as kernel:
        agent = Planner(max_attempts=1)
        await kernel.register(agent)
        await run(kernel, agent, remember("memory.add_constraint", text="Never use eval()"))

        refused = await run(kernel, agent, note("parse the rule with eval() on the input"))
        fine = await run(kernel, agent, note("evaluate the rule with a parser"))
        # Memory writes are checked against the constraints too.
        fact = await run(kernel, agent, remember("memory.add_fact", name="tip", value="eval() it"))

        assert flow_of(kernel, refused).status is FlowStatus.ABORTED
        assert await reasons(kernel, refused) == [ReasonCode.CONSTRAINT_VIOLATION]
        [event] = [
            e for e in await kernel.journal.flow_events(refused) if e.type == "ProposalRejected"
        ]
        feedback = payload_of(event, ProposalRejected).feedback
        assert "Never use eval()" in feedback.detail
        assert feedback.layer == "memory"
        assert flow_of(kernel, fine).status is FlowStatus.CLOSED
        assert await reasons(kernel, fact) == [ReasonCode.CONSTRAINT_VIOLATION]
        assert kernel.projections.memory.facts == {}


async def test_verify_before_booking_refuses_until_queried_then_accepts(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db") as kernel:
        agent = Planner()
        await kernel.register(agent)
        await run(
            kernel,
            agent,
            remember("memory.add_fact", name="guest.accessibility", value="step-free"),
        )
        await run(kernel, agent, remember("memory.add_constraint", text=ACCESS))

        # Attempt 1 books and is refused; attempt 2 queries memory (the flow closes on it).
        first = await run(kernel, agent, book(), remember("memory.query", topic="accessibility"))
        assert await reasons(kernel, first) == [ReasonCode.VERIFICATION_REQUIRED]
        feedback = agent.contexts[-1].feedback
        assert feedback is not None and feedback.reason_code is ReasonCode.VERIFICATION_REQUIRED
        queried = payloads(await kernel.journal.flow_events(first), MemoryQueried)
        assert [q.facts for q in queried] == [["guest.accessibility"]]
        assert flow_of(kernel, first).status is FlowStatus.CLOSED

        again = await run(kernel, agent, book())
        assert await reasons(kernel, again) == []
        assert flow_of(kernel, again).status is FlowStatus.CLOSED

        # Another agent has not verified anything: the same booking is refused for it.
        other = Planner("other", max_attempts=1)
        await kernel.register(other)
        theirs = await run(kernel, other, book())
        assert await reasons(kernel, theirs) == [ReasonCode.VERIFICATION_REQUIRED]


async def test_learned_constraint_after_a_bad_booking_refuses_the_next(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db") as kernel:
        agent = Planner(max_attempts=1)
        await kernel.register(agent)
        bad = await run(kernel, agent, book("Bluebell"))
        assert flow_of(kernel, bad).status is FlowStatus.CLOSED
        mistake = next(
            e.seq for e in await kernel.journal.flow_events(bad) if e.type == "ExecutionSucceeded"
        )
        # Without the event of the mistake a learned constraint is refused (fail closed).
        unlinked = await run(
            kernel, agent, remember("memory.add_constraint", text=ACCESS, priority="learned")
        )
        assert await reasons(kernel, unlinked) == [ReasonCode.SCHEMA_INVALID]
        # Nor with an event the journal never recorded (a seq past its head, or none at all).
        head = kernel.projections.last_seq
        for cause in (99999, head + 50, -1):
            invented = await run(
                kernel,
                agent,
                remember(
                    "memory.add_constraint", text=ACCESS, priority="learned", triggered_by=cause
                ),
            )
            [refused] = payloads(await kernel.journal.flow_events(invented), ProposalRejected)
            assert refused.feedback.reason_code is ReasonCode.SCHEMA_INVALID
            assert refused.feedback.field == "params.triggered_by"
            assert "names no recorded event" in refused.feedback.detail
        assert kernel.projections.memory.constraints == {}
        learn = await run(
            kernel,
            agent,
            remember(
                "memory.add_constraint", text=ACCESS, priority="learned", triggered_by=mistake
            ),
        )
        [added] = [
            e for e in await kernel.journal.flow_events(learn) if e.type == "ConstraintAdded"
        ]
        constraint_added = payload_of(added, ConstraintAdded)
        assert constraint_added.triggered_by == mistake
        assert constraint_added.priority == "learned"
        assert constraint_added.correlation_id == learn
        started = next(
            e.seq for e in await kernel.journal.flow_events(learn) if e.type == "ExecutionStarted"
        )
        assert added.caused_by == started  # provenance: the intent that wrote it

        nxt = await run(kernel, agent, book("Granvia"))
        assert await reasons(kernel, nxt) == [ReasonCode.VERIFICATION_REQUIRED]
        constraint = kernel.projections.memory.constraints[added.seq]
        assert constraint.triggered_by == mistake

        # Deactivated, it no longer applies.
        await run(kernel, agent, remember("memory.deactivate_constraint", constraint=added.seq))
        assert kernel.projections.memory.constraints == {}
        booked = await run(kernel, agent, book("Granvia"))
        assert flow_of(kernel, booked).status is FlowStatus.CLOSED
        assert fold(await kernel.journal.read()).memory == kernel.projections.memory


async def test_the_memory_executor_honours_the_intent_key(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db") as kernel:
        agent = Planner()
        await kernel.register(agent)
        dfid = await run(kernel, agent, remember("memory.add_fact", name="a", value="b"))
        events = await kernel.journal.read()
        intent = next(e.payload.intent for e in events if isinstance(e.payload, ExecutionStarted))
        [fact] = [e for e in events if isinstance(e.payload, FactAdded)]
        [succeeded] = [e for e in events if isinstance(e.payload, ExecutionSucceeded)]
        # The fact and the end of its execution are one append, the fact first.
        assert succeeded.seq == fact.seq + 1 and payload_of(fact, FactAdded).key == intent.key

        # Between its effect and its outcome (where a crash leaves a rule proposal), a
        # repeated call and a lookup answer from the record instead of writing again.
        before_outcome = fold([e for e in events if e.seq <= fact.seq])
        executor = MemoryExecutor(before_outcome, kernel.actors.dim)
        again = await executor.execute(intent)
        found = await executor.lookup(intent.key)
        assert again == found and again.external_id == f"memory:{intent.key}"
        assert not isinstance(again, RecordingReceipt)  # nothing more to record
        assert flow_of(kernel, dfid).external_id == again.external_id
        assert await executor.lookup("no such key") is None

        # Once the outcome is recorded the record is gone (it would grow with every write)
        # and the intent is finished: a stray call is refused, never carried out again.
        assert intent.key not in kernel.projections.memory.written
        executor = MemoryExecutor(kernel.projections, kernel.actors.dim)
        with pytest.raises(AdapterError, match="no started memory intent"):
            await executor.execute(intent)
        assert await executor.lookup(intent.key) is None
        assert len(await kernel.journal.read(types=["FactAdded"])) == 1


def proposal(kind: str = "test.note", explain: str = "", **params: Any) -> ProposalRecord:
    return ProposalRecord(kind=kind, params=params, explain=explain)


def with_constraints(*texts: tuple[str, str]) -> MemoryState:
    from kernel.core.events import Event

    state = MemoryState()
    for seq, (text, priority) in enumerate(texts, 1):
        state.apply(Event(seq=seq, ts=0, payload=ConstraintAdded(text=text, priority=priority)))
    return state


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Never use eval()", ("never", "eval()", "")),
        ("do not wire money abroad", ("never", "wire money abroad", "")),
        ("Avoid cat.", ("never", "cat", "")),
        ("Verify accessibility before booking", ("verify", "accessibility", "booking")),
        ("be nice", None),
    ],
)
def test_constraint_texts_parse(text: str, expected: tuple[str, str, str] | None) -> None:
    assert parse(text) == expected


def test_whole_words_only() -> None:
    assert not mentions("concatenate the lists", "cat")
    assert mentions("feed the cat", "cat") and mentions("Cat!", "cat")
    assert mentions("x = eval(s)", "eval()") is False  # the term is eval(), with its parentheses
    assert mentions("call eval() now", "eval()")
    assert not mentions("evaluate", "eval()")


def test_avoid_cat_does_not_refuse_concatenate_and_preferred_is_advisory() -> None:
    state = with_constraints(("avoid cat", "required"), ("never use sudo", "preferred"))
    assert check(state, proposal(text="concatenate"), "a", "r") is None
    refused = check(state, proposal(text="pet the cat"), "a", "r")
    assert refused is not None and refused.reason_code is ReasonCode.CONSTRAINT_VIOLATION
    assert check(state, proposal(text="run sudo"), "a", "r") is None
    assert advisories(state, proposal(text="run sudo"), "a", "r") == [2]


def test_a_query_verifies_for_its_agent_and_its_flow_tree() -> None:
    state = with_constraints((ACCESS, "required"))
    booking = proposal("booking.reserve", hotel="Granvia", nights=2)
    refused = check(state, booking, "a", "root")
    assert refused is not None and refused.reason_code is ReasonCode.VERIFICATION_REQUIRED
    from kernel.core.events import Event

    state.apply(
        Event(
            seq=9,
            ts=0,
            agent_id="b",
            payload=MemoryQueried(topic="accessibility of rooms", correlation_id="root"),
        )
    )
    assert check(state, booking, "a", "root") is None  # same flow tree
    assert check(state, booking, "b", "elsewhere") is None  # same agent
    assert check(state, booking, "c", "elsewhere") is not None


async def test_a_preferred_constraint_is_recorded_as_advisory_not_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kernel.audit.counterfactual import whatif
    from kernel.cli import main

    path = tmp_path / "j.db"
    async with booking_kernel(path) as kernel:
        agent = Planner(max_attempts=1)
        await kernel.register(agent)
        rule = await run(
            kernel,
            agent,
            remember("memory.add_constraint", text="avoid Bluebell", priority="preferred"),
        )
        [added] = [e for e in await kernel.journal.flow_events(rule) if e.type == "ConstraintAdded"]
        advised = await run(kernel, agent, book("Bluebell"))
        plain = await run(kernel, agent, book("Granvia"))
        assert flow_of(kernel, advised).status is FlowStatus.CLOSED  # advisory: not refused
        events = await kernel.journal.flow_events(advised)
        [advisory] = [e for e in events if e.type == "ConstraintAdvisory"]
        assert payload_of(advisory, ConstraintAdvisory).constraints == [added.seq]
        assert "avoid Bluebell" in payload_of(advisory, ConstraintAdvisory).detail
        assert advisory.caused_by == next(e.seq for e in events if e.type == "ProposalSubmitted")
        assert not [
            e for e in await kernel.journal.flow_events(plain) if e.type == "ConstraintAdvisory"
        ]

    import anyio

    assert await anyio.to_thread.run_sync(main, ["show", advised, "--db", str(path)]) == 0
    assert "ADVISORY (not refused) preferred: #" in capsys.readouterr().out

    from kernel.audit import open_journal

    async with open_journal(path, readonly=True) as journal:
        # Counterfactuals see advisories: without the constraint, or with another one.
        without = await whatif(journal, exclude=[added.seq])
        other = await whatif(journal, constraint="avoid Granvia", priority="preferred")
    [gone] = without.changes
    assert gone.dfid == advised
    assert gone.line().endswith(
        f"accepted with advisories #{added.seq} then, would carry advisories none"
    )
    [new] = other.changes
    assert new.dfid == plain and new.now == "would carry advisories #0"
