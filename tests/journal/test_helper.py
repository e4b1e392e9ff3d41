"""The helper process that reads and checks a long read's rows (kernel.journal._helper).

A replay or a verify through a helper must be indistinguishable from one in process:
the same events, the same reports, the same refusal in the same words at the same seq,
and a helper that dies costs nothing but the time. The sizes are lowered here so that a
golden journal (500 events, opened since: a head record and a tree) takes a helper, with
its first 40 events read in process while it starts, as a long read's first 5,000 are.
"""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from kernel.audit.verification import verify_all
from kernel.core.events import Draft, Event, TriggerFired
from kernel.core.ports import ManualClock
from kernel.journal import _helper, _scans, verify
from kernel.journal.codec import BodyPacker, unpack
from kernel.journal.opening import open_journal
from kernel.journal.store import JournalCorrupt
from kernel.state.projections import Projections
from tests.support import GOLDEN


@pytest.fixture
async def trading(tmp_path: Path) -> Path:
    path = tmp_path / "trading.db"
    shutil.copy(GOLDEN / "trading.db", path)
    # Opened for writing since: a head record (what bounds a verify's helper) and a tree.
    async with open_journal(path, clock=ManualClock()) as journal:
        await journal.append([Draft(payload=TriggerFired(topic="t", facts={"x": 1}))])
    return path


def helper_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIRK_HELPER", "on")  # whatever the machine's load
    monkeypatch.setattr(_helper, "HELPER_EVENTS", 1)
    monkeypatch.setattr(_scans, "HEAD_START", 40)
    monkeypatch.setattr(verify, "READ_BATCH", 40)


def helper_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_helper, "HELPER_EVENTS", 10**12)


async def scanned(path: Path, start: int = 1) -> tuple[list[Event], str, int | None]:
    """Every event a fold's scan yields from ``start``, and the refusal it ended with."""
    events: list[Event] = []
    async with open_journal(path, readonly=True) as journal:
        try:
            async for batch in journal.scan(start, hashes=False):
                events += batch
        except JournalCorrupt as exc:
            return events, str(exc), exc.seq
    return events, "", None


def damage(path: Path, seq: int, how: str) -> None:
    with closing(sqlite3.connect(path)) as db, db:
        (body,) = db.execute("SELECT body FROM events WHERE seq = ?", (seq,)).fetchone()
        if how == "body":
            body = unpack(body).replace(b'"seq":', b'"seq": ', 1)
        elif how == "packed":
            body = BodyPacker().pack(unpack(body))[:-2]
        elif how == "gone":
            db.execute("DELETE FROM events WHERE seq = ?", (seq,))
            return
        db.execute("UPDATE events SET body = ? WHERE seq = ?", (body, seq))


@pytest.mark.parametrize("start", [1, 3, 200])
async def test_a_scan_through_a_helper_yields_what_one_in_process_does(
    trading: Path, monkeypatch: pytest.MonkeyPatch, start: int
) -> None:
    helper_off(monkeypatch)
    alone = await scanned(trading, start)
    helper_on(monkeypatch)
    helped = await scanned(trading, start)
    assert helped == alone
    assert alone[1] == "" and alone[0][-1].seq == 501

    # The state folded from either: the same digest (replay equals the live fold's tests).
    digests = set()
    for events in (alone[0], helped[0]):
        projections = Projections()
        projections.apply(events)
        digests.add(projections.digest())
    assert len(digests) == 1


@pytest.mark.parametrize(
    ("seq", "how"),
    [(20, "body"), (41, "body"), (300, "body"), (300, "packed"), (301, "gone"), (499, "gone")],
)
async def test_a_damaged_row_is_refused_in_the_same_words_at_the_same_seq(
    trading: Path, monkeypatch: pytest.MonkeyPatch, seq: int, how: str
) -> None:
    # Before the helper's start (read in process), at it, and in its part of the read.
    helper_off(monkeypatch)
    sound = (await scanned(trading))[0]
    damage(trading, seq, how)
    alone = await scanned(trading)
    verified_alone = await verify_all(trading)
    helper_on(monkeypatch)
    helped = await scanned(trading)
    verified = await verify_all(trading)
    # The same refusal; before it, events a page may have handed out already (where the
    # pages end is the read's own: in process too, every 5,000 events).
    assert helped[1:] == alone[1:]
    assert helped[0] == sound[: len(helped[0])] and len(alone[0]) <= len(helped[0])
    assert alone[2] == seq and alone[1]
    assert all(event.seq < seq for event in helped[0])
    # The chain's report; the projections' means nothing beside a bad chain (and how far
    # the fold got before it is where a batch ended: 40 events here, 5,000 in process).
    assert verified[0] == verified_alone[0]
    assert not verified[0].ok and verified[0].first_bad_seq == seq


async def test_verify_through_a_helper_gives_the_same_reports(
    trading: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    helper_off(monkeypatch)
    alone = await verify_all(trading)
    helper_on(monkeypatch)
    helped = await verify_all(trading)
    assert helped == alone
    chain, replayed = helped
    assert chain.ok and chain.events == 501 and chain.tree_stored and chain.head_record
    assert replayed is not None and replayed.ok


async def test_a_helper_that_dies_costs_only_time(
    trading: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    helper_off(monkeypatch)
    scan_alone, verified_alone = await scanned(trading), await verify_all(trading)
    helper_on(monkeypatch)
    # A helper killed after its first frames, and one that never starts its work.
    for boot in (
        "import os, sys; sys.stdout.buffer.write(b'B' + bytes(8)); sys.stdout.flush(); os._exit(9)",
        "import sys; sys.exit(3)",
    ):
        monkeypatch.setattr(_helper, "_BOOT", boot)
        assert await scanned(trading) == scan_alone
        assert await verify_all(trading) == verified_alone


def test_a_helper_is_used_for_long_reads_of_sqlite_files_unless_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DIRK_HELPER", "on")
    assert _helper.helps(_helper.HELPER_EVENTS, "j.db")
    assert not _helper.helps(_helper.HELPER_EVENTS - 1, "j.db")
    assert not _helper.helps(10**9, "postgresql://u@h/d")
    monkeypatch.setenv("DIRK_HELPER", "off")
    assert not _helper.helps(10**9, "j.db")
