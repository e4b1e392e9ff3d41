"""Unknown outcomes: an effect that may have happened is never recorded as one that did not.

A call whose answer is lost may have taken effect. The engine asks ``lookup``
before any human, calls a key-honouring adapter again while the intent is
valid, and then escalates with OUTCOME_UNKNOWN, the intent still pending; only
a human's reconcile (what the system shows) or retry (same key) moves it on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from kernel import FlowStatus, Kernel, Outcome, ReasonCode
from kernel.adapters import AdapterError, RetryPolicy
from kernel.adapters.contract import Receipt
from kernel.audit import IllegalTransition, fold, payload_of
from kernel.core.events import (
    AnyPayload,
    Event,
    ExecutionFailed,
    ExecutionIntent,
    ExecutionRetried,
    ExecutionSucceeded,
    FlowEscalated,
    HumanDecided,
    ProposalAccepted,
)
from kernel.core.flow import apply
from kernel.inbox import DecideRequest
from kernel.inbox.requests import decode_row
from kernel.journal.inbox_store import open_inbox
from kernel.journal.verify import verify_journal
from kernel.runtime.messages import Tick
from kernel.testing import flow_types
from tests.support import ROOT
from tests.support.execution_domain import (
    After,
    Desk,
    LookupDesk,
    Ping,
    Trip,
    Watch,
    agent,
    desk_kernel,
)
from tests.support.helpers import flow_of, manual_clock
from tests.support.operators import Keys

# Two calls, then calls again while the 60 s intent is valid (delays 1, 2, 4, 8, 16 s).
POLICY = RetryPolicy(max_attempts=2, base_s=1.0, factor=2.0, max_s=30.0, jitter=0.0)
DELAYS = [1, 2, 4, 8, 16]


def lost(n: int) -> list[Exception]:
    """``n`` calls whose effect happens and whose answer is lost."""
    return [After(AdapterError("read timeout", transient=True)) for _ in range(n)]


async def escalate_unknown(kernel: Kernel, desk: Desk) -> str:
    """Run one ping whose every answer is lost until the flow waits for a human."""
    watch = Watch(kernel)
    await kernel.register(agent(Ping(text="hi")))
    [dfid] = await kernel.trigger("desk.go")
    for n, delay in enumerate(DELAYS, 1):
        [*_, last] = await watch.events(dfid, "ExecutionRetried", n)
        retried = payload_of(last, ExecutionRetried)
        assert retried.unknown and retried.delay_ns == delay * 10**9
        manual_clock(kernel).advance(delay)
    return dfid


async def test_lost_answers_retry_within_validity_then_escalate_outcome_unknown(
    tmp_path: Path,
) -> None:
    desk = Desk({"desk.ping": lost(6)}, retry_policy=POLICY)
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        dfid = await escalate_unknown(kernel, desk)
        flow = await kernel.wait_flow(dfid)

        # Past max_attempts (2) while the intent was valid; the sixth call would end
        # after its 60 s window, so a human is asked, and told the effect may exist.
        assert len(desk.calls) == 6 and len(desk.effects) == 1
        assert (flow.status, flow.reason_code) == (FlowStatus.ESCALATED, ReasonCode.OUTCOME_UNKNOWN)
        assert flow.pending is not None and flow.pending.key == desk.calls[0].key
        assert "outcome unknown" in flow.detail
        [failed] = await kernel.journal.read(dfid=dfid, types=["ExecutionFailed"])
        assert payload_of(failed, ExecutionFailed).unknown
        assert "ExecutionSucceeded" not in await flow_types(kernel, dfid)

        # Neither a rejection nor an approval may guess at the world.
        for word in ("reject", "abort", "approve", "override"):
            verdict = await kernel.decide(dfid, word, operator="ana", reason="guess")
            assert verdict.outcome is Outcome.REFUSED
            assert verdict.feedback is not None
            assert verdict.feedback.reason_code is ReasonCode.OUTCOME_UNKNOWN
        for params in (None, {"outcome": "done"}, {"outcome": "maybe"}):
            verdict = await kernel.decide(
                dfid, "reconcile", operator="ana", reason="checked", params=params
            )
            assert verdict.feedback is not None
            assert verdict.feedback.reason_code is ReasonCode.SCHEMA_INVALID
        assert flow_of(kernel, dfid).status is FlowStatus.ESCALATED

        # The operator looks the key up in the desk and records what it shows.
        shown = desk.effects[flow.pending.key].external_id
        verdict = await kernel.decide(
            dfid,
            "reconcile",
            operator="ana",
            reason="the desk shows it",
            params={"outcome": "done", "external_id": shown},
        )
        assert verdict.outcome is Outcome.ACCEPTED
        flow = await kernel.wait_flow(dfid)
        assert (flow.status, flow.external_id) == (FlowStatus.CLOSED, shown)
        [event] = await kernel.journal.read(dfid=dfid, types=["ExecutionSucceeded"])
        succeeded = payload_of(event, ExecutionSucceeded)
        assert succeeded.reconciled and succeeded.detail == {"reconciled_by": "ana"}
        assert len(desk.calls) == 6  # reconciling calls nothing
        # A decided flow takes no second decision.
        again = await kernel.decide(dfid, "retry", operator="bo", reason="late")
        assert again.feedback is not None
        assert again.feedback.reason_code is ReasonCode.FLOW_NOT_ACTIVE


async def test_a_retry_calls_again_with_the_same_key(tmp_path: Path) -> None:
    desk = Desk({"desk.ping": lost(6)}, retry_policy=POLICY)
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        dfid = await escalate_unknown(kernel, desk)
        await kernel.wait_flow(dfid)
        verdict = await kernel.decide(dfid, "retry", operator="ana", reason="the desk is back")
        assert verdict.outcome is Outcome.ACCEPTED
        flow = await kernel.wait_flow(dfid)

        assert flow.status is FlowStatus.CLOSED
        assert len(desk.calls) == 7 and len({c.key for c in desk.calls}) == 1
        assert len(desk.effects) == 1
        assert flow.external_id == desk.effects[desk.calls[0].key].external_id


async def test_a_reconcile_as_not_done_fails_the_flow_as_recorded(tmp_path: Path) -> None:
    # Timeouts before anything happened, but the desk cannot say so: unknown.
    timeouts: list[Exception] = [AdapterError("connect timeout", transient=True) for _ in range(6)]
    desk = Desk({"desk.ping": timeouts}, retry_policy=POLICY)
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        dfid = await escalate_unknown(kernel, desk)
        assert (await kernel.wait_flow(dfid)).reason_code is ReasonCode.OUTCOME_UNKNOWN
        verdict = await kernel.decide(
            dfid, "reconcile", operator="ana", reason="no trace", params={"outcome": "not_done"}
        )
        assert verdict.outcome is Outcome.ABORTED
        flow = await kernel.wait_flow(dfid)
        assert (flow.status, flow.reason_code) == (FlowStatus.ABORTED, ReasonCode.EXECUTION_FAILED)
        assert "not done (reconciled by ana)" in flow.detail
        assert desk.effects == {}


async def test_a_lookup_is_asked_before_any_human(tmp_path: Path) -> None:
    policy = RetryPolicy(max_attempts=1)
    desk = LookupDesk({"desk.ping": lost(1)}, retry_policy=policy)
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        await kernel.register(agent(Ping(text="hi")))
        [dfid] = await kernel.trigger("desk.go")
        flow = await kernel.wait_flow(dfid)

        assert flow.status is FlowStatus.CLOSED
        assert len(desk.calls) == 1 and desk.lookups == [desk.calls[0].key]
        [succeeded] = await kernel.journal.read(dfid=dfid, types=["ExecutionSucceeded"])
        assert payload_of(succeeded, ExecutionSucceeded).recovered


async def test_a_lookup_that_finds_nothing_makes_the_failure_known(tmp_path: Path) -> None:
    policy = RetryPolicy(max_attempts=1)
    timeout = AdapterError("connect timeout", transient=True)
    desk = LookupDesk({"desk.ping": [timeout]}, retry_policy=policy)
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        await kernel.register(agent(Ping(text="hi")))
        [dfid] = await kernel.trigger("desk.go")
        flow = await kernel.wait_flow(dfid)

        # Known not done: the usual operational escalation, which an approval may retry.
        assert (flow.status, flow.reason_code) == (
            FlowStatus.ESCALATED,
            ReasonCode.EXECUTION_FAILED,
        )
        assert flow.pending is None and len(desk.lookups) == 1
        verdict = await kernel.decide(dfid, "retry", operator="ana", reason="again")
        assert verdict.feedback is not None
        assert verdict.feedback.reason_code is ReasonCode.SCHEMA_INVALID


async def test_a_refusal_before_the_effect_after_a_lost_answer_stays_unknown(
    tmp_path: Path,
) -> None:
    # The first answer is lost after the effect; then the desk refuses before it
    # even looks at the key. That refusal says nothing about the first call.
    script = lost(1) + [
        AdapterError("503", transient=True, outcome_unknown=False) for _ in range(5)
    ]
    desk = Desk({"desk.ping": script}, retry_policy=POLICY)
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        dfid = await escalate_unknown(kernel, desk)
        flow = await kernel.wait_flow(dfid)
        assert flow.reason_code is ReasonCode.OUTCOME_UNKNOWN and len(desk.effects) == 1


async def test_an_unknown_compensation_waits_with_the_partial_state(tmp_path: Path) -> None:
    undo = lost(2)
    policy = RetryPolicy(max_attempts=2, base_s=1.0, jitter=0.0)
    desk = Desk(
        {"book_hotel": [AdapterError("full")], "undo:book_flight": undo}, retry_policy=policy
    )
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        watch = Watch(kernel)
        await kernel.register(agent(Trip(legs=["flight", "hotel"])))
        [dfid] = await kernel.trigger("desk.go")
        await watch.events(dfid, "ExecutionRetried")
        manual_clock(kernel).advance(1)
        flow = await kernel.wait_flow(dfid)

        # A compensation has no validity to retry within: a human is asked at once.
        assert (flow.status, flow.reason_code) == (FlowStatus.ESCALATED, ReasonCode.OUTCOME_UNKNOWN)
        [escalated] = await kernel.journal.read(dfid=dfid, types=["FlowEscalated"])
        assert payload_of(escalated, FlowEscalated).partial == {
            "in_effect": [1],
            "undone": [],
            "unknown_compensation": 1,
        }
        assert flow.pending is not None
        shown = desk.effects[flow.pending.key].external_id
        await kernel.decide(
            dfid,
            "reconcile",
            operator="ana",
            reason="cancelled at the desk",
            params={"outcome": "done", "external_id": shown},
        )
        flow = await kernel.wait_flow(dfid)
        assert (flow.status, flow.undone) == (FlowStatus.COMPENSATED, 1)


async def test_the_fold_allows_only_reconcile_or_retry_on_a_pending_intent(tmp_path: Path) -> None:
    desk = Desk({"desk.ping": lost(6)}, retry_policy=POLICY)
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        dfid = await escalate_unknown(kernel, desk)
        flow = await kernel.wait_flow(dfid)
        events = await kernel.journal.read()
    state = fold(events).flows[dfid]
    assert state == flow
    last = events[-1]

    def event(payload: AnyPayload) -> Event:
        return Event(seq=last.seq + 1, ts=last.ts, dfid=dfid, payload=payload)

    for payload in (
        ProposalAccepted(attempt=1, by_human=True),
        HumanDecided(decision="approve", operator="ana"),
        HumanDecided(decision="reject", operator="ana"),
    ):
        with pytest.raises(IllegalTransition):
            apply(state, event(payload))
    retried = apply(state, event(HumanDecided(decision="retry", operator="ana")))
    assert (retried.status, retried.retries, retried.pending) == (
        FlowStatus.EXECUTING,
        0,
        state.pending,
    )


def test_dirk_decide_offers_reconcile_and_retry_on_an_unknown_outcome(
    tmp_path: Path, operator_keys: Keys
) -> None:
    db = tmp_path / "j.db"

    async def setup() -> str:
        desk = Desk({"desk.ping": lost(6)}, retry_policy=POLICY)
        async with desk_kernel(db, desk, inbox_poll_s=None) as kernel:
            dfid = await escalate_unknown(kernel, desk)
            await kernel.wait_flow(dfid)
            return dfid

    dfid = anyio.run(setup)

    def dirk(*args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        return subprocess.run(
            [sys.executable, "-m", "kernel", *args, "--db", str(db)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )

    review = dirk("review", dfid)
    assert "--reconcile done:EXTERNAL_ID | --reconcile not-done | --retry" in review.stdout
    who = ["--operator", "ana", "--reason", "checked"]
    rejected = dirk("decide", dfid, "--reject", *who)
    assert rejected.returncode == 1 and "OUTCOME_UNKNOWN" in rejected.stderr
    bad = dirk("decide", dfid, "--reconcile", "done:", *who)
    assert bad.returncode == 2 and "SCHEMA_INVALID" in bad.stderr
    queued = dirk("decide", dfid, "--reconcile", "done:desk.ping-1", *who)
    assert queued.returncode == 0, queued.stderr

    with open_inbox(str(db), readonly=True) as store:
        [stored] = store.rows(pending=False)
    row = decode_row(stored.body).request
    assert isinstance(row, DecideRequest) and row.decision == "reconcile"
    assert row.params == {"outcome": "done", "external_id": "desk.ping-1"}
    assert row.action_hash


@pytest.mark.parametrize("desk_type", [Desk, LookupDesk])
async def test_an_unclassified_exception_is_an_unknown_outcome(
    tmp_path: Path, desk_type: type[Desk]
) -> None:
    desk = desk_type({"desk.ping": [ConnectionResetError("peer reset")]}, retry_policy=POLICY)
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        await kernel.register(agent(Ping(text="hi")))
        [dfid] = await kernel.trigger("desk.go")
        flow = await kernel.wait_flow(dfid)

        assert len(desk.calls) == 1  # terminal: never called again by itself
        if desk_type is LookupDesk:
            # The lookup found nothing: a known terminal failure.
            assert (flow.status, flow.reason_code) == (
                FlowStatus.ABORTED,
                ReasonCode.EXECUTION_FAILED,
            )
        else:
            assert (flow.status, flow.reason_code) == (
                FlowStatus.ESCALATED,
                ReasonCode.OUTCOME_UNKNOWN,
            )
            assert "ConnectionResetError: peer reset" in flow.detail


async def test_a_terminal_refusal_after_a_lost_answer_settles_the_doubt(tmp_path: Path) -> None:
    # A key-honouring desk answers a key that took effect with its receipt; a
    # refusal of the key therefore says no effect exists for it (here: the
    # timeout came before anything happened).
    script: list[Exception] = [
        AdapterError("read timeout", transient=True),
        AdapterError("account closed"),
    ]
    desk = Desk({"desk.ping": script}, retry_policy=POLICY)
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        watch = Watch(kernel)
        await kernel.register(agent(Ping(text="hi")))
        [dfid] = await kernel.trigger("desk.go")
        await watch.events(dfid, "ExecutionRetried")
        manual_clock(kernel).advance(1)
        flow = await kernel.wait_flow(dfid)
        assert (flow.status, flow.reason_code) == (FlowStatus.ABORTED, ReasonCode.EXECUTION_FAILED)
        assert desk.effects == {} and len(desk.calls) == 2


async def test_an_unknown_outcome_never_expires(tmp_path: Path) -> None:
    desk = Desk({"desk.ping": lost(6)}, retry_policy=POLICY)
    async with desk_kernel(tmp_path / "j.db", desk, inbox_poll_s=None) as kernel:
        dfid = await escalate_unknown(kernel, desk)
        await kernel.wait_flow(dfid)
        manual_clock(kernel).advance(10 * 3600)  # far past the approval's time to live
        await kernel.actors.escalation.send(Tick())
        verdict = await kernel.decide(dfid, "retry", operator="ana", reason="a day later")
        assert verdict.outcome is Outcome.ACCEPTED
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        assert "ApprovalExpired" not in await flow_types(kernel, dfid)


class GarbageDesk(Desk):
    """A system whose receipts carry what the journal cannot hold, or are not receipts."""

    def __init__(self, answer: object) -> None:
        super().__init__()
        self.answer = answer

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        await super().execute(intent)
        return self.answer  # type: ignore[return-value]


@pytest.mark.parametrize(
    "detail",
    [{"fill": float("nan")}, {"qty": 2**70}, {"when": object()}],
    ids=["nan", "huge-int", "object"],
)
async def test_a_receipt_the_journal_cannot_hold_is_recorded_as_done_with_a_note(
    tmp_path: Path, detail: dict[str, object]
) -> None:
    desk = GarbageDesk(Receipt(external_id="x" * 300, detail=detail))
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        await kernel.register(agent(Ping(text="hi")))
        [dfid] = await kernel.trigger("desk.go")
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.CLOSED and len(desk.effects) == 1
        [event] = await kernel.journal.read(dfid=dfid, types=["ExecutionSucceeded"])
        done = payload_of(event, ExecutionSucceeded)
        assert "could not be recorded" in done.detail["unrecorded"]
        assert len(done.external_id) <= 256 and "cut" in done.external_id
    assert (await verify_journal(tmp_path / "j.db")).ok


async def test_an_answer_that_is_not_a_receipt_leaves_the_outcome_unknown(tmp_path: Path) -> None:
    desk = GarbageDesk({"external_id": "x"})
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        await kernel.register(agent(Ping(text="hi")))
        [dfid] = await kernel.trigger("desk.go")
        flow = await kernel.wait_flow(dfid)
        assert (flow.status, flow.reason_code) == (FlowStatus.ESCALATED, ReasonCode.OUTCOME_UNKNOWN)
        assert "not a Receipt" in flow.detail
    assert (await verify_journal(tmp_path / "j.db")).ok
