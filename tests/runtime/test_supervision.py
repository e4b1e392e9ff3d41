"""Supervision: crashes restart, poison is dead-lettered, runaway crashing stops the kernel."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from kernel import FlowStatus, KernelShutdown, ReasonCode
from kernel.audit import open_journal, verify_journal
from kernel.core.events import TriggerFired
from kernel.core.ports import ManualClock
from kernel.runtime.actors import ChildSpec, Mailbox, Outbox, RestartIntensityExceeded, Supervisor
from kernel.state.projections import Projections
from kernel.testing import JournalFaults
from tests.support.helpers import POISON_CRASHES, Bank, ScriptedAgent, kernel_for

POISON = lambda ctx: ctx.propose({"kind": "test.poison", "text": "poison"})  # noqa: E731


class DoneList(list):
    """A list that also reports each item to a shared tally."""

    def __init__(self, tally: list) -> None:
        super().__init__()
        self.tally = tally

    def append(self, item) -> None:
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


class Tally(list):
    """A list that says when it holds ``expected`` items."""

    def __init__(self, expected: int, finished: anyio.Event) -> None:
        super().__init__()
        self.expected, self.finished = expected, finished

    def append(self, item) -> None:
        super().append(item)
        if len(self) >= self.expected:
            self.finished.set()


async def run_supervisor(tmp_path, crash_on, jobs, **kw):
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
        error = None
        async with anyio.create_task_group() as tg:

            async def run():
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


async def test_a_crashed_actor_is_restarted_and_the_message_retried(tmp_path):
    done, dead, events, error, _ = await run_supervisor(tmp_path, {2: 1}, range(5))
    assert error is None
    assert sorted(done) == [0, 1, 2, 3, 4]
    assert dead == []
    restarts = [e.payload for e in events if e.type == "ActorRestarted"]
    assert len(restarts) == 1 and "crash on 2" in restarts[0].error


async def test_a_message_that_crashes_twice_is_dead_lettered(tmp_path):
    done, dead, events, error, _ = await run_supervisor(tmp_path, {3: 99}, range(6))
    assert error is None
    assert sorted(done) == [0, 1, 2, 4, 5]
    assert dead == [Job(3)]
    [letter] = [e.payload for e in events if e.type == "MessageDeadLettered"]
    assert letter.actor == "flaky" and "Job(n=3)" in letter.message


async def test_exceeding_the_restart_intensity_stops_the_supervisor(tmp_path):
    crash_on = {n: 99 for n in range(10)}
    _, _, _, error, supervisor = await run_supervisor(tmp_path, crash_on, range(10), max_restarts=3)
    assert isinstance(error, RestartIntensityExceeded)
    assert supervisor.stats.restarts == 4
    assert await verify_journal(tmp_path / "j.db")


async def test_a_crash_in_the_pipeline_is_restarted_and_the_flow_goes_on(tmp_path):
    POISON_CRASHES["remaining"] = 1
    bank = Bank()
    async with kernel_for(tmp_path / "j.db", bank=bank) as kernel:
        await kernel.register(ScriptedAgent(capabilities=["test.poison"], steps=[POISON]))
        [dfid] = await kernel.trigger("bank.invoice")
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.CLOSED
        assert len(bank.calls) == 1
        [restart] = await kernel.journal.read(types=["ActorRestarted"])
        assert restart.payload.actor == "dim"


async def test_a_poison_proposal_is_dead_lettered_and_its_flow_aborted_with_kernel_fault(tmp_path):
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


async def test_exceeding_the_intensity_shuts_the_kernel_down_cleanly(tmp_path):
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
        assert last.type == "KernelStopped" and last.payload.reason == "RESTART_INTENSITY_EXCEEDED"


async def test_a_journal_write_failure_stops_the_kernel_without_acting_unrecorded(tmp_path):
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


async def test_submissions_after_shutdown_are_refused(tmp_path):
    async with kernel_for(tmp_path / "j.db") as kernel:
        session = await kernel.register(ScriptedAgent())
    with pytest.raises(KernelShutdown):
        await kernel.submit(session.token, "nope", {"kind": "test.transfer"})
