"""How the console follows a journal: notifications on PostgreSQL (no polling), rows taken.

On PostgreSQL the follower is given a poll interval of an hour: every change it
sees within the test's bound came by a notification (the journal's or the
inbox's), never by a poll.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import anyio

from kernel.core.events import Draft, TriggerFired
from kernel.inbox import DecideRequest
from kernel.journal.opening import open_journal
from kernel.runtime.messages import Decision
from tests.support.browser import ROOT, console_extra
from tests.support.operators import Keys, post
from tests.support.postgres import PostgresServer, postgres_server  # noqa: F401

console_extra()

from kernel.console._follow import Follower  # noqa: E402

HOUR_S = 3600.0
BOUND_S = 30


def reject(dfid: str) -> DecideRequest:
    return DecideRequest(dfid=dfid, decision=Decision.REJECT, operator="bo", reason="not this week")


def trigger(x: int) -> Draft:
    return Draft(payload=TriggerFired(topic="t", facts={"x": x}))


async def test_on_postgres_the_follower_wakes_on_notifications_never_by_polling(
    postgres_server: PostgresServer,  # noqa: F811
    operator_keys: Keys,
) -> None:
    url = postgres_server.new_url()
    async with open_journal(url) as writer:
        await writer.append([trigger(0)])
        follower = Follower(url, poll_s=HOUR_S)
        async with open_journal(url, readonly=True) as journal:
            await follower.catch_up(journal)
            assert follower.projections.last_seq == 1 and follower.queued == set()
            version = follower.version
            async with anyio.create_task_group() as tg:
                tg.start_soon(follower.run, journal)
                with anyio.fail_after(BOUND_S):
                    # Two rounds each: the second can only come by a notification.
                    for n in (2, 3):
                        await writer.append([trigger(n)])
                        while follower.projections.last_seq < n:
                            version = await follower.wait_changed(version)
                    for dfid in ("flow-a", "flow-b"):
                        # Another connection (as `dirk decide` or another console) queues a row.
                        await anyio.to_thread.run_sync(
                            post, operator_keys, url, reject(dfid), "bo", 1
                        )
                        while dfid not in follower.queued:
                            version = await follower.wait_changed(version)
                tg.cancel_scope.cancel()
            follower.close()
    assert follower.queued == {"flow-a", "flow-b"}
    assert follower.projections.last_seq == 3


async def test_a_row_the_journal_says_was_taken_is_not_queued_though_still_marked_untaken(
    tmp_path: Path, operator_keys: Keys
) -> None:
    # The kernel records what it made of a row, then marks the row taken: a follower woken by
    # the journal may read the inbox in between. The journal's word counts.
    from tests.console.test_console import _build

    db = tmp_path / "j.db"
    flows = await _build(db)
    row = await anyio.to_thread.run_sync(post, operator_keys, db, reject(flows["low"]), "bo", 1)
    done = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, "-m", "tests.support.operator_kernel", str(db), "--drain"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    )
    assert done.returncode == 0, done.stderr
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("UPDATE operator_inbox SET taken_seq = NULL WHERE id = ?", (row,))
    follower = Follower(str(db), poll_s=HOUR_S)
    async with open_journal(db, readonly=True) as journal:
        await follower.catch_up(journal)
    assert row in follower.projections.inbox_taken
    assert follower.queued == set()
    # A row no event names yet is queued.
    other = await anyio.to_thread.run_sync(post, operator_keys, db, reject(flows["high"]), "bo", 2)
    follower2 = Follower(str(db), poll_s=HOUR_S)
    async with open_journal(db, readonly=True) as journal:
        await follower2.catch_up(journal)
    assert other not in follower2.projections.inbox_taken
    assert follower2.queued == {flows["high"]}
