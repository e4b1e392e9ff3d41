"""Tests of kernel.journal.store on real SQLite files."""

from __future__ import annotations

import os
import random
import shutil
import signal
import sqlite3
import sys
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

import anyio
import msgspec
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from kernel.core.events import (
    GENESIS_HASH,
    Draft,
    Event,
    FlowCreated,
    TriggerFired,
    canonical,
    chain,
    payloads,
)
from kernel.core.ports import ManualClock
from kernel.journal.codec import unpack
from kernel.journal.opening import open_journal
from kernel.journal.store import (
    EventUnreadable,
    Journal,
    JournalClosed,
    JournalCorrupt,
    JournalError,
    JournalFaults,
    JournalForeign,
    JournalStatistics,
    JournalVersionError,
    JournalWriteFailed,
)
from kernel.journal.verify import verify_journal
from tests.support import ROOT, SUPPORT

WRITER = SUPPORT / "journal_writer.py"


def trigger(x: int, dfid: str | None = None) -> Draft:
    return Draft(payload=TriggerFired(topic="t", facts={"x": x}), dfid=dfid)


def seqs(events: Sequence[Event]) -> list[int]:
    return [event.seq for event in events]


async def make_journal(path: Path, count: int) -> None:
    """Write a journal whose event ``i`` has ``facts == {"x": i}``."""
    async with open_journal(path) as journal:
        await journal.append([trigger(i) for i in range(1, count + 1)])


async def append_concurrently(journal: Journal, batches: list[list[Draft]]) -> list[list[Event]]:
    """Append every batch from its own task; return what each append returned."""
    results: list[list[Event]] = [[] for _ in batches]

    async def append(index: int) -> None:
        results[index] = await journal.append(batches[index])

    async with anyio.create_task_group() as tg:
        for index in range(len(batches)):
            tg.start_soon(append, index)
    return results


# --- appending and reading ----------------------------------------------------


async def test_append_and_read_round_trip(tmp_path: Path) -> None:
    clock = ManualClock()
    path = tmp_path / "journal.db"
    async with open_journal(path, clock=clock) as journal:
        assert (journal.head_seq, journal.head_hash) == (0, GENESIS_HASH.hex())
        assert await journal.append([]) == []
        first = await journal.append(
            [trigger(0), Draft(payload=FlowCreated(root_dfid="f1"), dfid="f1")]
        )
        clock.advance(1)
        second = await journal.append([trigger(i, dfid=f"f{1 + i % 2}") for i in range(1, 6)])
        stored = await journal.read()
        assert stored == first + second
        assert seqs(stored) == list(range(1, 8))
        assert {event.ts for event in first} == {clock.now_ns() - 1_000_000_000}
        assert {event.ts for event in second} == {clock.now_ns()}
        # Each hash chains the canonical body (the event without its hashes) to the one before.
        prev = GENESIS_HASH
        for event in stored:
            assert event.prev_hash == prev.hex()
            prev = chain(prev, canonical(msgspec.structs.replace(event, prev_hash="", hash="")))
            assert event.hash == prev.hex()
        assert journal.head_seq == 7
        assert journal.head_hash == stored[-1].hash

        assert await journal.read(3, 5) == stored[2:4]
        assert await journal.read(6) == stored[5:]
        assert await journal.read(limit=2) == stored[:2]
        f1 = [event for event in stored if event.dfid == "f1"]
        assert seqs(f1) == [2, 4, 6]
        assert await journal.read(dfid="f1") == f1 == await journal.flow_events("f1")
        assert await journal.read(types={"FlowCreated"}) == [stored[1]]
        assert await journal.read(types=["FlowCreated", "TriggerFired"]) == stored
        assert await journal.read(types=[]) == []
        assert [batch async for batch in journal.scan(batch_size=3)] == [
            stored[:3],
            stored[3:6],
            stored[6:],
        ]
        assert journal.statistics() == JournalStatistics(appends=2, transactions=2, events=7)
        journal_id, head = journal.journal_id, journal.head_hash

    async with open_journal(path) as journal:
        assert (journal.journal_id, journal.head_seq, journal.head_hash) == (journal_id, 7, head)
        assert journal.statistics() == JournalStatistics(appends=0, transactions=0, events=0)
        (more,) = await journal.append([trigger(8)])
        assert (more.seq, more.prev_hash) == (8, head)
    assert await verify_journal(path) == msgspec.structs.replace(
        await verify_journal(path), ok=True, events=8, head=more.hash, first_bad_seq=None
    )


