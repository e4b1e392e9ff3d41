"""The DIM records the start of execution with the acceptance; the engine only calls.

One append holds ProposalSubmitted, ProposalAccepted and ExecutionStarted, so a
flow waits for one commit fewer; the adapter is still called only once that
append is durable, and a dispatch that races with recovery never calls twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio

from kernel import FlowStatus, Kernel
from kernel.adapters import ExecutionIntent, Receipt
from kernel.adapters.contract import Call, CallPool
from kernel.audit import Event, payload_of
from kernel.core.events import ExecutionStarted, ProposalAccepted, is_derived
from kernel.runtime.messages import Dispatch
from kernel.testing import flow_types
from tests.support.execution_domain import Desk, Ping, Trip, agent, desk_kernel
from tests.support.helpers import flow_of


class RecordFirstDesk(Desk):
    """A desk that notes, at each call, whether the call's start was already committed."""

    def __init__(self) -> None:
        super().__init__()
        self.kernel: Kernel | None = None
        self.recorded_before_call: list[bool] = []

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        assert self.kernel is not None
        pending = [f.pending for f in self.kernel.projections.flows.values() if f.pending]
        self.recorded_before_call.append(any(p.key == intent.key for p in pending))
        return await super().execute(intent)


async def test_acceptance_and_execution_start_are_one_append_and_the_call_follows_it(
    tmp_path: Path,
) -> None:
    desk = RecordFirstDesk()
    appends: list[list[str]] = []

    def committed(events: Sequence[Event]) -> None:
        appends.append([e.type for e in events if e.dfid is not None])

    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        desk.kernel = kernel
        kernel.journal.add_listener(committed)
        await kernel.register(agent(Ping(text="hi")))
        [dfid] = await kernel.trigger("desk.go")
        flow = await kernel.wait_flow(dfid)
        events = await kernel.journal.flow_events(dfid)

    assert flow.status is FlowStatus.CLOSED
    # The same events as ever, in the same order; only the batching changed.
    assert [e.type for e in events] == [
        "FlowCreated",
        "ContextCompiled",
        "ProposalSubmitted",
        "ProposalAccepted",
        "ExecutionStarted",
        "ExecutionSucceeded",
        "FlowClosed",
    ]
    assert ["ProposalSubmitted", "ProposalAccepted", "ExecutionStarted"] in appends
    assert ["ExecutionSucceeded", "FlowClosed"] in appends
    by_type = {e.type: e for e in events}
    assert by_type["ExecutionStarted"].caused_by == by_type["ProposalAccepted"].seq
    assert desk.recorded_before_call == [True]


async def test_a_saga_accepted_by_the_dim_starts_its_first_step_in_the_same_append(
    tmp_path: Path,
) -> None:
    desk = Desk()
    async with desk_kernel(tmp_path / "j.db", desk) as kernel:
        await kernel.register(agent(Trip(legs=["flight", "hotel"])))
        [dfid] = await kernel.trigger("desk.go")
        flow = await kernel.wait_flow(dfid)
        [accepted] = await kernel.journal.read(dfid=dfid, types=["ProposalAccepted"])
        started = await kernel.journal.read(dfid=dfid, types=["ExecutionStarted"])
    assert (flow.status, flow.done) == (FlowStatus.CLOSED, 2)
    assert [payload_of(s, ExecutionStarted).intent.step for s in started] == [1, 2]
    # One row: the acceptance carries its first step's start (ProposalAccepted.start).
    assert started[0].seq == accepted.seq and is_derived(started[0])
    assert (
        payload_of(accepted, ProposalAccepted).start
        == payload_of(started[0], ExecutionStarted).intent
    )
    assert not is_derived(started[1])
    assert desk.names() == ["book_flight", "book_hotel"]


async def test_a_dispatch_racing_with_recovery_calls_the_adapter_once(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with desk_kernel(path, Desk(gates={"desk.ping": anyio.Event()})) as kernel:
        await kernel.register(agent(Ping(text="hi")))
        [dfid] = await kernel.trigger("desk.go")
        await kernel.wait_flow(dfid, {FlowStatus.EXECUTING})
        pending = flow_of(kernel, dfid).pending
        assert pending is not None
        key = pending.key
    # Started, never answered: recovery calls it again; a dispatch queued behind
    # recovery (as the DIM's would be) must not call it a second time.
    desk = Desk()
    async with desk_kernel(path, desk) as kernel:
        await kernel.actors.execution.send(Dispatch(dfid=dfid, key=key))
        await kernel.actors.execution.send(Dispatch(dfid=dfid, key=key))
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.CLOSED
        assert [c.key for c in desk.calls] == [key]
        assert (await flow_types(kernel, dfid)).count("ExecutionSucceeded") == 1


async def test_the_call_pool_reuses_idle_workers_and_never_queues_behind_busy_ones() -> None:
    gate = anyio.Event()
    finished: list[str] = []
    wake = {"slow": anyio.Event(), "fast": anyio.Event(), "again": anyio.Event()}

    def call(name: str, wait: anyio.Event | None = None) -> Call:
        async def run() -> None:
            if wait is not None:
                await wait.wait()
            finished.append(name)
            if finished.count(name) == {"slow": 2}.get(name, 1):
                wake[name].set()

        return run

    async with anyio.create_task_group() as tg:

        def spawn(fn: Call) -> None:
            # The pool hands awaitable factories; anyio starts coroutine functions.
            async def run() -> None:
                await fn()

            tg.start_soon(run)

        pool = CallPool(spawn, size=2)
        pool(call("slow", gate))
        pool(call("slow", gate))
        # Both workers wait on a slow adapter: the next call still runs at once.
        pool(call("fast"))
        await wake["fast"].wait()
        assert finished == ["fast"] and pool.statistics() == (2, 0)
        gate.set()
        await wake["slow"].wait()
        assert pool.statistics() == (2, 2)
        # An idle worker takes the next call: no new worker, no new task.
        pool(call("again"))
        assert pool.statistics() == (2, 1)
        await wake["again"].wait()
        assert finished[-1] == "again"
        tg.cancel_scope.cancel()
    assert pool.statistics() == (0, 0)
