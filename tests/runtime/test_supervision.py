"""Supervision: crashes restart, poison is dead-lettered, runaway crashing stops the kernel."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import anyio
import msgspec
import pytest

from kernel import FlowStatus, KernelShutdown, ReasonCode, StopReason, open_kernel
from kernel.audit import open_journal, payload_of, payloads, verify_journal
from kernel.config import KernelConfig, Ports
from kernel.core.events import (
    ActorRestarted,
    Event,
    KernelStopped,
    MessageDeadLettered,
    TriggerFired,
)
from kernel.core.ports import ManualClock
from kernel.policy import PolicyKind, PolicyPack, RuleVerdict, View, deny, rule
from kernel.runtime.actors import Mailbox, Outbox, RestartIntensityExceeded
from kernel.runtime.supervision import ChildSpec, Supervisor
from kernel.state.projections import Projections
from kernel.state.snapshots import Checkpointer
from kernel.testing import JournalFaults, SeededIds
from tests.support.helpers import PACK, POISON_CRASHES, Bank, ScriptedAgent, kernel_for
from tests.support.principals import LOCAL

POISON = lambda ctx: ctx.propose({"kind": "test.poison", "text": "poison"})  # noqa: E731


class DoneList(list[Any]):
    """A list that also reports each item to a shared tally."""

    def __init__(self, tally: list[Any]) -> None:
        super().__init__()
        self.tally = tally

    def append(self, item: Any) -> None:
        super().append(item)
        self.tally.append(item)


class Job(msgspec.Struct, frozen=True):
    n: int


class Flaky:
    """Records each job; crashes on the jobs listed in ``crash_on`` (shared across restarts)."""

    instances = 0

    def __init__(self, crash_on: dict[int, int], done: list[int]) -> None:
        Flaky.instances += 1
        self.crash_on = crash_on
        self.done = done

    async def handle(self, msg: Job, out: Outbox) -> None:
        if self.crash_on.get(msg.n, 0) > 0:
            self.crash_on[msg.n] -= 1
            raise RuntimeError(f"crash on {msg.n}")
        out.emit(TriggerFired(topic="job", facts={"n": msg.n}))
        out.after_commit(lambda: self.done.append(msg.n))


class Tally(list[Any]):
    """A list that says when it holds ``expected`` items."""

    def __init__(self, expected: int, finished: anyio.Event) -> None:
        super().__init__()
        self.expected, self.finished = expected, finished

    def append(self, item: Any) -> None:
        super().append(item)
        if len(self) >= self.expected:
            self.finished.set()


async def run_supervisor(
    tmp_path: Path, crash_on: dict[int, int], jobs: Iterable[int], **kw: Any
) -> tuple[DoneList, DoneList, list[Event], RestartIntensityExceeded | None, Supervisor]:
    jobs = list(jobs)
    finished = anyio.Event()
    # Every job ends up either done or dead-lettered; both tally into `settled`.
    settled = Tally(len(jobs), finished)
    done = DoneList(settled)
    dead = DoneList(settled)
    mailbox: Mailbox[Job] = Mailbox("flaky", capacity=16)
    async with open_journal(tmp_path / "j.db") as journal:
        projections = Projections()
        journal.add_listener(projections.apply)
        supervisor = Supervisor(
            [ChildSpec("flaky", lambda: Flaky(crash_on, done), mailbox)],
            append=journal.append,
            projections=projections,
            clock=ManualClock(),
            on_dead_letter=lambda actor, msg, exc, out: dead.append(msg),
            backoff_s=0.001,
            **kw,
        )
        error: RestartIntensityExceeded | None = None
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                nonlocal error
                try:
                    await supervisor.run()
                except RestartIntensityExceeded as exc:
                    error = exc
                    finished.set()

            tg.start_soon(run)
            for n in jobs:
                await mailbox.send(Job(n))
            with anyio.fail_after(10):
                await finished.wait()
            tg.cancel_scope.cancel()
        mailbox.close()
        events = await journal.read()
    return done, dead, events, error, supervisor


async def test_a_crashed_actor_is_restarted_and_the_message_retried(tmp_path: Path) -> None:
    done, dead, events, error, _ = await run_supervisor(tmp_path, {2: 1}, range(5))
    assert error is None
    assert sorted(done) == [0, 1, 2, 3, 4]
    assert dead == []
    restarts = payloads(events, ActorRestarted)
    assert len(restarts) == 1 and "crash on 2" in restarts[0].error


async def test_a_message_that_crashes_twice_is_dead_lettered(tmp_path: Path) -> None:
    done, dead, events, error, _ = await run_supervisor(tmp_path, {3: 99}, range(6))
    assert error is None
    assert sorted(done) == [0, 1, 2, 4, 5]
    assert dead == [Job(3)]
    [letter] = payloads(events, MessageDeadLettered)
    assert letter.actor == "flaky" and "Job(n=3)" in letter.message


async def test_exceeding_the_restart_intensity_stops_the_supervisor(tmp_path: Path) -> None:
    crash_on = {n: 99 for n in range(10)}
    _, _, _, error, supervisor = await run_supervisor(tmp_path, crash_on, range(10), max_restarts=3)
    assert isinstance(error, RestartIntensityExceeded)
    assert supervisor.stats.restarts == 4
    assert await verify_journal(tmp_path / "j.db")


async def test_a_crash_in_the_pipeline_is_restarted_and_the_flow_goes_on(tmp_path: Path) -> None:
    POISON_CRASHES["remaining"] = 1
    bank = Bank()
    async with kernel_for(tmp_path / "j.db", bank=bank) as kernel:
        await kernel.register(ScriptedAgent(capabilities=["test.poison"], steps=[POISON]))
        [dfid] = await kernel.trigger("bank.invoice")
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.CLOSED
        assert len(bank.calls) == 1
        [restart] = await kernel.journal.read(types=["ActorRestarted"])
        assert payload_of(restart, ActorRestarted).actor == "dim"


async def test_a_poison_proposal_is_dead_lettered_and_its_flow_aborted_with_kernel_fault(
    tmp_path: Path,
) -> None:
    POISON_CRASHES["remaining"] = 2
    bank = Bank()
    async with kernel_for(tmp_path / "j.db", bank=bank) as kernel:
        agent = ScriptedAgent(capabilities=["test.poison"], steps=[POISON])
        await kernel.register(agent)
        [dfid] = await kernel.trigger("bank.invoice")
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.ABORTED
        assert flow.reason_code is ReasonCode.KERNEL_FAULT
        assert bank.calls == []
        assert len(await kernel.journal.read(types=["MessageDeadLettered"])) == 1
        # The pipeline still works for everyone else.
        [next_flow] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(next_flow)).status is FlowStatus.CLOSED


async def test_exceeding_the_intensity_shuts_the_kernel_down_cleanly(tmp_path: Path) -> None:
    POISON_CRASHES["remaining"] = 1000
    with pytest.raises(KernelShutdown) as stopped:
        async with kernel_for(tmp_path / "j.db", max_restarts=3) as kernel:
            await kernel.register(
                ScriptedAgent(capabilities=["test.poison"], steps=[POISON], max_attempts=1)
            )
            for _ in range(4):
                await kernel.trigger("bank.invoice")
            with anyio.fail_after(10):
                await anyio.sleep_forever()
    POISON_CRASHES["remaining"] = 0
    assert stopped.value.reason == "RESTART_INTENSITY_EXCEEDED"
    assert (await verify_journal(tmp_path / "j.db")).ok
    async with open_journal(tmp_path / "j.db") as journal:
        [last] = await journal.read(start=journal.head_seq)
        assert payload_of(last, KernelStopped).reason == "RESTART_INTENSITY_EXCEEDED"


async def test_a_journal_write_failure_stops_the_kernel_without_acting_unrecorded(
    tmp_path: Path,
) -> None:
    bank = Bank()
    async with kernel_for(tmp_path / "j.db") as kernel:
        await kernel.register(ScriptedAgent())
    with pytest.raises(KernelShutdown) as stopped:
        # Transactions: 1 KernelStarted, 2 the handshake, 3 the trigger and its context,
        # 4 the verdict on the agent's proposal: that write fails.
        async with kernel_for(
            tmp_path / "j.db", bank=bank, faults=JournalFaults(fail_transaction=4)
        ) as kernel:
            await kernel.register(ScriptedAgent())
            with anyio.fail_after(10):
                await kernel.trigger("bank.invoice")
                await anyio.sleep_forever()
    assert stopped.value.reason == "JOURNAL_FAILED"
    assert bank.calls == []
    report = await verify_journal(tmp_path / "j.db")
    assert report.ok
    async with kernel_for(tmp_path / "j.db", bank=bank) as kernel:
        # Nothing after the failure was recorded, and the kernel opens again.
        [flow] = kernel.flows()
        assert (flow.status, flow.reason_code) == (FlowStatus.ABORTED, ReasonCode.INTERRUPTED)
        verdict_types = [
            e.type
            for e in await kernel.journal.read(types=["ProposalAccepted", "ExecutionStarted"])
        ]
        assert verdict_types == []


async def test_submissions_after_shutdown_are_refused(tmp_path: Path) -> None:
    async with kernel_for(tmp_path / "j.db") as kernel:
        session = await kernel.register(ScriptedAgent())
    with pytest.raises(KernelShutdown):
        await kernel.submit(session.token, "nope", {"kind": "test.transfer"})


# --- events the journal cannot seal: dead-lettered, never a stopped kernel -------------


class Sealing:
    """Records each job; for the jobs in ``bad`` it stages text no event can hold."""

    def __init__(self, bad: set[int], done: list[int]) -> None:
        self.bad = bad
        self.done = done

    async def handle(self, msg: Job, out: Outbox) -> None:
        text = "lone \ud800" if msg.n in self.bad else "fine"
        out.emit(TriggerFired(topic="job", facts={"n": msg.n, "text": text}))
        out.after_commit(lambda: self.done.append(msg.n))


async def test_a_message_whose_event_cannot_be_sealed_is_dead_lettered_alone(
    tmp_path: Path,
) -> None:
    finished = anyio.Event()
    settled = Tally(6, finished)
    done, dead = DoneList(settled), DoneList(settled)
    mailbox: Mailbox[Job] = Mailbox("sealing", capacity=16)
    async with open_journal(tmp_path / "j.db") as journal:
        projections = Projections()
        journal.add_listener(projections.apply)
        supervisor = Supervisor(
            [ChildSpec("sealing", lambda: Sealing({2, 4}, done), mailbox)],
            append=journal.append,
            projections=projections,
            clock=ManualClock(),
            on_dead_letter=lambda actor, msg, exc, out: dead.append(msg),
            max_restarts=0,  # a restart would stop it: none may be counted
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(supervisor.run)
            for n in range(6):  # one batch: the mailbox holds them all before the actor runs
                mailbox.send_nowait(Job(n))
            with anyio.fail_after(10):
                await finished.wait()
            tg.cancel_scope.cancel()
        events = await journal.read()
    assert sorted(done) == [0, 1, 3, 5]
    assert dead == [Job(2), Job(4)]
    assert supervisor.stats.restarts == 0
    letters = [e.payload for e in events if isinstance(e.payload, MessageDeadLettered)]
    assert [letter.message for letter in letters] == ["Job(n=2)", "Job(n=4)"]
    assert all("EventUnreadable" in letter.error for letter in letters)
    assert [e.payload.facts["n"] for e in events if isinstance(e.payload, TriggerFired)] == [
        0,
        1,
        3,
        5,
    ]
    assert (await verify_journal(tmp_path / "j.db")).ok


class Garbled(PolicyKind, tag="test.garbled"):
    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "bank"

    text: str


@rule(Garbled, fields=("text",))
def garbled_feedback(view: View) -> RuleVerdict:
    """A buggy rule of a pack: its refusal quotes text no event can hold."""
    return deny(f"no \ud800 {view.params.text}", field="text")


async def test_a_verdict_that_cannot_be_recorded_aborts_its_flow_and_the_kernel_goes_on(
    tmp_path: Path,
) -> None:
    pack = PolicyPack(name="garbled", version="1.0.0", kinds=(Garbled,), rules=(garbled_feedback,))
    path = tmp_path / "j.db"
    config = KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(), ids=SeededIds(1)))
    async with open_kernel(
        path, packs=[PACK, pack], adapters={"bank": Bank()}, allow=["clerk", "g"], config=config
    ) as kernel:
        garbled = lambda ctx: ctx.propose({"kind": "test.garbled", "text": "x"})  # noqa: E731
        await kernel.register(
            ScriptedAgent("g", [garbled], capabilities=["test.garbled"], subscriptions=["g"])
        )
        await kernel.register(ScriptedAgent())
        [dfid] = await kernel.trigger("g")
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.ABORTED
        assert flow.reason_code is ReasonCode.KERNEL_FAULT
        [letter] = await kernel.journal.read(types=["MessageDeadLettered"])
        assert (
            payload_of(letter, MessageDeadLettered).actor == "dim"
            and "\\ud800" in payload_of(letter, MessageDeadLettered).error
        )
        assert kernel.stopped is None
        [other] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(other)).status is FlowStatus.CLOSED
    assert (await verify_journal(path)).ok


async def test_a_kernel_that_stops_on_a_fault_records_the_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: Checkpointer, journal: object) -> None:
        raise RuntimeError("a bug in a kernel task \ud800")

    monkeypatch.setattr(Checkpointer, "run", broken)
    path = tmp_path / "j.db"
    with pytest.raises(KernelShutdown) as stopped:
        async with kernel_for(path, checkpoint_every=10) as kernel:
            await kernel.register(ScriptedAgent())
            with anyio.fail_after(10):
                await anyio.sleep_forever()
    assert stopped.value.reason is StopReason.KERNEL_FAILED
    assert isinstance(stopped.value.__cause__, RuntimeError)
    async with open_journal(path) as journal:
        [last] = await journal.read(start=journal.head_seq)
    assert payload_of(last, KernelStopped).reason == "KERNEL_FAILED"
    assert payload_of(last, KernelStopped).detail == "RuntimeError: a bug in a kernel task \\ud800"
    assert (await verify_journal(path)).ok


# --- a posted message never makes its sender wait for room ------------------------------


class Poster:
    """Records each job, then posts it to ``target`` (which the test keeps full)."""

    def __init__(self, target: Mailbox[Job], done: list[int]) -> None:
        self.target = target
        self.done = done

    async def handle(self, msg: Job, out: Outbox) -> None:
        out.emit(TriggerFired(topic="job", facts={"n": msg.n}))
        out.post(self.target, msg)
        out.after_commit(lambda: self.done.append(msg.n))


async def test_a_message_posted_to_a_full_mailbox_waits_beside_its_sender(
    tmp_path: Path,
) -> None:
    # The DIM posts recompile requests to the compiler, which may be waiting for the
    # DIM's own append (two commits per flow): neither may wait on the other.
    finished = anyio.Event()
    done = Tally(3, finished)
    mailbox: Mailbox[Job] = Mailbox("poster", capacity=16)
    target: Mailbox[Job] = Mailbox("target", capacity=1)
    target.send_nowait(Job(-1))  # full, and nobody reads it yet
    async with open_journal(tmp_path / "j.db") as journal:
        projections = Projections()
        journal.add_listener(projections.apply)
        supervisor = Supervisor(
            [ChildSpec("poster", lambda: Poster(target, done), mailbox, batch=1)],
            append=journal.append,
            projections=projections,
            clock=ManualClock(),
            on_dead_letter=lambda actor, msg, exc, out: None,
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(supervisor.run)
            for n in range(3):  # three batches, each posting to the full mailbox
                mailbox.send_nowait(Job(n))
            with anyio.fail_after(10):  # a guard against a hang, not a timing assertion
                await finished.wait()
                received = [await target.receive() for _ in range(4)]
            tg.cancel_scope.cancel()
    mailbox.close()
    target.close()
    assert done == [0, 1, 2]
    assert received[0] == Job(-1)
    assert sorted(job.n for job in received[1:]) == [0, 1, 2]
