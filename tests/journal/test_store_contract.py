"""One contract for every journal store: the same appends give the same journal.

The contract itself is :class:`kernel.testing.JournalStoreContract`, a suite a third
party runs against its own database too; here it runs against the SQLite store (a
file) and the PostgreSQL store (a database on the run's throwaway server,
tests/support/postgres.py), as eventsourcing runs one recorder test case per backend.
Beside it, what compares the two stores: same drafts and clock, same canonical bytes,
same chain, so the head hash ``verify`` reports is equal; and what each store keeps of
its tree in its own tables.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.core.events import Draft, FlowCreated, TriggerFired
from kernel.core.ports import ManualClock
from kernel.journal.copy import copy_journal
from kernel.journal.opening import open_journal
from kernel.journal.store import (
    JournalError,
    JournalForeign,
)
from kernel.journal.verify import verify_journal
from kernel.testing import ContractBroken, JournalStoreContract
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


class TestSqliteStore(JournalStoreContract):
    def journal_location(self, tmp_path: Path) -> str:
        return str(tmp_path / "j.db")


class TestPostgresStore(JournalStoreContract):
    @pytest.fixture(autouse=True)
    def server(self, postgres_server: PostgresServer) -> None:  # noqa: F811
        self.pg = postgres_server

    def journal_location(self, tmp_path: Path) -> str:
        return self.pg.new_url()


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


async def test_a_database_of_something_else_is_foreign(pg: PostgresServer) -> None:
    url = pg.new_url()
    pg.admin("CREATE TABLE customers (id INT)", url.rsplit("/", 1)[1])
    with pytest.raises(JournalForeign):
        async with open_journal(url):
            pass
    report = await verify_journal(url)
    assert not report.ok and "something else" in report.problem


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


def test_the_contract_names_the_rule_a_store_breaks(tmp_path: Path) -> None:
    """A store whose new journal already holds an event fails the suite, which says why."""
    used = str(tmp_path / "used.db")
    anyio.run(record, used, [[trigger(0)]])

    class UsedStore(JournalStoreContract):
        def journal_location(self, tmp_path: Path) -> str:
            return used

    with pytest.raises(ContractBroken, match="an append is numbered from 1"):
        UsedStore().test_contract_appends_read_back_in_order_with_every_filter(tmp_path)
