"""The kernel, the CLI and the operator inbox on a journal in PostgreSQL.

Every test runs against the run's throwaway server (tests/support/postgres.py),
each on a database of its own. The contract both stores share is in
tests/test_store_contract.py; here is what PostgreSQL adds: ``open_kernel`` on
a URL, ``dirk`` verbs and ``dirk copy`` on URLs, the inbox woken by NOTIFY, the
writer lease with a standby, the fence against a deposed writer, and the
operator role that may only read and insert inbox rows.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel import FlowStatus
from kernel.core.events import Draft, TriggerFired
from kernel.inbox import DecideRequest
from kernel.journal.follow import follow_journal
from kernel.journal.opening import open_journal
from kernel.journal.store import JournalError, JournalFenced, JournalWriteFailed
from kernel.journal.verify import verify_journal
from kernel.runtime.messages import Decision
from kernel.testing import action_of
from tests.cli.test_cli import clean_env, dirk
from tests.support.helpers import Bank, ScriptedAgent, kernel_for, transfer
from tests.support.operators import Keys, insert, post
from tests.support.postgres import PostgresServer, postgres_server  # noqa: F401

KEY = b"k" * 32


@pytest.fixture
def pg(postgres_server: PostgresServer) -> PostgresServer:  # noqa: F811
    return postgres_server


@pytest.fixture
def url(pg: PostgresServer) -> str:
    return pg.new_url()


def trigger(x: int) -> Draft:
    return Draft(payload=TriggerFired(topic="t", facts={"x": x}))


async def test_a_kernel_on_postgres_closes_a_flow_and_verifies(url: str) -> None:
    bank = Bank()
    async with kernel_for(url, bank=bank) as kernel:  # type: ignore[arg-type]
        await kernel.register(ScriptedAgent(steps=[transfer(250)]))
        [dfid] = await kernel.trigger("bank.invoice", {"bank.invoice.amount": 250})
        flow = await kernel.wait_flow(dfid)
        assert flow.status is FlowStatus.CLOSED
    assert len(bank.effects) == 1
    # And again: the kernel restores from the database and goes on.
    async with kernel_for(url, bank=bank) as kernel:  # type: ignore[arg-type]
        assert kernel.projections.flows[dfid].status is FlowStatus.CLOSED
    report = await verify_journal(url)
    assert report.ok, report.problem
    result = dirk("verify", "--db", url)
    assert result.returncode == 0, result.stderr
    assert report.head in result.stdout
    flows = dirk("flows", "--db", url, "--json")
    assert [json.loads(line)["dfid"] for line in flows.stdout.splitlines()] == [dfid]


def test_every_verb_takes_the_url_from_dirk_db(url: str) -> None:
    anyio.run(_record, url)
    result = dirk("verify", env={**clean_env(), "DIRK_DB": url})
    assert result.returncode == 0, result.stderr
    assert "verify: ok events=2 " in result.stdout, result.stdout


async def _record(url: str) -> None:
    async with open_journal(url) as journal:
        await journal.append([trigger(1), trigger(2)])


def test_copy_from_sqlite_to_postgres_and_back_keeps_the_head(
    tmp_path: Path, pg: PostgresServer
) -> None:
    source = tmp_path / "j.db"
    anyio.run(_record, str(source))
    there, back = pg.new_url(), tmp_path / "back.db"
    first = dirk("copy", "--from", source, "--to", there)
    assert first.returncode == 0, first.stderr
    second = dirk("copy", "--from", there, "--to", back)
    assert second.returncode == 0, second.stderr
    heads = [anyio.run(verify_journal, where) for where in (source, there, back)]
    assert all(r.ok for r in heads)
    assert len({(r.head, r.events, r.journal_id) for r in heads}) == 1
    # Only into a new journal: a copy never mixes two.
    again = dirk("copy", "--from", source, "--to", there)
    assert again.returncode == 2 and "copy only into a new one" in again.stderr


async def test_a_keyed_journal_copies_with_its_key(tmp_path: Path, url: str) -> None:
    from kernel.journal.copy import copy_journal

    source = str(tmp_path / "k.db")
    async with open_journal(source, chain_key=KEY) as journal:
        await journal.append([trigger(1)])
    report = await copy_journal(source, url, chain_key=KEY)
    assert report.events == 1
    assert (await verify_journal(url, chain_key=KEY)).ok
    async with open_journal(url, chain_key=KEY) as journal:
        await journal.append([trigger(2)])
    assert (await verify_journal(url, chain_key=KEY)).events == 2


async def waiting_for_lease(url: str) -> None:
    """Return once some session waits for an advisory lock (the standby) in ``url``'s database."""
    import psycopg

    sql = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    with anyio.fail_after(60):
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            while (await (await conn.execute(sql)).fetchone()) != (1,):
                await anyio.lowlevel.checkpoint()


