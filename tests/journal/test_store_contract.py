"""One contract for every journal store: the same appends give the same journal.

Each test runs against the SQLite store (a file) and the PostgreSQL store (a
database on the run's throwaway server, tests/support/postgres.py), as
eventsourcing runs one recorder test case per backend. Same drafts and clock,
same canonical bytes, same chain: the head hash ``verify`` reports is equal.
"""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.core.events import Draft, FlowCreated, TriggerFired
from kernel.core.ports import ManualClock
from kernel.journal.copy import copy_journal
from kernel.journal.follow import follow_journal
from kernel.journal.opening import open_journal
from kernel.journal.store import (
    JournalClosed,
    JournalError,
    JournalFaults,
    JournalForeign,
    JournalKeyError,
    JournalWriteFailed,
)
from kernel.journal.verify import verify_journal
from tests.support.postgres import PostgresServer, postgres_server  # noqa: F401

KEY = b"k" * 32
STORES = ["sqlite", "postgres"]


def trigger(x: int, dfid: str | None = None) -> Draft:
    return Draft(payload=TriggerFired(topic="t", facts={"x": x}), dfid=dfid)


def flow(dfid: str) -> Draft:
    return Draft(payload=FlowCreated(root_dfid=dfid), dfid=dfid)


@pytest.fixture(params=STORES)
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a fresh journal goes: a file, or an empty PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "j.db")
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.new_url()


@pytest.fixture
def pg(postgres_server: PostgresServer) -> PostgresServer:  # noqa: F811
    return postgres_server


async def record(location: str, batches: list[list[Draft]], key: bytes | None = None) -> str:
    """Append ``batches`` (concurrently within each) on a fresh journal; return its head hash."""
    clock = ManualClock()
    async with open_journal(location, clock=clock, chain_key=key) as journal:
        for batch in batches:
            async with anyio.create_task_group() as tg:
                for draft in batch:
                    tg.start_soon(journal.append, [draft])
            clock.advance(1.0)
        return journal.head_hash


async def test_appends_read_back_in_order_with_every_filter(location: str) -> None:
    async with open_journal(location, clock=ManualClock()) as journal:
        first = await journal.append([trigger(1), trigger(2, "d1")])
        await journal.append([trigger(3, "d2"), flow("d1")])
        assert [e.seq for e in first] == [1, 2]
        assert journal.head_seq == 4
        assert [e.seq for e in await journal.read()] == [1, 2, 3, 4]
        assert [e.seq for e in await journal.read(2, 4)] == [2, 3]
        assert [e.seq for e in await journal.flow_events("d1")] == [2, 4]
        assert [e.seq for e in await journal.read(types=["FlowCreated"])] == [4]
        assert await journal.read(types=[]) == []
        assert [e.seq for e in await journal.read(limit=1, start=3)] == [3]
        events = await journal.read()
        assert events[0].prev_hash == "00" * 32
        assert all(a.hash == b.prev_hash for a, b in itertools.pairwise(events))
        assert events[-1].hash == journal.head_hash
        await journal.check_chain(2)
        scanned = [e.seq async for batch in journal.scan_checked(3) for e in batch]
        assert scanned == [3, 4]
        # What a fold reads: the same events from seq 2 on, without their hashes.
        bare = [e async for batch in journal.scan(2, batch_size=2, hashes=False) for e in batch]
        assert bare == [msgspec.structs.replace(e, prev_hash="", hash="") for e in events[1:]]


async def test_a_reopened_journal_goes_on_from_its_head(location: str) -> None:
    async with open_journal(location) as journal:
        await journal.append([trigger(1)])
        journal_id, head = journal.journal_id, journal.head_hash
    async with open_journal(location) as journal:
        assert (journal.journal_id, journal.head_seq, journal.head_hash) == (journal_id, 1, head)
        await journal.append([trigger(2)])
    async with open_journal(location, readonly=True) as journal:
        assert journal.head_seq == 2
        with pytest.raises(JournalClosed):
            await journal.append([trigger(3)])
    report = await verify_journal(location)
    assert (report.ok, report.events, report.journal_id) == (True, 2, journal_id)


async def test_the_same_appends_give_the_same_head_hash_in_both_stores(
    tmp_path: Path, pg: PostgresServer
) -> None:
    batches = [[trigger(1)], [trigger(2, "d"), trigger(3)], [flow("d")]]
    heads = set()
    for location in (str(tmp_path / "j.db"), pg.new_url()):
        heads.add(await record(location, [[b[0]] for b in batches] + [b[1:] for b in batches]))
        report = await verify_journal(location)
        assert report.ok, report.problem
        heads.add(report.head)
    assert len(heads) == 1


