"""The journal on a PostgreSQL server that stops (``pg_ctl stop -m immediate``) and returns.

An outage is no failure of the journal: an append made while the server is away waits,
the store reports RETRYING and then, past the grace, UNREACHABLE; once the server is
back the writer retakes its lease and the append commits, the chain unbroken.
"""

from __future__ import annotations

import anyio

from kernel.core.events import Draft, TriggerFired
from kernel.journal.opening import open_journal
from kernel.journal.outage import StoreState
from kernel.journal.verify import verify_journal
from tests.support.postgres import PostgresServer


def trigger(x: int) -> Draft:
    return Draft(payload=TriggerFired(topic="t", facts={"x": x}))


async def test_an_append_during_an_outage_waits_and_commits_once_the_store_is_back(
    pg: PostgresServer,
) -> None:
    url = pg.new_url()
    async with open_journal(url, grace_s=0.2) as journal:
        await journal.append([trigger(1)])
        await anyio.to_thread.run_sync(pg.stop, "immediate")
        committed: list[int] = []

        async def late() -> None:
            [event] = await journal.append([trigger(2)])
            committed.append(event.seq)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(late)
                assert await journal.store.until(StoreState.UNREACHABLE) is StoreState.UNREACHABLE
                assert committed == []
                await anyio.to_thread.run_sync(pg.start)
                assert await journal.store.until(StoreState.REACHABLE) is StoreState.REACHABLE
        assert committed == [2]
        assert not journal.failed
        [event] = await journal.append([trigger(3)])
        assert event.seq == 3
        assert [e.seq for e in await journal.read()] == [1, 2, 3]
    report = await verify_journal(url)
    assert report.ok, report.problem
    assert report.events == 3


async def test_an_idle_writer_notices_the_outage_by_its_probe(pg: PostgresServer) -> None:
    url = pg.new_url()
    async with open_journal(url, grace_s=0.0) as journal:
        await journal.append([trigger(1)])
        await anyio.to_thread.run_sync(pg.stop, "immediate")
        with anyio.fail_after(60):
            await journal.store.until(StoreState.UNREACHABLE)
            await anyio.to_thread.run_sync(pg.start)
            await journal.store.until(StoreState.REACHABLE)
        [event] = await journal.append([trigger(2)])
        assert event.seq == 2
        assert journal.store.outages == 1
