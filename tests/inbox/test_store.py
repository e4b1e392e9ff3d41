"""The inbox's store port, one contract for SQLite and PostgreSQL; and what a file writer left.

The contract is :class:`kernel.testing.InboxStoreContract`, run here against both stores.

Every read gives bytes and integers, whatever a writer of the table stored: text that
is not UTF-8, a timestamp that is no number, a marker that is text. An inbox from
before requests were signed is set aside, and new ids continue after its ids (events
name rows by id).
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from kernel.journal.inbox_store import StoredRow, open_inbox
from kernel.journal.opening import open_journal
from kernel.testing import ContractBroken, InboxStoreContract
from tests.support.postgres import PostgresServer, postgres_server  # noqa: F401


async def new_journal(location: str) -> str:
    async with open_journal(location):
        pass
    return location


class TestSqliteInbox(InboxStoreContract):
    def journal_location(self, tmp_path: Path) -> str:
        return str(tmp_path / "j.db")


class TestPostgresInbox(InboxStoreContract):
    @pytest.fixture(autouse=True)
    def server(self, postgres_server: PostgresServer) -> None:  # noqa: F811
        self.pg = postgres_server

    def journal_location(self, tmp_path: Path) -> str:
        return self.pg.new_url()


def test_whatever_a_writer_of_the_file_stored_reads_as_bytes(tmp_path: Path) -> None:
    db = anyio.run(new_journal, str(tmp_path / "j.db"))
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute(
            "INSERT INTO operator_inbox (request, created_ts, taken_seq)"
            " VALUES (CAST(X'FFFE41' AS TEXT), CAST(X'FF' AS TEXT), NULL)"
        )
        conn.execute(
            "INSERT INTO operator_inbox (request, created_ts, taken_seq)"
            " VALUES ('ok', 'soon', NULL)"
        )
    with open_inbox(db) as store:
        assert store.rows() == [
            StoredRow(id=1, body=b"\xff\xfeA", created_ts=0),
            StoredRow(id=2, body=b"ok", created_ts=0),
        ]


def test_an_unsigned_inbox_of_an_earlier_kernel_is_set_aside_and_ids_go_on(tmp_path: Path) -> None:
    db = anyio.run(new_journal, str(tmp_path / "j.db"))
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.executescript(
            """
            DROP TABLE operator_inbox;
            CREATE TABLE operator_inbox (
                id INTEGER PRIMARY KEY AUTOINCREMENT, dfid TEXT NOT NULL, decision TEXT NOT NULL,
                created_ts INTEGER NOT NULL, taken_seq INTEGER
            );
            INSERT INTO operator_inbox (dfid, decision, created_ts) VALUES ('f', '{}', 0);
            INSERT INTO operator_inbox (dfid, decision, created_ts) VALUES ('f', '{}', 0);
            """
        )
    with open_inbox(db, readonly=True) as reader:
        assert reader.rows() == []  # an old table is read by nobody
    with open_inbox(db) as store:
        assert store.rows() == []
        assert store.insert(b"new", 0) == 3
    with closing(sqlite3.connect(db)) as conn:
        [(old,)] = conn.execute("SELECT count(*) FROM operator_inbox_unsigned").fetchall()
    assert old == 2


def test_the_contract_names_the_rule_a_store_breaks(tmp_path: Path) -> None:
    """A store whose new inbox already holds a row fails the suite, which says why."""
    used = anyio.run(new_journal, str(tmp_path / "used.db"))
    with open_inbox(used) as store:
        store.insert(b"left over", 1)

    class UsedInbox(InboxStoreContract):
        def journal_location(self, tmp_path: Path) -> str:
            return used

    with pytest.raises(ContractBroken, match="a new inbox is empty"):
        UsedInbox().test_contract_rows_are_inserted_read_and_marked_taken(tmp_path)
