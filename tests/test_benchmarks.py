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