@settings(
    max_examples=6,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(
        st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=6), min_size=1, max_size=5
    ),
    st.booleans(),
)
async def test_any_appends_verify_to_one_head_in_both_stores_and_copy_between_them(
    tmp_path_factory: pytest.TempPathFactory, pg: PostgresServer, xs: list[list[int]], keyed: bool
) -> None:
    batches = [[trigger(x, f"d{x % 3}") for x in batch] for batch in xs]
    key = KEY if keyed else None
    locations = [str(tmp_path_factory.mktemp("h") / "j.db"), pg.new_url()]
    # Concurrent appends in a batch may commit in any order: compare each store with itself
    # sequentially and both stores with one order.
    heads = {
        await record(location, [[d] for b in batches for d in b], key) for location in locations
    }
    reports = [await verify_journal(location, chain_key=key) for location in locations]
    assert all(r.ok for r in reports), [r.problem for r in reports]
    assert {r.head for r in reports} == heads and len(heads) == 1
    assert {r.events for r in reports} == {sum(map(len, xs))}
    # And copied, row for row, to the other kind of store and back: the same journal.
    there, back = pg.new_url(), str(tmp_path_factory.mktemp("c") / "back.db")
    await copy_journal(locations[0], there, chain_key=key)
    await copy_journal(there, back, chain_key=key)
    copies = [await verify_journal(where, chain_key=key) for where in (there, back)]
    assert {(r.ok, r.head, r.journal_id) for r in copies} == {(True, *heads, reports[0].journal_id)}


async def test_a_keyed_journal_needs_its_key_to_be_written(location: str) -> None:
    async with open_journal(location, chain_key=KEY) as journal:
        await journal.append([trigger(1)])
        assert journal.keyed
    with pytest.raises(JournalKeyError):
        async with open_journal(location):
            pass
    with pytest.raises(JournalKeyError):
        async with open_journal(location, chain_key=b"x" * 32):
            pass
    async with open_journal(location, readonly=True) as journal:
        assert journal.head_seq == 1
    assert (await verify_journal(location, chain_key=KEY)).ok
    assert not (await verify_journal(location)).ok


async def test_snapshots_are_written_read_and_dropped(location: str) -> None:
    async with open_journal(location) as journal:
        await journal.append([trigger(1)])
        await journal.write_snapshot(1, "d1", b"\x00body")
        await journal.write_snapshot(1, "d2", b"\x01body")
        await journal.write_snapshot(3, "d3", b"x")
        assert await journal.snapshot_seqs() == [1, 3]
        assert await journal.read_snapshot(1) == ("d2", b"\x01body")
        await journal.drop_snapshots([3])
        assert await journal.snapshot_seqs() == [1]
        assert await journal.read_snapshot(3) is None


async def test_a_failed_transaction_fails_the_journal_and_writes_nothing(location: str) -> None:
    async with open_journal(location, faults=JournalFaults(fail_transaction=2)) as journal:
        await journal.append([trigger(1)])
        with pytest.raises(JournalWriteFailed):
            await journal.append([trigger(2)])
        with pytest.raises(JournalWriteFailed):
            await journal.append([trigger(3)])
    async with open_journal(location) as journal:
        assert journal.head_seq == 1
    assert (await verify_journal(location)).ok


async def test_a_subscriber_sees_history_then_live_commits(location: str) -> None:
    async with open_journal(location) as journal:
        await journal.append([trigger(1), trigger(2)])
        seen: list[int] = []
        async with journal.subscribe(2) as sub:
            async for batch in sub:
                seen += [e.seq for e in batch]
                if seen[-1] == 2:
                    await journal.append([trigger(3)])
                if seen[-1] == 3:
                    break
        assert seen == [2, 3]


async def test_a_read_only_open_of_nothing_is_refused(location: str) -> None:
    if location.startswith("postgresql://"):
        with pytest.raises(JournalForeign):
            async with open_journal(location, readonly=True):
                pass
    else:
        await anyio.Path(location).touch()
        with pytest.raises(JournalForeign):
            async with open_journal(location, readonly=True):
                pass


async def test_a_database_of_something_else_is_foreign(pg: PostgresServer) -> None:
    url = pg.new_url()
    pg.admin("CREATE TABLE customers (id INT)", url.rsplit("/", 1)[1])
    with pytest.raises(JournalForeign):
        async with open_journal(url):
            pass
    report = await verify_journal(url)
    assert not report.ok and "something else" in report.problem


async def test_a_follower_sees_history_then_new_commits(location: str) -> None:
    clock = ManualClock()
    seen: list[int] = []
    async with open_journal(location) as journal:
        await journal.append([trigger(1), trigger(2)])

        async def follow() -> None:
            stream = follow_journal(location, 2, poll_s=1.0, clock=clock)
            async with contextlib.aclosing(stream) as batches:
                async for batch in batches:
                    seen.extend(e.seq for e in batch)
                    if seen[-1] == 2:
                        await journal.append([trigger(3)])
                    if seen[-1] == 3:
                        return

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                while seen[-1:] != [3]:
                    clock.advance(1.0)  # SQLite's follower reads again on its clock
                    await anyio.lowlevel.checkpoint()
    assert seen == [2, 3]


