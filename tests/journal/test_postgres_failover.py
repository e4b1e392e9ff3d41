"""Failover on PostgreSQL, with real processes: SIGKILL the writing kernel, a standby goes on.

A kernel (tests/support/execution_worker.py, the kill test's worker) runs a
stream of flows against a durable simulated system and SIGKILLs itself at a
seeded commit; a second kernel on the same journal, started once the first
holds the lease, waits as a standby, takes over, recovers what the first left
and finishes it. The kill test's invariants then hold: every effect recorded
exactly once (or its flow waiting for a human on an unknown outcome), the
chain verified, no fork. Also: the writer's connection cut under a running
kernel makes it stop cleanly, and a restart recovers.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from kernel import FlowStatus
from kernel.audit import fold, open_journal, verify_journal
from tests.execution.test_execution_crash import check
from tests.support import ROOT, SUPPORT
from tests.support.helpers import Bank, ScriptedAgent, kernel_for, transfer
from tests.support.postgres import PostgresServer, postgres_server  # noqa: F401

WORKER = SUPPORT / "execution_worker.py"
SEEDS = range(int(os.environ.get("DIRK_FAILOVER_SEEDS", "3")))


@pytest.fixture
def pg(postgres_server: PostgresServer) -> PostgresServer:  # noqa: F811
    return postgres_server


def worker(*args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, str(WORKER), *args], env=env)


async def lease_holders(pg: PostgresServer, database: str, granted: bool) -> int:
    sql = f"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted = {granted}"
    return int((await anyio.to_thread.run_sync(pg.admin, sql, database))[0][0])


async def until_lease(
    pg: PostgresServer, database: str, granted: bool, proc: subprocess.Popen[bytes]
) -> None:
    """Return once a session holds (or waits for) the lease; fail if ``proc`` ended first."""
    while await lease_holders(pg, database, granted) < 1:
        assert proc.poll() is None or proc.returncode == 0, proc.returncode
        if proc.poll() is not None:
            return


async def wait(proc: subprocess.Popen[bytes]) -> int:
    return await anyio.to_thread.run_sync(proc.wait)


@pytest.mark.parametrize("seed", SEEDS)
async def test_a_standby_finishes_what_a_killed_writer_left(
    pg: PostgresServer, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(f"failover/{seed}")
    url = pg.new_url()
    database = url.rsplit("/", 1)[1]
    ledger, lookup = str(tmp_path / "ledger.db"), rng.choice(["0", "1"])
    kill = f"commit:{rng.randint(3, 24)}"
    # A guard against a hung child, not a timing assertion.
    with anyio.fail_after(300):
        writer = worker(url, ledger, "run", kill, lookup)
        try:
            await until_lease(pg, database, True, writer)
            standby = worker(url, ledger, "recover", "none", lookup)
            try:
                if writer.poll() is None:
                    await until_lease(pg, database, False, standby)
                assert await wait(writer) == -signal.SIGKILL
                assert await wait(standby) == 0
            finally:
                standby.kill()
        finally:
            writer.kill()
        await check(url, ledger, decided=False)
        async with open_journal(url, readonly=True) as journal:
            events = await journal.read()
        starts = [e.seq for e in events if e.type == "KernelStarted"]
        assert len(starts) == 2  # the writer's, then the standby's, on one chain
        state = fold(events)
        moving = (FlowStatus.ACCEPTED, FlowStatus.EXECUTING, FlowStatus.DIRTY)
        assert not [f.dfid for f in state.flows.values() if f.status in moving]


async def cut_off(pg: PostgresServer, database: str) -> None:
    """End every session of the kernel's on ``database`` (pg_terminate_backend)."""
    sql = (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        f" WHERE datname = '{database}' AND application_name = 'dirk'"
    )
    await anyio.to_thread.run_sync(pg.admin, sql)


@pytest.mark.parametrize("how", ["terminate", "restart"])
async def test_a_kernel_cut_off_from_its_server_reconnects_and_goes_on(
    pg: PostgresServer, how: str
) -> None:
    """A lost server is an outage the kernel rides out (kernel.journal.outage), not a stop."""
    url = pg.new_url()
    database = url.rsplit("/", 1)[1]
    bank = Bank()
    async with kernel_for(url, bank=bank) as kernel:  # type: ignore[arg-type]
        await kernel.register(ScriptedAgent(steps=[transfer(100), transfer(100)]))
        [first] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(first)).status is FlowStatus.CLOSED
        if how == "terminate":
            await cut_off(pg, database)
        else:
            await anyio.to_thread.run_sync(pg.stop, "immediate")
            await anyio.to_thread.run_sync(pg.start)
        # The next append meets the cut: the writer retakes its lease and commits it.
        [second] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(second)).status is FlowStatus.CLOSED
        assert not kernel.journal.failed
    assert len(bank.effects) == 2
    async with kernel_for(url, bank=bank) as kernel:  # type: ignore[arg-type]
        assert kernel.projections.flows[first].status is FlowStatus.CLOSED
    report = await verify_journal(url)
    assert report.ok, report.problem
