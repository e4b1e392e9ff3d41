"""The operator's CLI against a kernel running in another process, through the inbox."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernel.inbox import DecideRequest
from kernel.journal.opening import open_journal
from kernel.runtime.messages import Decision
from tests.cli.test_cli import COMMAND_TIMEOUT_S, Recorded, dirk, one_error_line, record
from tests.support import ROOT
from tests.support.operators import Keys, post

WAIT = "30"  # dirk decide --wait: how long the CLI itself waits for the kernel


@contextmanager
def running_kernel(db: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """Start tests/support/operator_kernel.py on ``db``; yield it and its DFIDs once it is ready."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.operator_kernel", str(db), *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        dfids = json.loads(proc.stdout.readline() or "null")
        assert dfids is not None, proc.communicate(timeout=COMMAND_TIMEOUT_S)[1]
        assert proc.stdout.readline() == "ready\n"
        yield proc, dfids
    finally:
        if proc.poll() is None:
            _, err = proc.communicate(timeout=COMMAND_TIMEOUT_S)  # closes stdin: stop
            assert proc.returncode == 0, err


def run_kernel(db: Path, *args: str) -> list[str]:
    """Run the kernel until it has drained the inbox and nothing moves; return its DFIDs."""
    with running_kernel(db, *args, "--drain") as (proc, dfids):
        _, err = proc.communicate(timeout=COMMAND_TIMEOUT_S)
        assert proc.returncode == 0, err
    return dfids


def count(db: Path, type_: str, dfid: str) -> int:
    """How many events of ``type_`` flow ``dfid`` has, as a reader sees them (derived too)."""

    async def read() -> int:
        async with open_journal(db, readonly=True) as journal:
            return len(await journal.read(dfid=dfid, types=[type_]))

    return anyio.run(read)


def escalations(db: Path) -> dict[str, dict[str, Any]]:
    result = dirk("escalations", "--db", db, "--json")
    assert result.returncode == 0, result.stderr
    return {row["dfid"]: row for row in map(json.loads, result.stdout.splitlines())}


def flows(db: Path) -> dict[str, dict[str, object]]:
    result = dirk("flows", "--db", db, "--json")
    assert result.returncode == 0, result.stderr
    return {row["dfid"]: row for row in map(json.loads, result.stdout.splitlines())}


