"""Fail modes per tenant, against a real PostgreSQL server stopped (``-m immediate``).

While the journal's store is away past the grace, a fail-closed tenant's calls are
refused GOVERNANCE_UNAVAILABLE and a fail-open tenant's read-only calls proceed; both
are spooled and on record, once, as DecidedWithoutJournal when the store is back,
before normal judgement resumes.
"""

from __future__ import annotations

from pathlib import Path

import anyio

from kernel import DecisionVerdict, FlowStatus, Kernel, ReasonCode
from kernel.core.events import DecidedWithoutJournal
from kernel.journal.outage import StoreState
from kernel.journal.verify import verify_journal
from tests.failmode.kernels import AGENT, TENANT, USER, Desk, declare, fail_mode_kernel, lookup, pay
from tests.support.postgres import PostgresServer


async def without_journal(kernel: Kernel) -> list[DecidedWithoutJournal]:
    events = await kernel.journal.read(types=["DecidedWithoutJournal"])
    return [e.payload for e in events if isinstance(e.payload, DecidedWithoutJournal)]


async def outage(pg: PostgresServer, kernel: Kernel) -> None:
    await anyio.to_thread.run_sync(pg.stop, "immediate")
    await kernel.journal.store.until(StoreState.UNREACHABLE)


async def recovery(pg: PostgresServer, kernel: Kernel) -> None:
    await anyio.to_thread.run_sync(pg.start)
    await kernel.journal.store.until(StoreState.REACHABLE)


async def test_fail_closed_refuses_and_the_refusal_is_on_record_after_recovery(
    pg: PostgresServer, tmp_path: Path
) -> None:
    url, desk = pg.new_url(), Desk()
    with anyio.fail_after(120):
        async with fail_mode_kernel(url, str(tmp_path / "spool.db"), desk) as kernel:
            await declare(kernel, "closed")
            await outage(pg, kernel)
            refused = await lookup(kernel)
            assert refused.verdict is DecisionVerdict.REFUSED
            assert refused.reason_code is ReasonCode.GOVERNANCE_UNAVAILABLE
            assert desk.calls == []
            await recovery(pg, kernel)
            again = await lookup(kernel)
            assert again.verdict is DecisionVerdict.EXECUTED
            [record] = await without_journal(kernel)
            assert record.dfid == refused.dfid
            assert not record.allowed
            assert record.reason_code == ReasonCode.GOVERNANCE_UNAVAILABLE
            assert record.kind == "fm.lookup" and record.agent_id == AGENT
            assert record.on_behalf is not None
            assert (record.on_behalf.principal.tenant, record.on_behalf.principal.user) == (
                TENANT,
                USER,
            )
            assert len(desk.calls) == 1
    report = await verify_journal(url)
    assert report.ok, report.problem


async def test_fail_open_allows_a_read_only_kind_marked_without_journal_and_refuses_a_write(
    pg: PostgresServer, tmp_path: Path
) -> None:
    url, desk = pg.new_url(), Desk()
    with anyio.fail_after(120):
        async with fail_mode_kernel(url, str(tmp_path / "spool.db"), desk) as kernel:
            await declare(kernel, "open")
            before = await lookup(kernel)
            assert before.verdict is DecisionVerdict.EXECUTED
            await outage(pg, kernel)
            read = await lookup(kernel, "acc-2")
            write = await pay(kernel)
            assert read.verdict is DecisionVerdict.ALLOWED_WITHOUT_JOURNAL
            assert read.result["decided_without_journal"] is True
            assert write.verdict is DecisionVerdict.REFUSED
            assert write.reason_code is ReasonCode.GOVERNANCE_UNAVAILABLE
            assert len(desk.calls) == 1  # the kernel ran nothing without the journal
            await recovery(pg, kernel)
            after = await pay(kernel)
            # Normal judgement resumes: the write kind is judged and executed again.
            assert after.verdict is DecisionVerdict.EXECUTED
            flow = kernel.flow(after.dfid)
            assert flow is not None and flow.status is FlowStatus.CLOSED
            records = await without_journal(kernel)
            assert [(r.kind, r.allowed) for r in records] == [
                ("fm.lookup", True),
                ("fm.pay", False),
            ]
            assert [r.dfid for r in records] == [read.dfid, write.dfid]
            assert records[0].spool_id < records[1].spool_id
            assert records[0].reason_code is None
            # In order: both are in the journal before the call that came after recovery.
            seqs = {
                e.payload.dfid: e.seq
                for e in await kernel.journal.read(types=["DecidedWithoutJournal"])
                if isinstance(e.payload, DecidedWithoutJournal)
            }
            [created] = await kernel.journal.read(dfid=after.dfid, types=["FlowCreated"])
            assert max(seqs.values()) < created.seq
    report = await verify_journal(url)
    assert report.ok, report.problem


async def test_a_short_outage_within_the_grace_is_ridden_out_and_judged_normally(
    pg: PostgresServer, tmp_path: Path
) -> None:
    url, desk = pg.new_url(), Desk()
    with anyio.fail_after(120):
        async with fail_mode_kernel(url, str(tmp_path / "spool.db"), desk, grace_s=60.0) as kernel:
            await declare(kernel, "closed")
            await anyio.to_thread.run_sync(pg.stop, "immediate")
            await kernel.journal.store.until(StoreState.RETRYING)
            decided: list[DecisionVerdict] = []

            async def call() -> None:
                decided.append((await pay(kernel)).verdict)

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await anyio.to_thread.run_sync(pg.start)
            assert decided == [DecisionVerdict.EXECUTED]
            assert kernel.journal.store.state is StoreState.REACHABLE
            assert await without_journal(kernel) == []
            assert len(desk.calls) == 1


async def test_a_call_caught_in_an_outage_not_yet_noticed_is_answered_after_the_grace(
    pg: PostgresServer, tmp_path: Path
) -> None:
    # The idle writer does not probe in this test: the call's own opening meets the lost
    # store, and the fail mode answers it once the grace is over, not when the store returns.
    url, desk = pg.new_url(), Desk()
    with anyio.fail_after(120):
        async with fail_mode_kernel(
            url, str(tmp_path / "spool.db"), desk, grace_s=1.0, probe_s=3600.0
        ) as kernel:
            await declare(kernel, "closed")
            await anyio.to_thread.run_sync(pg.stop, "immediate")
            assert kernel.journal.store.state is StoreState.REACHABLE  # not noticed yet
            refused = await pay(kernel)
            assert refused.verdict is DecisionVerdict.REFUSED
            assert refused.reason_code is ReasonCode.GOVERNANCE_UNAVAILABLE
            assert kernel.journal.store.state is StoreState.UNREACHABLE  # type: ignore[comparison-overlap]
            await anyio.to_thread.run_sync(pg.start)
            # Quiet once the store is back, the spool drained and the flow ended: its
            # opening committed on the store's return, and the flow ended there unjudged.
            await kernel.wait_quiet()
            events = await kernel.journal.read(dfid=refused.dfid)
            assert [type(e.payload).__name__ for e in events] == [
                "FlowCreated",
                "ContextCompiled",
                "FlowAborted",
            ]
            assert events[-1].payload.reason_code == ReasonCode.GOVERNANCE_UNAVAILABLE
            [record] = await without_journal(kernel)
            assert record.dfid == refused.dfid and not record.allowed
            assert desk.calls == []
            after = await pay(kernel)
            assert after.verdict is DecisionVerdict.EXECUTED
            assert len(desk.calls) == 1
    report = await verify_journal(url)
    assert report.ok, report.problem
