"""Appends that need no sync of their own: group commit for records of what changes nothing.

``Journal.append(durable=False)`` (the kernel's read-only calls, ``Storage.group_reads``):
a transaction of only such appends commits without a sync of its own where the store can
(``StoreWriter.append_lazy``: SQLite WAL at ``synchronous = NORMAL``), made durable by
the next synced commit. One durable append in the transaction syncs it all. PostgreSQL
syncs every commit: an asynchronous one would be lost by a server restart. A killed
process loses none of them (tests/journal/test_journal.py kills a writer that appends so).
"""

from __future__ import annotations

from pathlib import Path

import anyio

from kernel.core.events import Draft, TriggerFired
from kernel.journal.opening import open_journal
from kernel.journal.verify import verify_journal
from tests.support.postgres import postgres_server, postgres_url  # noqa: F401


def trigger(x: int) -> Draft:
    return Draft(payload=TriggerFired(topic="t", facts={"x": x}))


async def test_an_append_that_needs_no_sync_commits_without_one_and_reads_back(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    async with open_journal(path) as journal:
        await journal.append([trigger(1)], durable=False)
        await journal.append([trigger(2)])
        await journal.append([trigger(3), trigger(4)], durable=False)
        stats = journal.statistics()
        assert (stats.transactions, stats.unsynced, stats.events) == (3, 2, 4)
        read = [e.payload for e in await journal.read()]
        assert [p.facts["x"] for p in read if isinstance(p, TriggerFired)] == [1, 2, 3, 4]
    report = await verify_journal(path)
    assert report.ok and report.events == 4, report.problem


async def test_one_durable_append_syncs_the_transaction_it_shares(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "j.db") as journal:
        async with anyio.create_task_group() as tg:
            # Started in the same turn of the loop: one transaction (group commit).
            tg.start_soon(lambda: journal.append([trigger(1)], durable=False))
            tg.start_soon(lambda: journal.append([trigger(2)]))
        stats = journal.statistics()
        assert (stats.transactions, stats.unsynced) == (1, 0)


async def test_postgres_syncs_every_commit_even_one_that_needs_no_sync(
    postgres_url: str,  # noqa: F811
) -> None:
    # An asynchronous commit would not survive a server restart the kernel rides out.
    async with open_journal(postgres_url) as journal:
        await journal.append([trigger(1)], durable=False)
        await journal.append([trigger(2)])
        assert journal.statistics().unsynced == 0
    async with open_journal(postgres_url) as journal:
        assert [e.seq for e in await journal.read()] == [1, 2]
