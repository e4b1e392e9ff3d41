"""Appends that need no sync of their own: group commit for records of what changes nothing.

``Journal.append(durable=False)`` (the kernel's read-only calls, ``Storage.group_reads``):
a transaction of only such appends commits without a sync of its own where the store can
(``StoreWriter.append_lazy``: SQLite WAL at ``synchronous = NORMAL``), made durable by
the next synced commit. One durable append in the transaction syncs it all. PostgreSQL
syncs every commit: an asynchronous one would be lost by a server restart. A killed
process loses none of them (tests/journal/test_journal.py kills a writer that appends so).
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import anyio
import pytest

from kernel.core.events import GENESIS_HASH, Draft, TriggerFired
from kernel.core.merkle import Frontier
from kernel.journal import _sqlite_writer
from kernel.journal._batch import grown
from kernel.journal._sqlite import open_store
from kernel.journal._sqlite_writer import Writer
from kernel.journal.head import head_value
from kernel.journal.opening import open_journal
from kernel.journal.sealing import seal
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


class _Lazily:
    """A journal file's writer driven directly, one unsynced append at a time."""

    def __init__(self, writer: Writer, tree: Frontier | None) -> None:
        self.writer, self.tree, self.seq, self.prev = writer, tree, 0, GENESIS_HASH

    def append(self, count: int) -> None:
        for _ in range(count):
            rows, _events = seal([trigger(self.seq)], self.seq, self.prev, 1)
            self.tree, nodes = grown(self.tree, rows)
            head = head_value(rows[-1][0], rows[-1][4])
            self.writer.append_lazy(rows, self.seq, head, False, nodes)
            self.seq, self.prev = rows[-1][0], rows[-1][4]


async def test_upkeep_checkpoints_beside_the_writer_and_its_next_commit_starts_the_wal_again(
    tmp_path: Path,
) -> None:
    # SQLite's own checkpoint is off for the writer (its cost fell on the commit that
    # reached it); upkeep, on a connection of its own, copies the WAL instead.
    path = tmp_path / "j.db"
    opened = await open_store(str(path), readonly=False, synchronous="FULL", chain_key=None)
    assert isinstance(opened.writer, Writer)
    lazily = _Lazily(opened.writer, opened.tree)
    try:
        lazily.append(100)
        wal, before = (tmp_path / "j.db-wal").stat().st_size, path.stat().st_size
        opened.writer.upkeep()
        assert path.stat().st_size > before  # the pages are in the database itself
        lazily.append(50)  # written from the WAL's start again: the file does not grow
        assert (tmp_path / "j.db-wal").stat().st_size == wal
    finally:
        opened.writer.close()
        await opened.reader.aclose()
    report = await verify_journal(path)
    assert report.ok and report.events == 150, report.problem


async def test_a_wal_upkeep_cannot_empty_is_emptied_by_the_writers_next_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sqlite_writer, "RESTART_PAGES", 16)
    path = tmp_path / "j.db"
    opened = await open_store(str(path), readonly=False, synchronous="FULL", chain_key=None)
    assert isinstance(opened.writer, Writer)
    lazily = _Lazily(opened.writer, opened.tree)
    try:
        lazily.append(50)
        # A reader in the middle: no checkpoint may copy what it must not see.
        with contextlib.closing(sqlite3.connect(path)) as reader:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM events").fetchone()
            lazily.append(50)
            opened.writer.upkeep()
        wal = (tmp_path / "j.db-wal").stat().st_size
        lazily.append(50)  # checkpoints the rest first, then writes from the WAL's start
        assert (tmp_path / "j.db-wal").stat().st_size == wal
    finally:
        opened.writer.close()
        await opened.reader.aclose()
    report = await verify_journal(path)
    assert report.ok and report.events == 150, report.problem