def test_list_review_approve_reject_modify_against_a_live_kernel(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    with running_kernel(db, "--flows", "3") as (_, dfids):
        approve, reject, modify, memo = dfids

        pending = escalations(db)
        assert set(pending) == set(dfids)
        assert pending[approve]["impact"] == "HIGH_IMPACT"
        assert pending[memo]["impact"] == "LOW_IMPACT"
        assert pending[approve]["reason_code"] == "LOW_CONFIDENCE"
        assert pending[approve]["agent_id"] == "clerk"
        assert pending[approve]["action"] == "test.transfer(account=acc-1, amount_cents=100)"
        short = str(pending[approve]["hash"])
        assert len(short) == 10 and short != pending[reject]["hash"]
        table = dirk("escalations", "--db", db)
        assert "4 pending escalations" in table.stdout and short in table.stdout

        review = dirk("review", approve, "--db", db)
        assert review.returncode == 0, review.stderr
        for part in (
            "LOW_CONFIDENCE: confidence 0.2 is below the threshold 0.5",
            "impact HIGH_IMPACT, approval PENDING",
            "test.transfer(account=acc-1, amount_cents=100)",
            f"action hash {short}",
            "pay the invoice",
            "The working context the agent saw",
            "max attempts 3",
            f"--approve --confirm {short}",
        ):
            assert part in review.stdout, part

        # No one-key approval of a HIGH_IMPACT action, and no approving another action.
        who = ("--operator", "ana", "--reason", "vendor known")
        bare = dirk("decide", approve, "--approve", *who, "--db", db)
        assert (bare.returncode, one_error_line(bare)) == (1, "CONFIRMATION_REQUIRED")
        other = dirk(
            "decide", approve, "--approve", "--confirm", pending[reject]["hash"], *who, "--db", db
        )
        assert (other.returncode, one_error_line(other)) == (1, "ACTION_MISMATCH")

        done = dirk(
            "decide", approve, "--approve", "--confirm", short, *who, "--wait", WAIT, "--db", db
        )
        assert done.returncode == 0, done.stderr
        assert "applied: approve by ana" in done.stdout
        twice = dirk("decide", approve, "--approve", "--confirm", short, *who, "--db", db)
        assert (twice.returncode, one_error_line(twice)) == (1, "FLOW_NOT_ACTIVE")

        no = dirk(
            "decide",
            reject,
            "--reject",
            "--operator",
            "bob",
            "--reason",
            "dup",
            "--wait",
            WAIT,
            "--db",
            db,
        )
        assert no.returncode == 0, no.stderr
        half = '{"account": "acc-1", "amount_cents": 50}'
        changed = dirk("decide", modify, "--modify", half, *who, "--wait", WAIT, "--db", db)
        assert changed.returncode == 0, changed.stderr
        # LOW_IMPACT: one decision is enough.
        ok = dirk(
            "decide",
            memo,
            "--approve",
            "--operator",
            "ana",
            "--reason",
            "fine",
            "--wait",
            WAIT,
            "--db",
            db,
        )
        assert ok.returncode == 0, ok.stderr
        assert escalations(db) == {}

    final = flows(db)
    assert final[approve]["status"] == "CLOSED"
    assert (final[reject]["status"], final[reject]["reason_code"]) == ("ABORTED", "HUMAN_REJECTED")
    assert final[modify]["status"] == "CLOSED"
    assert final[memo]["status"] == "CLOSED"
    for dfid in (approve, modify, memo):
        assert count(db, "HumanDecided", dfid) == 1
        assert count(db, "ExecutionStarted", dfid) == 1
    assert count(db, "ExecutionStarted", reject) == 0
    show = dirk("show", modify, "--db", db)
    assert '"amount_cents": 50' in show.stdout and "human modification" in show.stdout


def test_a_decision_is_applied_once_across_restarts_and_repeats(
    tmp_path: Path, operator_keys: Keys
) -> None:
    db = tmp_path / "j.db"
    with running_kernel(db, "--flows", "1") as (_, dfids):
        dfid = dfids[0]
        short = str(escalations(db)[dfid]["hash"])

    # The kernel is down: the decision waits in the inbox; the CLI run twice queues it once.
    who = ("--operator", "ana", "--reason", "checked by phone")
    first = dirk("decide", dfid, "--approve", "--confirm", short, *who, "--db", db)
    assert first.returncode == 0, first.stderr
    again = dirk("decide", dfid, "--approve", "--confirm", short, *who, "--db", db)
    assert (again.returncode, one_error_line(again)) == (1, "DECISION_QUEUED")
    # Two operators racing past that check: the kernel still applies one decision.
    racing = DecideRequest(
        dfid=dfid, decision=Decision.APPROVE, action_hash=short, operator="bob", reason="me too"
    )
    post(operator_keys, db, racing, "bob")

    run_kernel(db)
    assert count(db, "HumanDecided", dfid) == 1
    assert count(db, "DecisionRefused", dfid) == 1
    assert count(db, "ExecutionStarted", dfid) == 1
    assert flows(db)[dfid]["status"] == "CLOSED"

    # The kernel recorded the decision but died before marking the rows taken.
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("UPDATE operator_inbox SET taken_seq = NULL")
    run_kernel(db)
    assert count(db, "HumanDecided", dfid) == 1
    assert count(db, "ExecutionStarted", dfid) == 1
    with closing(sqlite3.connect(db)) as conn:
        taken = [seq for (seq,) in conn.execute("SELECT taken_seq FROM operator_inbox")]
    assert len(taken) == 2 and all(isinstance(seq, int) and seq > 0 for seq in taken)
    assert dirk("verify", "--db", db).returncode == 0


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return anyio.run(record, tmp_path_factory.mktemp("journal") / "j.db")


def test_review_of_a_decided_flow_and_bad_decisions(journal: Recorded) -> None:
    review = dirk("review", journal.aborted, "--db", journal.path)
    assert review.returncode == 0, review.stderr
    assert "approval REJECTED" in review.stdout and "decided by ana: 'looks wrong'" in review.stdout
    assert "To decide" not in review.stdout

    unknown = dirk("review", "no-such-flow", "--db", journal.path)
    assert (unknown.returncode, one_error_line(unknown)) == (1, "UNKNOWN_FLOW")
    who = ("--operator", "ana", "--reason", "r")
    late = dirk("decide", journal.aborted, "--reject", *who, "--db", journal.path)
    assert (late.returncode, one_error_line(late)) == (1, "FLOW_NOT_ACTIVE")
    empty = dirk("escalations", "--db", journal.path)
    assert empty.returncode == 0 and "0 pending escalations" in empty.stdout


def test_a_modification_must_be_a_json_object(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    with running_kernel(db, "--flows", "1") as (_, dfids):
        who = ("--operator", "ana", "--reason", "r")
        for bad in ("{not json", "[1, 2]"):
            result = dirk("decide", dfids[0], "--modify", bad, *who, "--db", db)
            assert (result.returncode, one_error_line(result)) == (2, "SCHEMA_INVALID")
        assert set(escalations(db)) == set(dfids)