async def test_a_standby_waits_for_the_lease_and_goes_on_from_the_head(url: str) -> None:
    took_over = anyio.Event()

    async def standby() -> None:
        async with open_journal(url) as second:
            took_over.set()
            assert second.head_seq == 2
            await second.append([trigger(3)])

    async with anyio.create_task_group() as tg:
        async with open_journal(url) as first:
            await first.append([trigger(1)])
            tg.start_soon(standby)
            await waiting_for_lease(url)
            await first.append([trigger(2)])
            assert not took_over.is_set()
        # The first writer closed: its lease is free, and the standby takes it.
    assert took_over.is_set()
    report = await verify_journal(url)
    assert (report.ok, report.events) == (True, 3)


async def test_a_deposed_writer_fails_closed_at_its_next_append(
    url: str, pg: PostgresServer
) -> None:
    async with open_journal(url) as first:
        await first.append([trigger(1)])
        # The first writer's lease connection is cut (as if its host went away) ...
        pg.admin(
            "SELECT pg_terminate_backend(pid) FROM pg_locks"
            " WHERE locktype = 'advisory' AND granted",
            url.rsplit("/", 1)[1],
        )
        # ... a standby takes the journal and writes ...
        async with open_journal(url) as second:
            await second.append([trigger(2)])
        # ... and the deposed writer, still running, can no longer write: no fork.
        with pytest.raises(JournalFenced):
            await first.append([trigger(99)])
        with pytest.raises(JournalWriteFailed):
            await first.append([trigger(100)])
    report = await verify_journal(url)
    assert (report.ok, report.events) == (True, 2)


async def test_a_decision_wakes_the_kernel_by_notify_without_a_poll(
    url: str, operator_keys: Keys
) -> None:
    # The clock never moves: without the NOTIFY the poller's next round never comes.
    async with kernel_for(url, inbox_poll_s=3600.0) as kernel:  # type: ignore[arg-type]
        await kernel.register(ScriptedAgent(steps=[transfer(confidence=0.2, valid_for_s=600)]))
        [dfid] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.ESCALATED
        action = action_of(kernel, dfid)
        reject = DecideRequest(
            dfid=dfid, decision=Decision.REJECT, operator="ana", reason="no", action_hash=action
        )
        row = await anyio.to_thread.run_sync(post, operator_keys, url, reject, "ana")
        with anyio.fail_after(60):
            flow = await kernel.wait_flow(dfid, until={FlowStatus.ABORTED})
        assert kernel.projections.inbox_taken[row] > 0
        assert flow.status is FlowStatus.ABORTED


