"""The DIM owns the rulebook: rule proposals and decisions are messages, staged serially."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.audit import payload_of, payloads
from kernel.core.events import Draft, Event, RuleDecided, RuleProposed, RuleSource
from kernel.dim._rules import handle
from kernel.runtime.actors import Outbox, Reply
from kernel.runtime.messages import DecideRule, RetractRule, RuleMessage, SubmitRule
from kernel.state.projections import Projections
from kernel.state.rulebook import RuleNotPending
from kernel.testing import ManualClock
from tests.support.memory_domain import booking_kernel

SOURCED = RuleSource(repo="acme/runbooks", ref="main", path="r.md", blob="b1")


async def test_concurrent_proposals_of_one_rule_are_decided_one_after_another(
    tmp_path: Path,
) -> None:
    async with booking_kernel(tmp_path / "j.db") as kernel:
        decided: list[Event] = []

        async def propose(i: int) -> None:
            event = await kernel.propose_rule(
                "r",
                title="t",
                content=f"version {i}",
                source=SOURCED,
                operator="ana",
                reason="why",
            )
            decided.append(event)

        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(propose, i)

        outcomes = sorted((d.decision, d.reason, d.version) for d in payloads(decided, RuleDecided))
        # Each read the rulebook the previous one left: one new rule, the rest stale.
        assert outcomes == [("defer", "STALE_BASE", 0)] * 5 + [("promote", "NEW_RULE", 1)]
        proposals = await kernel.journal.read(types=["RuleProposed"])
        assert sorted(d.caused_by or 0 for d in decided) == [p.seq for p in proposals]
        assert len(kernel.projections.memory.rulebook.pending) == 5


async def test_two_operators_deciding_one_deferred_proposal_one_wins(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db") as kernel:
        deferred = await kernel.propose_rule(
            "r", title="t", content="c", operator="ana", reason="no source yet"
        )
        assert payload_of(deferred, RuleDecided).decision == "defer"
        seq = deferred.caused_by
        assert seq is not None
        answers: list[Any] = []

        async def decide(decision: str, operator: str) -> None:
            try:
                answers.append(
                    await kernel.decide_rule(seq, decision, operator=operator, reason="mine")
                )
            except RuleNotPending as exc:
                answers.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(decide, "override", "ana")
            tg.start_soon(decide, "skip", "bo")

        won = [a for a in answers if isinstance(a, Event)]
        lost = [a for a in answers if isinstance(a, RuleNotPending)]
        assert len(won) == 1 and len(lost) == 1
        decisions = payloads(await kernel.journal.read(types=["RuleDecided"]), RuleDecided)
        assert [d.decision for d in decisions][1:] == [payload_of(won[0], RuleDecided).decision]
        assert seq not in kernel.projections.memory.rulebook.pending


async def test_the_dim_records_an_agents_rule_proposal_once_per_key(tmp_path: Path) -> None:
    async with booking_kernel(tmp_path / "j.db") as kernel:
        proposal = RuleProposed(rule="r", title="t", content="c", source=SOURCED, key="k1")
        answers = []
        for _ in range(2):
            reply: Reply[list[Event] | Exception] = Reply()
            await kernel.actors.dim.send(SubmitRule(proposal=proposal, reply=reply))
            answers.append(await reply.wait())
        first, again = answers
        assert isinstance(first, list) and [type(e.payload) for e in first] == [
            RuleProposed,
            RuleDecided,
        ]
        assert again == []  # recorded before: nothing new
        assert len(await kernel.journal.read(types=["RuleProposed"])) == 1
        assert kernel.projections.memory.written["k1"] == first[0].seq


# --- one batch or one message at a time: the same events ---------------------------


def _seal(drafts: Sequence[Draft], after: int) -> list[Event]:
    events = []
    for position, draft in enumerate(drafts):
        seq = after + position + 1
        caused_by = draft.caused_by
        if caused_by is not None and caused_by < 0:
            caused_by = seq + caused_by
        events.append(
            Event(
                seq=seq,
                ts=0,
                payload=draft.payload,
                dfid=draft.dfid,
                caused_by=caused_by,
                agent_id=draft.agent_id,
            )
        )
    return events


def _stage(projections: Projections, msgs: Sequence[RuleMessage]) -> list[Draft]:
    out = Outbox(projections, ManualClock())
    for msg in msgs:
        out.begin()
        handle(msg, projections, out)
    return out.drafts


_submit = st.builds(
    lambda rule, content, base, sourced, by_operator, override, reason: SubmitRule(
        proposal=RuleProposed(
            rule=rule,
            title="t",
            content=content,
            source=SOURCED if sourced else RuleSource(),
            base_version=base,
            proposer="ana" if by_operator else "agent",
            by_operator=by_operator,
        ),
        override=override,
        operator="ana",
        reason=reason,
    ),
    st.sampled_from(["a", "b"]),
    st.sampled_from(["x", "y"]),
    st.integers(0, 3),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["why", ""]),
)
_decide = st.builds(
    lambda seq, decision: DecideRule(
        proposal_seq=seq, decision=decision, operator="bo", reason="mine"
    ),
    st.integers(1, 12),
    st.sampled_from(["override", "skip", "promote"]),
)
_retract = st.builds(
    lambda rule: RetractRule(rule=rule, operator="ana", reason="gone"), st.sampled_from(["a", "b"])
)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.lists(st.one_of(_submit, _submit, _decide, _retract), min_size=1, max_size=12))
def test_a_batch_of_rule_messages_records_what_one_at_a_time_would(
    msgs: list[RuleMessage],
) -> None:
    batched = Projections()
    drafts = _stage(batched, msgs)
    batched.apply(_seal(drafts, 0))

    serial = Projections()
    recorded: list[Event] = []
    for msg in msgs:
        events = _seal(_stage(serial, [msg]), len(recorded))
        serial.apply(events)
        recorded += events

    assert [d.payload for d in drafts] == [e.payload for e in recorded]
    assert [d.caused_by for d in _seal(drafts, 0)] == [e.caused_by for e in recorded]
    assert batched.memory.rulebook == serial.memory.rulebook
    for item in serial.memory.rulebook.items.values():
        # Versions never repeat, whatever was retracted, deferred or overridden.
        assert [v.version for v in item.versions] == list(range(1, len(item.versions) + 1))


@pytest.mark.parametrize("decision", ["promote", "defer"])
async def test_a_refused_rule_act_stages_nothing_and_answers_why(decision: str) -> None:
    projections = Projections()
    replies: list[Reply[list[Event] | Exception]] = [Reply(), Reply()]
    out = Outbox(projections, ManualClock())
    for word, reply in zip([decision, "skip"], replies, strict=True):
        msg = DecideRule(proposal_seq=1, decision=word, operator="a", reason="r", reply=reply)
        handle(msg, projections, out)
    assert out.drafts == []
    for effect, arg in out.effects:
        effect(arg)
    wrong_word, not_pending = [await reply.wait() for reply in replies]
    assert isinstance(wrong_word, ValueError) and "override or skip" in str(wrong_word)
    assert isinstance(not_pending, RuleNotPending)