async def test_concurrent_appends_share_transactions(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "journal.db") as journal:
        batches = [
            [trigger(caller * 10 + k) for k in range(1 + caller % 3)] for caller in range(200)
        ]
        results = await append_concurrently(journal, batches)
        stats = journal.statistics()
        stored = await journal.read()
    total = sum(len(batch) for batch in batches)
    assert (stats.appends, stats.events) == (200, total)
    assert stats.transactions < 200 / 4
    assert seqs(stored) == list(range(1, total + 1))
    for batch, events in zip(batches, results, strict=True):
        # Each caller gets its own events back, contiguous and in its order.
        assert [event.payload for event in events] == [draft.payload for draft in batch]
        assert seqs(events) == list(range(events[0].seq, events[0].seq + len(batch)))
        assert events == stored[events[0].seq - 1 : events[-1].seq]


async def test_a_draft_that_cannot_be_encoded_fails_only_its_caller(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    bad = [trigger(1), Draft(payload=TriggerFired(topic="t", facts={"x": object()}))]
    outcomes: dict[str, object] = {}

    async def append(name: str, drafts: list[Draft]) -> None:
        try:
            outcomes[name] = await journal.append(drafts)
        except EventUnreadable as exc:
            outcomes[name] = exc

    async with open_journal(path) as journal:
        async with anyio.create_task_group() as tg:
            tg.start_soon(append, "before", [trigger(1), trigger(2)])
            tg.start_soon(append, "bad", bad)
            tg.start_soon(append, "after", [trigger(3)])
        assert not journal.failed
        # Refused as the event's own fault (the supervisor dead-letters on exactly this).
        assert isinstance(outcomes["bad"], EventUnreadable)
        assert seqs(await journal.read()) == [1, 2, 3]
        assert seqs(outcomes["after"]) == [3]  # type: ignore[arg-type]
    assert (await verify_journal(path)).ok


async def test_a_negative_caused_by_names_an_event_of_the_same_append(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "journal.db") as journal:
        await journal.append([trigger(0)])
        (absolute,) = await journal.append([Draft(payload=FlowCreated(root_dfid="f"), caused_by=1)])
        relative = [
            trigger(3),
            Draft(payload=FlowCreated(root_dfid="g"), dfid="g", caused_by=-1),
            Draft(payload=FlowCreated(root_dfid="h"), dfid="h", caused_by=-2),
        ]
        first, second, third = await journal.append(relative)
        assert (second.caused_by, third.caused_by) == (first.seq, first.seq)
        assert absolute.caused_by == 1  # absolute references are kept as they are
        with pytest.raises(ValueError, match="outside its append"):
            await journal.append([Draft(payload=FlowCreated(root_dfid="i"), caused_by=-1)])
        assert await journal.read(second.seq) == [second, third]
        assert not journal.failed
    assert (await verify_journal(tmp_path / "journal.db")).ok


async def test_a_closed_or_readonly_journal_takes_no_appends(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    async with open_journal(path) as journal:
        await journal.append([trigger(1)])
        async with open_journal(path, readonly=True) as reader:
            await journal.append([trigger(2)])
            assert seqs(await reader.read()) == [1, 2]  # sees the writer's commits
            with pytest.raises(JournalClosed, match="read-only"):
                await reader.append([trigger(3)])
    with pytest.raises(JournalClosed) as info:
        await journal.append([trigger(3)])
    assert info.value.code == "JOURNAL_CLOSED"
    assert str(path) in str(info.value)
    with pytest.raises(JournalClosed):
        await journal.read()
    async with open_journal(path, readonly=True) as reader:
        assert (reader.head_seq, seqs(await reader.read())) == (2, [1, 2])


async def test_closing_commits_pending_appends(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    results: list[list[Event]] = []

    async def append(x: int) -> None:
        results.append(await journal.append([trigger(x)]))

    async with anyio.create_task_group() as tg:
        async with open_journal(path) as journal:
            for x in range(10):
                tg.start_soon(append, x)
            await anyio.lowlevel.checkpoint()  # let them queue, then close at once
    assert sorted(seqs([event for events in results for event in events])) == list(range(1, 11))
    async with open_journal(path) as journal:
        assert journal.head_seq == 10


async def test_a_cancelled_journal_closes_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    with anyio.CancelScope() as scope:
        async with open_journal(path) as journal:
            await journal.append([trigger(1)])
            scope.cancel()
            await anyio.sleep_forever()
    with pytest.raises(JournalClosed):
        await journal.append([trigger(2)])
    assert (await verify_journal(path)).events == 1


async def test_an_exception_in_the_body_propagates_unwrapped(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        async with open_journal(tmp_path / "journal.db") as journal:
            await journal.append([trigger(1)])
            raise KeyError("boom")


# --- crashes, tampering, damaged and foreign files ----------------------------


@pytest.mark.parametrize("lazy", [False, True], ids=["synced", "half-unsynced"])
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_acknowledged_events_survive_sigkill(tmp_path: Path, seed: int, lazy: bool) -> None:
    path = tmp_path / "journal.db"
    wanted = random.Random(seed).randint(1, 600)
    acknowledged: list[int] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # A guard against a hung child, not a timing assertion.
    with anyio.fail_after(60):
        process = await anyio.open_process(
            [sys.executable, str(WRITER), str(path), *(["lazy"] if lazy else [])],
            env=env,
            stderr=None,
        )
        async with process:
            assert process.stdout is not None
            lines = BufferedByteReceiveStream(process.stdout)
            while len(acknowledged) < wanted:
                acknowledged.append(int(await lines.receive_until(b"\n", 32)))
            process.kill()
            assert await process.wait() == -signal.SIGKILL

    report = await verify_journal(path)
    assert report.ok, report.problem
    async with open_journal(path) as journal:
        stored = seqs(await journal.read())
        assert stored == list(range(1, journal.head_seq + 1))
    assert len(set(acknowledged)) == len(acknowledged)
    assert set(acknowledged) <= set(stored)
    assert report.events == len(stored)


TAMPERING = {
    "body": "UPDATE events SET body = CAST(replace(CAST(plain(body) AS TEXT), '\"x\":5', '\"x\":6')"
    " AS BLOB) WHERE seq = 5",
    "hash": "UPDATE events SET hash = zeroblob(32) WHERE seq = 5",
    "type": "UPDATE events SET type = 'FlowClosed' WHERE seq = 5",
    "deleted": "DELETE FROM events WHERE seq = 5",
}


@pytest.mark.parametrize("tampering", TAMPERING)
async def test_verify_finds_tampering(tmp_path: Path, tampering: str) -> None:
    path = tmp_path / "journal.db"
    await make_journal(path, 10)
    async with open_journal(path) as journal:
        stored = await journal.read()
    with sqlite3.connect(path) as db:
        # Edited as plain JSON, which a journal of compressed bodies reads too.
        db.create_function("plain", 1, unpack, deterministic=True)
        assert db.execute(TAMPERING[tampering]).rowcount == 1
    db.close()

    report = await verify_journal(path)
    assert not report.ok
    assert report.first_bad_seq == 5
    assert (report.events, report.head) == (4, stored[3].hash)
    assert "event 5" in report.problem


async def test_opening_a_journal_whose_last_event_was_altered_fails(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    await make_journal(path, 10)
    with sqlite3.connect(path) as db:
        db.create_function("plain", 1, unpack, deterministic=True)
        db.execute(
            "UPDATE events SET body = CAST(replace(CAST(plain(body) AS TEXT), '10', '11') AS BLOB)"
            " WHERE seq = 10"
        )
    db.close()
    with pytest.raises(JournalCorrupt, match="event 10") as info:
        async with open_journal(path):
            pass
    assert str(path) in str(info.value)
    assert (await verify_journal(path)).first_bad_seq == 10


def damage(path: Path, kind: str, journal: Path) -> type[JournalError]:
    """Turn ``path`` into a damaged or foreign file; return the error opening it must raise."""
    if kind.startswith("truncated"):
        with journal.open("rb") as source:
            path.write_bytes(source.read(int(kind.removeprefix("truncated-"))))
        return JournalCorrupt
    if kind == "text":
        path.write_text("these are not the droids you are looking for\n" * 100)
        return JournalCorrupt
    if kind == "version":
        shutil.copy(journal, path)
        with sqlite3.connect(path) as db:
            db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
        db.close()
        return JournalVersionError
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE users (name TEXT)")
        db.execute("INSERT INTO users VALUES ('ada')")
    db.close()
    return JournalForeign


@pytest.mark.parametrize(
    "kind", ["truncated-3000", "truncated-20000", "text", "foreign", "version"]
)
@pytest.mark.parametrize("readonly", [False, True])
async def test_damaged_and_foreign_files_are_refused(
    tmp_path: Path, kind: str, readonly: bool
) -> None:
    journal = tmp_path / "journal.db"
    async with open_journal(journal) as writer:
        await writer.append([trigger(i) for i in range(500)])
    path = tmp_path / "damaged.db"
    expected = damage(path, kind, journal)
    before = path.read_bytes()

    with pytest.raises(expected) as info:
        async with open_journal(path, readonly=readonly):
            pass
    assert type(info.value) is expected
    codes = {JournalCorrupt: "JOURNAL_CORRUPT", JournalForeign: "JOURNAL_FOREIGN"}
    assert info.value.code == codes.get(expected, "JOURNAL_VERSION")
    assert str(path) in str(info.value)
    assert path.read_bytes() == before  # refused before anything was written

    report = await verify_journal(path)
    assert (report.ok, report.first_bad_seq) == (False, None)
    assert report.problem == info.value.detail


async def test_verify_reports_a_missing_file(tmp_path: Path) -> None:
    report = await verify_journal(tmp_path / "nowhere.db")
    assert (report.ok, report.events, report.first_bad_seq) == (False, 0, None)
    assert "unable to open" in report.problem
    assert not (tmp_path / "nowhere.db").exists()


async def test_an_injected_write_failure_fails_the_journal_closed(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    failed: list[int] = []

    async def doomed(x: int) -> None:
        with pytest.raises(JournalWriteFailed):
            await journal.append([trigger(x)])
        failed.append(x)

    async with open_journal(path, faults=JournalFaults(fail_transaction=3)) as journal:
        await journal.append([trigger(1)])
        await journal.append([trigger(2), trigger(3)])
        async with anyio.create_task_group() as tg:
            for x in range(10, 20):
                tg.start_soon(doomed, x)
        assert sorted(failed) == list(range(10, 20))
        assert journal.failed
        with pytest.raises(JournalWriteFailed, match="injected") as info:
            await journal.append([trigger(4)])
        assert info.value.code == "JOURNAL_WRITE_FAILED"
        assert str(path) in str(info.value)
        assert (journal.head_seq, journal.statistics().transactions) == (3, 2)
        assert seqs(await journal.read()) == [1, 2, 3]
        # The head record was rolled back with the rows: it still names event 3.
        with closing(sqlite3.connect(path)) as db:
            ((head,),) = db.execute("SELECT value FROM meta WHERE key = 'head'")
        assert head == f"3 {journal.head_hash}"

    async with open_journal(path) as journal:
        stored = await journal.read()
        assert [p.facts for p in payloads(stored, TriggerFired)] == [{"x": 1}, {"x": 2}, {"x": 3}]
        assert seqs(await journal.append([trigger(4)])) == [4]
    assert (await verify_journal(path)).ok


# --- listeners and subscriptions -------------------------------------------------


async def test_listeners_see_committed_events_in_order(tmp_path: Path) -> None:
    seen: list[Event] = []
    heads: list[int] = []
    async with open_journal(tmp_path / "journal.db") as journal:

        def listener(events: Sequence[Event]) -> None:
            heads.append(journal.head_seq)
            seen.extend(events)

        journal.add_listener(listener)
        await journal.append([trigger(0)])
        await append_concurrently(journal, [[trigger(i), trigger(-i)] for i in range(1, 50)])
        stored = await journal.read()
    assert seen == stored
    assert len(heads) == journal.statistics().transactions
    assert heads[-1] == stored[-1].seq  # called after the head moved, i.e. after commit


async def test_a_raising_listener_fails_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"

    def listener(events: Sequence[Event]) -> None:
        if events[-1].seq == 3:
            raise RuntimeError("projection bug")

    async with open_journal(path) as journal:
        journal.add_listener(listener)
        await journal.append([trigger(1), trigger(2)])
        with pytest.raises(JournalWriteFailed, match="listener") as info:
            await journal.append([trigger(3)])
        assert isinstance(info.value.__cause__, RuntimeError)
        with pytest.raises(JournalWriteFailed):
            await journal.append([trigger(4)])
    async with open_journal(path) as journal:
        assert journal.head_seq == 3  # the batch was committed before the listener ran
    assert (await verify_journal(path)).ok


@pytest.mark.parametrize("from_seq", [1, 5])
async def test_a_subscription_delivers_history_then_live_events(
    tmp_path: Path, from_seq: int
) -> None:
    got: list[Event] = []
    async with open_journal(tmp_path / "journal.db") as journal:
        await journal.append([trigger(i) for i in range(1, 11)])
        async with journal.subscribe(from_seq) as subscription:
            async for batch in subscription:
                got += batch
                if got[-1].seq == 10:
                    assert not subscription.lagging
                    for i in range(11, 31):
                        await journal.append([trigger(i)])
                if got[-1].seq == 30:
                    break
        assert got == await journal.read(from_seq)


async def test_a_slow_subscriber_never_blocks_the_writer_and_misses_nothing(
    tmp_path: Path,
) -> None:
    async with open_journal(tmp_path / "journal.db") as journal:
        await journal.append([trigger(0)])
        async with journal.subscribe(buffer=1) as subscription:
            assert seqs(await anext(subscription)) == [1]
            assert not subscription.lagging
            # A burst nobody reads: every append still completes, and memory stays bounded.
            for i in range(1, 51):
                await journal.append([trigger(i)])
            await append_concurrently(journal, [[trigger(i)] * (1 + i % 3) for i in range(100)])
            assert subscription.lagging
            head = journal.head_seq
            got: list[Event] = []
            with anyio.fail_after(30):  # a guard against a hang, not a timing assertion
                while len(got) < head - 1:
                    got += await anext(subscription)
            assert seqs(got) == list(range(2, head + 1))
            assert got == await journal.read(2)
            assert not subscription.lagging
            await journal.append([trigger(999)])
            assert seqs(await anext(subscription)) == [head + 1]


async def test_a_subscription_ends_when_the_journal_closes(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "journal.db") as journal:
        live = journal.subscribe()
        await journal.append([trigger(1)])
        assert seqs(await anext(live)) == [1]
        await journal.append([trigger(2), trigger(3)])
    # What was handed over before the close is still delivered, then iteration ends.
    async with live:
        assert [seqs(batch) async for batch in live] == [[2, 3]]
    async with journal.subscribe() as late:
        assert [batch async for batch in late] == []
