"""The benchmark harness's own logic: what it reports when a peer is missing, and its report.

The figures themselves are never asserted (they are timings); CI runs
``python -m benchmarks --quick`` and only checks it writes valid JSON.
"""

from __future__ import annotations

import importlib.metadata
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.memory import resident_bytes
from benchmarks.peers import installed
from benchmarks.report import Figure, table
from benchmarks.storage import measure_file, run_storage
from examples.market import MIN_MINUTES
from kernel.audit import open_journal, payloads
from kernel.core.events import Draft, ProposalSubmitted, TriggerFired


def test_a_missing_peer_is_named_with_how_to_install_it() -> None:
    assert installed(("anyio",)) == {"anyio": importlib.metadata.version("anyio")}
    reason = installed(("anyio", "no-such-package-dirk-bench"))
    assert isinstance(reason, str)
    assert "no-such-package-dirk-bench not installed" in reason
    assert ".[bench]" in reason


def test_skipped_and_ceiling_figures_render_and_serialise() -> None:
    skipped = Figure("P9.x", "x: skipped: x not installed", "", skipped=True)
    latency = Figure("P3", "latency", "us", [900.0, 1200.0, 1100.0], goal=1000.0)
    latency.lower_is_better = True
    bytes_ = Figure("P6", "bytes", "bytes", [300.0], goal=350.0, lower_is_better=True)
    text = table([skipped, latency, bytes_])
    assert "skipped" in text and "<= 1,000" in text
    assert skipped.to_json() == {"name": "x: skipped: x not installed", "skipped": True}
    assert latency.to_json()["goal_met"] is False  # median 1100 is above the ceiling
    assert bytes_.to_json()["goal_met"] is True
    json.dumps([f.to_json() for f in (skipped, latency, bytes_)])