async def test_an_operator_role_may_read_and_post_but_never_write_events(
    url: str, pg: PostgresServer
) -> None:
    from kernel.journal._postgres import OPERATOR_GRANTS

    database = url.rsplit("/", 1)[1]
    async with open_journal(url) as journal:
        await journal.append([trigger(1)])
    pg.admin("DO $$ BEGIN CREATE ROLE operator LOGIN; EXCEPTION WHEN duplicate_object THEN END $$")
    pg.admin(OPERATOR_GRANTS.format(schema="public", role="operator"), database)
    as_operator = pg.url(database, user="operator")

    assert (await verify_journal(as_operator)).ok
    async with open_journal(as_operator, readonly=True) as journal:
        assert journal.head_seq == 1
    row = await anyio.to_thread.run_sync(insert, as_operator, b'{"any": "bytes"}')
    assert row > 0
    # The kernel's tables are not the operator's to write: events, head, meta, inbox marks,
    # nor an inbox row's id or mark at insert.
    with pytest.raises(JournalError, match="permission denied"):
        async with open_journal(as_operator) as journal:
            pass
    for sql in (
        "INSERT INTO events VALUES (2, 't', NULL, '\\x00', '\\x00')",
        "UPDATE journal_head SET seq = 0",
        "UPDATE operator_inbox SET taken_seq = 1",
        "INSERT INTO operator_inbox (request, created_ts, taken_seq) VALUES ('\\x00', 0, 5)",
        "INSERT INTO operator_inbox (id, request, created_ts) VALUES (999, '\\x00', 0)",
        "DELETE FROM events",
    ):
        with pytest.raises(Exception, match="permission denied"):
            pg.admin(sql, database, user="operator")
    report = await verify_journal(url)
    assert (report.ok, report.events) == (True, 1)


@pytest.mark.parametrize("example", ["trading", "booking"])
def test_the_examples_run_on_postgres_and_verify_with_their_verdicts(
    pg: PostgresServer, example: str
) -> None:
    url = pg.new_url()
    args = ["--minutes", "40"] if example == "trading" else []
    run = [sys.executable, "-m", f"examples.{example}", "--seed", "1", "--db", url, *args]
    done = subprocess.run(run, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    packs = {"trading": ["policies.trading", "examples.desk"], "booking": ["policies.booking"]}
    verdicts = [arg for pack in packs[example] for arg in ("--pack", pack)]
    verify = dirk("verify", "--db", url, "--verdicts", *verdicts)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "0 differ, 0 not compared" in verify.stdout


@settings(
    max_examples=5,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=6), st.integers(1, 5))
async def test_a_follower_in_another_connection_sees_every_commit_once_in_order(
    pg: PostgresServer, sizes: list[int], from_seq: int
) -> None:
    url = pg.new_url()
    total = sum(sizes)
    seen: list[int] = []
    async with open_journal(url) as journal:
        await journal.append([trigger(0)])  # the journal exists before the follower opens it
        total += 1

        start = min(from_seq, total)

        async def follow() -> None:
            async with contextlib.aclosing(follow_journal(url, start)) as batches:
                async for batch in batches:
                    seen.extend(e.seq for e in batch)
                    if seen[-1] == total:
                        return

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                for size in sizes:
                    await journal.append([trigger(i) for i in range(size)])
    assert seen == list(range(start, total + 1))


def test_dirk_decide_on_postgres_reaches_a_kernel_in_another_process(
    pg: PostgresServer, operator_keys: Keys
) -> None:
    from tests.cli.test_operator_cli import WAIT, escalations, running_kernel

    url = pg.new_url()
    with running_kernel(url, "--flows", "1") as (_, dfids):  # type: ignore[arg-type]
        approve, memo = dfids
        pending = escalations(url)  # type: ignore[arg-type]
        assert set(pending) == {approve, memo}
        short = str(pending[approve]["hash"])
        who = ("--operator", "ana", "--reason", "vendor known")
        done = dirk(
            "decide", approve, "--approve", "--confirm", short, *who, "--wait", WAIT, "--db", url
        )
        assert done.returncode == 0, done.stderr
        assert "applied: approve by ana" in done.stdout
    assert anyio.run(verify_journal, url).ok
