"""The spool is appended exactly once: across a kernel SIGKILLed in the outage, and a drain cut
between an append and its mark; a row that cannot be read is refused on record and the drain
goes on (hypothesis over spool contents)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO

import anyio
import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel import DecisionVerdict, Kernel, ReasonCode
from kernel.api.outage import recorded
from kernel.core import wall
from kernel.core.events import DecidedWithoutJournal, Draft
from kernel.journal.opening import open_journal
from kernel.journal.spool import Spool, SpoolForeign, SpoolRow
from tests.failmode.kernels import Desk, declare, fail_mode_kernel, lookup
from tests.support import ROOT
from tests.support.postgres import PostgresServer

WORKER = Path(__file__).with_name("outage_worker.py")


async def without_journal(kernel: Kernel) -> list[DecidedWithoutJournal]:
    events = await kernel.journal.read(types=["DecidedWithoutJournal"])
    return [e.payload for e in events if isinstance(e.payload, DecidedWithoutJournal)]


def worker(url: str, spool: str, count: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, str(WORKER), url, spool, str(count)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, env=env)


def line(stream: IO[bytes]) -> str:
    return stream.readline().decode().strip()


async def test_a_kernel_killed_in_the_outage_has_its_spool_drained_once_after_a_restart(
    pg: PostgresServer, tmp_path: Path
) -> None:
    url, spool = pg.new_url(), str(tmp_path / "spool.db")
    proc = worker(url, spool, 4)
    assert proc.stdout is not None
    try:
        with anyio.fail_after(120):
            assert await anyio.to_thread.run_sync(line, proc.stdout) == "ready"
            await anyio.to_thread.run_sync(pg.stop, "immediate")
            answers = []
            while (got := await anyio.to_thread.run_sync(line, proc.stdout)) != "spooled":
                assert got, "the worker ended before spooling"
                answers.append(json.loads(got))
            assert await anyio.to_thread.run_sync(proc.wait) == -9
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    assert [a["verdict"] for a in answers] == ["ALLOWED_WITHOUT_JOURNAL", "REFUSED"] * 2
    await anyio.to_thread.run_sync(pg.start)
    with anyio.fail_after(120):
        for restart in range(2):  # a second restart appends nothing again
            async with fail_mode_kernel(url, spool, Desk(), seed=33 + restart) as kernel:
                after = await lookup(kernel)
                assert after.verdict is DecisionVerdict.EXECUTED
                records = await without_journal(kernel)
                assert [r.dfid for r in records] == [a["dfid"] for a in answers]
                assert [r.allowed for r in records] == [True, False, True, False]
                ids = [r.spool_id for r in records]
                assert ids == sorted(set(ids))


async def test_a_drain_cut_between_its_append_and_its_mark_appends_nothing_twice(
    pg: PostgresServer, tmp_path: Path
) -> None:
    url, path = pg.new_url(), str(tmp_path / "spool.db")
    with anyio.fail_after(120):
        async with fail_mode_kernel(url, path, Desk()) as kernel:
            await declare(kernel, "open")
            journal_id = kernel.journal.journal_id
        spool = Spool(path, journal_id)
        kept = [
            DecidedWithoutJournal(
                spool_id=0, decided_ns=i, dfid=f"dfid-{i}", agent_id="clerk", kind="fm.lookup"
            )
            for i in range(3)
        ]
        rows = [SpoolRow(spool.add(k.dfid, msgspec.json.encode(k)), k.dfid, b"") for k in kept]
        spool.close()
        async with open_journal(url) as journal:
            # What the killed kernel appended before it could mark row 1 drained.
            first = msgspec.structs.replace(kept[0], spool_id=rows[0].id)
            await journal.append([Draft(payload=first)])
        async with fail_mode_kernel(url, path, Desk(), seed=10) as kernel:
            assert (await lookup(kernel)).verdict is DecisionVerdict.EXECUTED
            records = await without_journal(kernel)
    assert [(r.spool_id, r.dfid) for r in records] == [(row.id, row.dfid) for row in rows]


async def test_a_corrupt_spool_row_is_refused_on_record_and_the_drain_goes_on(
    pg: PostgresServer, tmp_path: Path
) -> None:
    url, path = pg.new_url(), str(tmp_path / "spool.db")
    with anyio.fail_after(120):
        async with fail_mode_kernel(url, path, Desk()) as kernel:
            journal_id = kernel.journal.journal_id
        spool = Spool(path, journal_id)
        good = DecidedWithoutJournal(
            spool_id=0, decided_ns=1, dfid="d-ok", agent_id="clerk", kind="fm.lookup", allowed=True
        )
        spool.add("d-bad", b"\xff not a record")
        spool.add("d-ok", msgspec.json.encode(good))
        spool.close()
        async with fail_mode_kernel(url, path, Desk(), seed=12) as kernel:
            assert (await lookup(kernel)).verdict is DecisionVerdict.EXECUTED
            bad, ok = await without_journal(kernel)
    assert (bad.dfid, bad.allowed, bad.reason_code) == ("d-bad", False, "GOVERNANCE_UNAVAILABLE")
    assert "could not be read" in bad.detail
    assert (ok.dfid, ok.allowed, ok.kind) == ("d-ok", True, "fm.lookup")


def test_a_spool_of_another_journal_is_refused(tmp_path: Path) -> None:
    Spool(tmp_path / "s.db", "journal-a").close()
    try:
        Spool(tmp_path / "s.db", "journal-b")
    except SpoolForeign as exc:
        assert "journal-a" in str(exc)
    else:
        raise AssertionError("a foreign spool was opened")


_records = st.builds(
    DecidedWithoutJournal,
    spool_id=st.integers(0, 10),
    decided_ns=st.integers(0, 2**62),
    dfid=st.text(max_size=40),
    agent_id=st.text(max_size=300),
    kind=st.text(max_size=300),
    allowed=st.booleans(),
    detail=st.text(max_size=2000),
)
_bodies = st.one_of(
    _records.map(lambda r: ("record", r)),
    st.binary(max_size=200).map(lambda b: ("bytes", b)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_bodies, max_size=12), st.data())
def test_every_spool_row_becomes_one_event_in_order_whatever_it_holds(
    contents: list[tuple[str, object]], data: st.DataObject
) -> None:
    rows: list[tuple[SpoolRow, DecidedWithoutJournal | None]] = []
    for row_id, (what, value) in enumerate(contents, start=1):
        if what == "record":
            assert isinstance(value, DecidedWithoutJournal)
            dfid = value.dfid if data.draw(st.booleans()) else value.dfid + "x"
            rows.append((SpoolRow(row_id, dfid, msgspec.json.encode(value)), value))
        else:
            assert isinstance(value, bytes)
            rows.append((SpoolRow(row_id, "d", value), None))
    events = [recorded(row) for row, _ in rows]
    assert [e.spool_id for e in events] == [row.id for row, _ in rows]
    for event, (row, kept) in zip(events, rows, strict=True):
        msgspec.json.encode(event)  # always recordable
        assert len(event.detail) <= 1000 and len(event.agent_id) <= 128
        if kept is not None and kept.dfid == row.dfid:
            assert (event.dfid, event.allowed, event.kind) == (
                kept.dfid,
                kept.allowed,
                wall.clip(kept.kind, 128),
            )
        elif kept is not None or event.detail.startswith("spool row"):
            assert not event.allowed
            assert event.reason_code == ReasonCode.GOVERNANCE_UNAVAILABLE