async def test_storage_breakdown_accounts_for_the_events_table(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with open_journal(path) as journal:
        await journal.append(
            [Draft(payload=TriggerFired(topic=f"t.{i}", facts={"k": i})) for i in range(200)]
        )
    run = measure_file(path)
    assert run.events == 200
    with sqlite3.connect(path) as conn:
        (body,) = conn.execute("SELECT sum(length(body)) FROM events").fetchone()
    assert run.breakdown["column_body"] == body / 200
    assert run.bytes_per_event == path.stat().st_size / 200
    if "events_table_pages" in run.breakdown:  # SQLite built with dbstat
        assert run.breakdown["events_table_pages"] >= run.breakdown["column_body"]


def test_resident_bytes_grows_with_what_the_process_holds() -> None:
    before = resident_bytes()
    held = bytes(range(256)) * (256 * 1024)  # 64 MiB written, so resident
    assert resident_bytes() - before >= 32 * 1024 * 1024
    del held


def test_peer_runner_reports_as_json_in_its_own_process() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.peers", "autogen", "--decisions", "20"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record["peer"] == "autogen"
    # Either it ran all of them, or it says why not (the extra is not installed in CI).
    assert record.get("decisions") == 20 or record["error"].startswith("skipped")


async def test_p6_measures_the_shipped_trading_desk(tmp_path: Path) -> None:
    """P6 drives the example itself: its journal is the one measured, event for event."""
    path = tmp_path / "desk.db"
    run = await run_storage(path, MIN_MINUTES)
    async with open_journal(path, readonly=True) as journal:
        submitted = await journal.read(types=["ProposalSubmitted"])
        kinds = {p.proposal.kind for p in payloads(submitted, ProposalSubmitted)}
        assert run.events == journal.head_seq
    assert {"trading.place_order", "trading.set_mandate", "desk.rebalance"} <= kinds
    assert run.bytes_per_event == path.stat().st_size / run.events
    # P6.read: the same bytes over the events a reader gets, each row's and those it
    # stands for (an accepted submission carries its acceptance and start).
    async with open_journal(path, readonly=True) as journal:
        read = [e async for batch in journal.scan() for e in batch]
    assert run.events_read == len(read) > run.events
    assert {"ProposalAccepted", "ExecutionStarted"} <= {e.type for e in read}
    assert run.bytes_per_event_read == path.stat().st_size / len(read)


def test_every_goal_of_issue_35_is_printed_met_missed_skipped_or_not_run() -> None:
    from benchmarks.__main__ import ISSUE_GOALS, goals

    figures = [
        Figure("P1", "flows", "flows/s", [7_500.0], goal=7_000.0),
        Figure("C1", "cpu", "us", [200.0], goal=130.0, lower_is_better=True),
        Figure("P13", "P13 mesh: skipped: nats-server is not installed", "", skipped=True),
        Figure("P9.dbos", "dbos: skipped: dbos not installed", "", skipped=True),
    ]
    text = goals(figures)
    lines = text.splitlines()[1:]
    assert len(lines) == len(ISSUE_GOALS)
    assert "met: 7,500 flows/s, 1.07x the goal" in lines[0]
    assert "MISSED: 200 us, 1.54x the goal" in lines[2]
    by_goal = {goal: line for (_, goal), line in zip(ISSUE_GOALS, lines, strict=True)}
    assert "skipped (P13 mesh" in by_goal["4 mesh hosts >= 3.5x 1 host, 50 ms agents"]
    assert "skipped (dbos" in by_goal["R9 >= 25x DBOS"]
    assert "not measured in this run" in by_goal["P6 <= 200 bytes/event"]


async def test_a_p1_run_splits_its_cpu_by_thread_and_counts_its_io(tmp_path: Path) -> None:
    from benchmarks.flows import run_flows

    run = await run_flows(tmp_path / "p1.db", 40)
    assert run.threads is not None and "event loop" in run.threads
    assert "journal writer (worker threads)" in run.threads
    assert all(seconds >= 0.0 for seconds in run.threads.values())
    assert run.io is not None and run.io["wchar"] > 0  # the journal was written
    with sqlite3.connect(tmp_path / "p1.db") as db:
        dfids = [d for (d,) in db.execute("SELECT dfid FROM events WHERE dfid != '' ORDER BY seq")]
    # The benchmark's flows get time-ordered ids: their first appearance is in id order.
    first_seen = list(dict.fromkeys(dfids))
    assert first_seen and all(d[14] == "7" for d in first_seen)


async def test_p18_acts_for_the_declared_tenants_member_with_its_scopes_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import msgspec

    import benchmarks.flows as flows
    from kernel.audit import open_journal
    from kernel.core.events import FlowCreated, Member

    await flows.run_flows(tmp_path / "p18.db", 40, tenants=True)
    async with open_journal(tmp_path / "p18.db", readonly=True) as journal:
        created = [e.payload for e in await journal.read(types=["FlowCreated"])]
    tenants = {
        (c.on_behalf.principal.tenant, c.on_behalf.principal.user)
        for c in created
        if isinstance(c, FlowCreated) and c.on_behalf is not None
    }
    assert tenants == {("bench-co", "bench")}
    # What P18 measures is judged: a member without the kind's scope gets no flow through.
    lacking = msgspec.structs.replace(flows.TENANT, members={"bench": Member(scopes=["read"])})
    monkeypatch.setattr(flows, "TENANT", lacking)
    with pytest.raises(flows.BenchmarkFailed, match="ABORTED"):
        await flows.run_flows(tmp_path / "lacking.db", 40, tenants=True)


async def test_p20_puts_every_optional_domain_in_use_and_its_citations_are_correct(
    tmp_path: Path,
) -> None:
    from benchmarks.flows import run_flows
    from kernel.audit import open_journal
    from kernel.core.events import CitationsChecked

    run = await run_flows(tmp_path / "p20.db", 40, domains=True)
    async with open_journal(tmp_path / "p20.db", readonly=True) as journal:
        kinds = {e.type for e in await journal.read()}
        checked = [e.payload for e in await journal.read(types=["CitationsChecked"])]
    assert {"ResourceReserved", "ConstraintAdded", "FactAdded", "RuleDecided", "GrantIssued"} <= (
        kinds
    )
    # Synchronous agents cite the rule their context showed, staged in the same append as
    # their proposal: the check reads that context, not the committed state before it.
    assert len(checked) == 40
    assert all(isinstance(c, CitationsChecked) for c in checked)
    assert {tuple(c.correct) for c in checked if isinstance(c, CitationsChecked)} == {
        ("bench-rule@v1",)
    }
    assert not any(c.incorrect for c in checked if isinstance(c, CitationsChecked))
    assert run.events / run.flows > 10  # more recorded per flow than P1's 6.25


def test_the_library_split_reads_a_native_py_spy_profile() -> None:
    from benchmarks.profile import by_library

    wait = "PyThread_acquire_lock_timed (libpython3.11.so);0x7f (libc.so.6)"
    lines = [
        "thread (1): MainThread;_run_once (asyncio/base_events.py:1922);seal (kernel/x.py:1) 5",
        "thread (1);_run_once (asyncio/base_events.py:1922);json_encode_str (msgspec/_core.so) 2",
        "thread (2): AnyIO worker thread;append (kernel/journal/_sqlite.py:1);"
        "ZSTD_compressBlock (zstd.c:1) 3",
        "thread (2): AnyIO worker thread;append (kernel/journal/_sqlite.py:2);"
        "sqlite3WalFrames (libsqlite3.so);fdatasync (libc.so.6) 4",
        f"thread (2): AnyIO worker thread;Condition.wait (threading.py:327);{wait} 50",
    ]
    found = by_library(lines)
    assert found == {
        ("event loop", "kernel (Python)"): 5,
        ("event loop", "msgspec"): 2,  # an unnamed header is the same thread by its id
        ("journal writer (worker threads)", "compression (zstd, zlib)"): 3,
        ("journal writer (worker threads)", "file I/O syscalls"): 4,
    }  # the 50 idle samples are left out


async def test_p5_counts_the_events_a_reader_sees_and_the_own_lever_per_flow(
    tmp_path: Path,
) -> None:
    from benchmarks import own_side
    from benchmarks.flows import run_flows
    from benchmarks.replay import run_replay

    path = tmp_path / "p1.db"
    await run_flows(path, 40)
    rows, events = await own_side.read_counts(path)
    replayed = await run_replay(path)
    # A FlowCreated row carries its ContextCompiled, a closing success its FlowClosed.
    assert (replayed.rows, replayed.events) == (rows, events) and events - rows >= 2 * 40
    assert replayed.rows_per_s == pytest.approx(replayed.replay_per_s * rows / events)
    figures = own_side.replay_figures(40, replayed, rows, events)
    assert figures["P5 flows/s"] == pytest.approx(40 / replayed.replay_s)
    assert figures["P5.v events/s"] == pytest.approx(events / replayed.verify_s)
    assert figures["P5.v rows/s"] == pytest.approx(replayed.verify_rows_per_s)