@settings(max_examples=50, derandomize=True, deadline=None)
@given(
    st.text(st.characters(blacklist_characters="@/?#:&= \n", min_codepoint=33), min_size=4),
    st.sampled_from(["postgresql://ana:{}@db/j", "postgres://ana:{}@db:5432/j?sslmode=require",
                     "postgresql://db/j?user=ana&password={}&sslmode=require"]),
)  # fmt: skip
def test_a_password_in_a_url_never_reaches_an_error_message(secret: str, url: str) -> None:
    error = JournalError(url.format(secret), "cannot be used")
    assert secret not in str(error) and secret not in error.path
    assert "***" in error.path


# --- the Merkle tree (kernel.journal.tree) ----------------------------------------------


async def test_the_writer_keeps_the_merkle_tree_of_its_events_across_reopens(
    location: str,
) -> None:
    from kernel.core.merkle import leaf_hash, root_of, verify_consistency, verify_inclusion
    from kernel.proofs.bundle import _bare

    async with open_journal(location, clock=ManualClock()) as journal:
        for n in range(7):
            await journal.append([trigger(x) for x in range(n * 5, n * 5 + 5)])
        first = journal.tree_root
    async with open_journal(location, clock=ManualClock()) as journal:
        # Rebuilt from at most log2(n) stored nodes and the last < 16 events.
        assert journal.tree_root == first
        await journal.append([trigger(99)])
        events = await journal.read()
        leaves = [leaf_hash(_bare(e)) for e in events]
        assert journal.tree_root == root_of(leaves)
        trees = journal.trees()
        for size in (1, 16, 17, 35, 36):
            assert await trees.root(size) == root_of(leaves[:size])
        for seq in (1, 16, 17, 36):
            proof = await trees.inclusion(seq, 36)
            assert verify_inclusion(seq - 1, 36, leaves[seq - 1], proof, root_of(leaves))
        proof = await trees.consistency(17, 36)
        assert verify_consistency(17, 36, proof, root_of(leaves[:17]), root_of(leaves))
    report = await verify_journal(location)
    assert report.ok and report.tree_root == root_of(leaves).hex() and report.tree_stored


async def test_a_journal_from_before_trees_gets_its_tree_on_its_first_open_for_writing(
    location: str,
) -> None:
    async with open_journal(location, clock=ManualClock()) as journal:
        await journal.append([trigger(x) for x in range(40)])
        root = journal.tree_root
    forget_tree(location)
    report = await verify_journal(location)
    assert report.ok and not report.tree_stored and report.tree_root == (root or b"").hex()
    async with open_journal(location, readonly=True) as journal:
        # Read-only: proofs hash the events they need.
        assert await journal.trees().root(40) == root
    async with open_journal(location, clock=ManualClock()) as journal:
        assert journal.tree_root == root
    report = await verify_journal(location)
    assert report.ok and report.tree_stored


def forget_tree(location: str) -> None:
    """Make a journal look as one written before trees: no nodes, no mark."""
    if location.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute("DELETE FROM tree_nodes")
            conn.execute("DELETE FROM meta WHERE key = 'tree'")
        return
    import sqlite3

    with contextlib.closing(sqlite3.connect(location)) as db, db:
        db.execute("DELETE FROM tree_nodes")
        db.execute("DELETE FROM meta WHERE key = 'tree'")


async def test_an_altered_tree_node_fails_verify(location: str) -> None:
    async with open_journal(location, clock=ManualClock()) as journal:
        await journal.append([trigger(x) for x in range(20)])
    if location.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute("UPDATE tree_nodes SET hash = %s", (b"\x00" * 32,))
    else:
        import sqlite3

        with contextlib.closing(sqlite3.connect(location)) as db, db:
            db.execute("UPDATE tree_nodes SET hash = ?", (b"\x00" * 32,))
    report = await verify_journal(location)
    assert not report.ok and "Merkle tree's node at level 4, index 0" in report.problem


def test_signed_checkpoints_are_kept_beside_the_events_from_outside_the_writer(
    location: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kernel.cli import main
    from tests.support.proofs import KeyFiles

    async def write() -> None:
        async with open_journal(location, clock=ManualClock()) as journal:
            await journal.append([trigger(x) for x in range(21)])

    anyio.run(write)
    key = KeyFiles(tmp_path / "k", "log")
    # dirk checkpoint reads the journal and writes only tree_heads (a kernel may be running).
    assert main(["checkpoint", "--db", location, "--key-file", str(key.private)]) == 0
    assert main(["checkpoint", "--db", location, "--key-file", str(key.private)]) == 0
    capsys.readouterr()
    assert main(["verify", "--db", location, "--public-key", str(key.public)]) == 0
    assert "the latest covers events 1..21" in capsys.readouterr().out
    witness = KeyFiles(tmp_path / "k", "witness")
    state = tmp_path / "w.state"
    args = ["witness", "--db", location, "--log-key", str(key.public), "--key-file",
            str(witness.private), "--state", str(state), "--name", "w.example/1"]  # fmt: skip
    assert main(args) == 0

    async def heads() -> list[tuple[int, str]]:
        async with open_journal(location, readonly=True) as journal:
            return await journal.tree_heads()

    [(size, note)] = anyio.run(heads)
    assert size == 21 and note.count("\u2014 ") == 2  # the log's line and the witness's
