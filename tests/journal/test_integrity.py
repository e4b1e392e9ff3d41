"""The chain anchored and optionally keyed: truncation, forgery and corruption are caught.

Each attack is done the way someone who can write the journal file would do it:
with sqlite3 on a copy of a journal a real kernel wrote, recomputing hashes
where that is possible without the key.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel import FlowStatus, KernelShutdown, StopReason
from kernel.audit import open_journal
from kernel.cli import main
from kernel.core.events import (
    Draft,
    Event,
    HumanDecided,
    KernelStarted,
    KernelStopped,
    ProposalAccepted,
    canonical,
    chain,
    event_type,
    stamp,
)
from kernel.core.reasons import ExitCode
from kernel.journal.codec import unpack
from kernel.journal.head import CHAIN_KEY_ENV
from kernel.journal.store import JournalCorrupt, JournalKeyError
from kernel.journal.tree import TreeBuilder
from kernel.journal.verify import parse_anchor, verify_journal
from kernel.state.snapshots import restore
from kernel.testing import action_of
from tests.support import GOLDEN
from tests.support.bodies import readable_bytes
from tests.support.helpers import ScriptedAgent, flow_of, kernel_for, transfer

KEY = b"0123456789abcdef-test-chain-key"


async def record(path: Path, **kw: Any) -> str:
    """Run a kernel that closes one flow and leaves one escalated; return the escalated DFID."""
    async with kernel_for(path, allow=("clerk", "auditor"), **kw) as kernel:
        await kernel.register(ScriptedAgent("clerk", [transfer(250)], subscriptions=["bank"]))
        await kernel.register(
            ScriptedAgent("auditor", [transfer(9_000, confidence=0.2)], subscriptions=["audit"])
        )
        await kernel.trigger("bank.invoice")
        [escalated] = await kernel.trigger("audit.check")
        await kernel.wait_quiet()
        assert flow_of(kernel, escalated).status == FlowStatus.ESCALATED
    return escalated


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("plain") / "j.db"
    return path, anyio.run(record, path)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("keyed") / "j.db"
    return path, anyio.run(lambda: record(path, chain_key=KEY))


def copy(src: Path, dest: Path) -> Path:
    """Copy a journal (with whatever its WAL holds) into one standalone file."""
    with closing(sqlite3.connect(src)) as a, closing(sqlite3.connect(dest)) as b:
        a.backup(b)
    return dest


@pytest.fixture
def plain(recorded: tuple[Path, str], tmp_path: Path) -> Path:
    return copy(recorded[0], tmp_path / "plain.db")


def last_seq(path: Path) -> int:
    with closing(sqlite3.connect(path)) as db:
        ((seq,),) = db.execute("SELECT max(seq) FROM events")
    return int(seq)


def head_record(path: Path) -> str:
    with closing(sqlite3.connect(path)) as db:
        ((value,),) = db.execute("SELECT value FROM meta WHERE key = 'head'")
    return str(value)


def set_head(path: Path, seq: int) -> None:
    """Forge the head record to name event ``seq``, as a careful attacker would.

    The attacker also drops the Merkle tree (it would name the removed or forged events),
    making the journal look like one from before trees: only a signed checkpoint kept
    elsewhere tells (tests/proofs).
    """
    with closing(sqlite3.connect(path)) as db, db:
        ((hash_,),) = db.execute("SELECT hash FROM events WHERE seq = ?", (seq,))
        db.execute("UPDATE meta SET value = ? WHERE key = 'head'", (f"{seq} {hash_.hex()}",))
        db.execute("DELETE FROM tree_nodes")
        db.execute("DELETE FROM meta WHERE key = 'tree'")


def truncate(path: Path, keep: int) -> None:
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("DELETE FROM events WHERE seq > ?", (keep,))


def forge_approval(path: Path, dfid: str, *, update_head: bool) -> int:
    """Append an approval by a made-up operator and an acceptance, hashes recomputed (SHA-256).

    Returns the seq of the first forged event.
    """
    with closing(sqlite3.connect(path)) as db, db:
        ((seq, prev),) = db.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1")
        first: int = seq + 1
        ts = 10**18
        for payload in (
            HumanDecided(decision="approve", operator="mallory", reason="looks fine"),
            ProposalAccepted(attempt=1, by_human=True),
        ):
            seq += 1
            event_body = canonical(stamp(Draft(payload=payload, dfid=dfid), seq, ts))
            prev = chain(prev, event_body)
            db.execute(
                "INSERT INTO events (seq, type, dfid, body, hash) VALUES (?, ?, ?, ?, ?)",
                (seq, event_type(payload), dfid, event_body, prev),
            )
        if update_head:
            db.execute("UPDATE meta SET value = ? WHERE key = 'head'", (f"{seq} {prev.hex()}",))
            # Every hash recomputed: the Merkle tree's stored nodes too (a tile the forged
            # rows complete would betray them).
            builder = TreeBuilder()
            for (stored,) in db.execute("SELECT body FROM events ORDER BY seq"):
                builder.add(unpack(stored))
            db.execute("DELETE FROM tree_nodes")
            db.executemany(
                "INSERT INTO tree_nodes (level, idx, hash) VALUES (?, ?, ?)", builder.nodes
            )
    return first


def edit_middle(path: Path) -> int:
    """Change one byte of meaning in an event in the middle; return its seq."""
    with closing(sqlite3.connect(path)) as db, db:
        ((seq, body),) = db.execute(
            "SELECT seq, body FROM events WHERE type = 'ProposalSubmitted' ORDER BY seq LIMIT 1"
        )
        # Written back as plain JSON, which a journal of compressed bodies reads too.
        edited = unpack(body).replace(b'"amount_cents":250', b'"amount_cents":251', 1)
        assert edited != unpack(body)
        db.execute("UPDATE events SET body = ? WHERE seq = ?", (edited, seq))
    return int(seq)


async def reopen(path: Path, **kw: Any) -> None:
    async with kernel_for(path, allow=("clerk", "auditor"), **kw):
        pass


def verify_cli(path: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run ``dirk verify`` in-process; return its status and stdout (stderr must stay empty)."""
    status = main(["verify", "--db", str(path), *args])
    out, err = capsys.readouterr()
    assert err == "", err
    return status, out


# --- the head record: a removed tail ---------------------------------------------------


async def test_a_truncated_tail_fails_open_and_verify_with_the_seq_where_it_ends(
    plain: Path,
) -> None:
    end = last_seq(plain)
    truncate(plain, end - 3)

    report = await verify_journal(plain)
    assert not report.ok
    assert report.first_bad_seq == end - 2
    assert f"ends at event {end - 3}" in report.problem and "removed" in report.problem
    with pytest.raises(JournalCorrupt) as caught:
        await reopen(plain)
    assert caught.value.seq == end - 2
    assert f"ends at event {end - 3}" in str(caught.value)


async def test_every_append_moves_the_head_record_in_its_own_transaction(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    await record(path)
    seq, hash_ = head_record(path).split()
    assert int(seq) == last_seq(path)
    with closing(sqlite3.connect(path)) as db:
        ((last,),) = db.execute("SELECT hash FROM events WHERE seq = ?", (int(seq),))
    assert last.hex() == hash_


# --- forged rows, unkeyed and keyed -----------------------------------------------------


async def test_forged_rows_without_the_head_record_fail_verify_and_open(
    recorded: tuple[Path, str], plain: Path
) -> None:
    first = forge_approval(plain, recorded[1], update_head=False)

    report = await verify_journal(plain)
    assert (report.ok, report.first_bad_seq) == (False, first)
    assert "not appended by a kernel" in report.problem
    with pytest.raises(JournalCorrupt) as caught:
        await reopen(plain)
    assert caught.value.seq == first


async def test_an_unkeyed_chain_cannot_tell_forged_rows_with_a_forged_head_record(
    recorded: tuple[Path, str], plain: Path
) -> None:
    # The documented limit (docs/integrity.md): without a key or an anchor kept
    # elsewhere, a writer who recomputes every hash is indistinguishable.
    anchor = parse_anchor((await verify_journal(plain)).anchor().line())
    forge_approval(plain, recorded[1], update_head=True)

    assert (await verify_journal(plain)).ok
    # The anchored event is still there: appending removes nothing.
    assert (await verify_journal(plain, anchor=anchor)).ok


async def test_a_keyed_chain_catches_a_forged_row_even_with_a_forged_head_record(
    keyed: tuple[Path, str], tmp_path: Path
) -> None:
    path = copy(keyed[0], tmp_path / "keyed.db")
    assert (await verify_journal(path, chain_key=KEY)).ok
    first = forge_approval(path, keyed[1], update_head=True)

    report = await verify_journal(path, chain_key=KEY)
    assert (report.ok, report.first_bad_seq) == (False, first)
    assert "does not match its hash" in report.problem
    with pytest.raises(JournalCorrupt) as caught:
        await reopen(path, chain_key=KEY)
    # Opening checks the last event first, so it may name the second forged row.
    assert caught.value.seq in (first, first + 1)


async def test_a_keyed_chain_catches_a_forged_row_in_the_middle_on_open(
    keyed: tuple[Path, str], tmp_path: Path
) -> None:
    path = copy(keyed[0], tmp_path / "keyed.db")
    seq = edit_middle(path)
    with closing(sqlite3.connect(path)) as db, db:
        # Recompute every hash from the edit on, as someone without the key can.
        rows = list(db.execute("SELECT seq, body FROM events WHERE seq >= ? ORDER BY seq", (seq,)))
        ((prev,),) = db.execute("SELECT hash FROM events WHERE seq = ?", (seq - 1,))
        for row_seq, body in rows:
            prev = chain(prev, unpack(body))
            db.execute("UPDATE events SET hash = ? WHERE seq = ?", (prev, row_seq))
    set_head(path, last_seq(path))

    assert (await verify_journal(path, chain_key=KEY)).first_bad_seq == seq
    with pytest.raises(JournalCorrupt) as caught:
        await reopen(path, chain_key=KEY)
    assert caught.value.seq is not None and caught.value.seq >= seq


async def test_a_keyed_head_record_cannot_be_made_from_an_earlier_row(
    keyed: tuple[Path, str], tmp_path: Path
) -> None:
    path = copy(keyed[0], tmp_path / "keyed.db")
    end = last_seq(path)
    truncate(path, end - 3)
    set_head(path, end - 3)  # the row's own (keyed) hash, but no MAC only the key can make

    report = await verify_journal(path, chain_key=KEY)
    assert (report.ok, report.first_bad_seq) == (False, end - 3)
    assert "head record" in report.problem
    with pytest.raises(JournalCorrupt) as caught:
        await reopen(path, chain_key=KEY)
    assert caught.value.seq == end - 3


# --- a journal a kernel is appending to ---------------------------------------------------


async def test_verify_sees_rows_and_head_record_of_one_moment(
    recorded: tuple[Path, str], plain: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kernel.journal.verify
    from kernel.journal.sealing import check_rows

    commits: list[int] = []

    def commit_midway(*args: Any) -> Any:
        if not commits:
            # A kernel commits (rows and head record together) while verify reads.
            commits.append(forge_approval(plain, recorded[1], update_head=True))
        return check_rows(*args)

    monkeypatch.setattr(kernel.journal.verify, "READ_BATCH", 2)
    monkeypatch.setattr(kernel.journal.verify, "check_rows", commit_midway)
    before = last_seq(plain)

    report = await verify_journal(plain)

    assert commits and last_seq(plain) == before + 2
    assert report.ok, report.problem
    assert report.events == before


async def test_a_read_only_open_sees_rows_and_head_record_of_one_moment(
    recorded: tuple[Path, str], plain: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kernel.journal._sqlite

    inspect = kernel.journal._sqlite._inspect

    async def commit_after_meta(*args: Any) -> Any:
        meta = await inspect(*args)
        forge_approval(plain, recorded[1], update_head=True)
        return meta

    monkeypatch.setattr(kernel.journal._sqlite, "_inspect", commit_after_meta)
    before = last_seq(plain)

    async with open_journal(plain, readonly=True) as journal:
        assert journal.head_seq == before


# --- opening checks the chain, not just the last two rows ----------------------------


async def test_open_kernel_refuses_a_journal_edited_in_the_middle_with_the_seq(
    plain: Path,
) -> None:
    seq = edit_middle(plain)
    assert seq < last_seq(plain) - 2

    with pytest.raises(JournalCorrupt) as caught:
        await reopen(plain)

    assert caught.value.seq == seq
    assert f"event {seq} does not match its hash" in str(caught.value)


async def test_open_kernel_is_ready_from_its_snapshot_and_stops_on_an_edit_before_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    await record(path, checkpoint_every=5)
    async with open_journal(path, readonly=True) as journal:
        snapshots = await journal.snapshot_seqs()
    assert snapshots
    # An edit before the snapshot: the kernel opens from the snapshot at once, then the
    # check of the history before it stops it, recorded (verify finds the same seq).
    seq = 2
    assert seq < snapshots[-1]
    edit_ts(path, seq)
    with pytest.raises(KernelShutdown) as stopped:
        async with kernel_for(path, allow=("clerk", "auditor")):
            with anyio.fail_after(30):
                await anyio.sleep_forever()
    assert stopped.value.reason is StopReason.HISTORY_CORRUPT
    assert f"event {seq} does not match its hash" in stopped.value.detail
    assert (await verify_journal(path)).first_bad_seq == seq
    async with open_journal(path, readonly=True) as journal:
        [last] = await journal.read(journal.head_seq)
    assert isinstance(last.payload, KernelStopped)
    assert last.payload.reason == StopReason.HISTORY_CORRUPT
    # One after it is refused at open, as before.
    async with open_journal(path, readonly=True) as journal:
        after = (await journal.snapshot_seqs())[-1] + 1
        assert after <= journal.head_seq
    edit_ts(path, after)
    with pytest.raises(JournalCorrupt) as caught:
        await reopen(path)
    assert caught.value.seq == after


# --- what is read is what was verified (trust-and-edges.md, D9) ----------------------


async def decided_journal(path: Path) -> tuple[str, int]:
    """A journal where dana approved a flow, then a snapshot after it; return (dfid, seq)."""
    async with kernel_for(path, allow=("clerk", "auditor"), checkpoint_every=5) as kernel:
        await kernel.register(
            ScriptedAgent("auditor", [transfer(9_000, confidence=0.2)], subscriptions=["audit"])
        )
        [dfid] = await kernel.trigger("audit.check")
        await kernel.wait_quiet()
        await kernel.decide(
            dfid, "approve", operator="dana", reason="ok", action_hash=action_of(kernel, dfid)
        )
        await kernel.wait_flow(dfid)
        await kernel.register(ScriptedAgent("clerk", [transfer(250)] * 4, subscriptions=["bank"]))
        for _ in range(4):  # events enough for checkpoints (and snapshots) after the decision
            [flow] = await kernel.trigger("bank.invoice")
            await kernel.wait_flow(flow)
        [decided] = await kernel.journal.read(dfid=dfid, types=["HumanDecided"])
    async with open_journal(path, readonly=True) as journal:
        assert (await journal.snapshot_seqs())[-1] > decided.seq
    return dfid, decided.seq


def dana_to_mallory(path: Path, seq: int) -> None:
    """D9's edit: the approver's name in the body, as plain JSON, hash left as it was."""
    with closing(sqlite3.connect(path)) as db, db:
        ((body,),) = db.execute("SELECT body FROM events WHERE seq = ?", (seq,))
        edited = unpack(body).replace(b'"operator":"dana"', b'"operator":"mallory"', 1)
        assert edited != unpack(body)
        db.execute("UPDATE events SET body = ? WHERE seq = ?", (edited, seq))


async def test_an_edit_before_the_snapshot_is_never_read_back(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    dfid, seq = await decided_journal(path)
    dana_to_mallory(path, seq)
    # Every read path of a journal opened as a kernel opens it (from its snapshot).
    async with open_journal(path, readonly=True) as journal:
        await restore(journal)
        for read in (
            lambda: journal.read(seq, seq + 1),
            lambda: journal.read(types=["HumanDecided"]),
            lambda: journal.flow_events(dfid),
            lambda: anext(journal.scan(seq)),
            lambda: anext(journal.scan(hashes=False)),
            lambda: journal.check_history(),
        ):
            with pytest.raises(JournalCorrupt) as caught:
                await read()
            assert caught.value.seq == seq
            assert "does not match its hash" in str(caught.value)
        # The checked tail is still read: only what does not check is refused.
        [tail] = await journal.read(journal.head_seq)
        assert tail.seq == journal.head_seq


async def test_a_kernel_never_serves_the_edited_event_and_stops_with_the_corruption(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    dfid, seq = await decided_journal(path)
    dana_to_mallory(path, seq)
    seen: list[JournalCorrupt] = []
    with pytest.raises(KernelShutdown) as stopped:
        async with kernel_for(path, allow=("clerk", "auditor")) as kernel:
            # Ready at once from its snapshot; the edited event is never served.
            assert kernel.stopped is None or kernel.stopped.reason is StopReason.HISTORY_CORRUPT
            reads: tuple[Callable[[], Awaitable[list[Event]]], ...] = (
                lambda: kernel.journal.read(seq, seq + 1),
                lambda: kernel.journal.flow_events(dfid),
            )
            for read in reads:
                try:
                    served = await read()
                except JournalCorrupt as exc:
                    seen.append(exc)
                else:
                    pytest.fail(f"the kernel served {served}")
            with anyio.fail_after(30):
                await anyio.sleep_forever()
    assert stopped.value.reason is StopReason.HISTORY_CORRUPT
    assert all(exc.seq == seq for exc in seen)


def test_dirk_show_reports_the_corruption_instead_of_the_edited_event(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "j.db"
    dfid, seq = anyio.run(decided_journal, path)
    dana_to_mallory(path, seq)
    for command in (["show", dfid], ["show", dfid, "--json"], ["review", dfid], ["flows"]):
        status = main([*command, "--db", str(path)])
        out, err = capsys.readouterr()
        assert status == ExitCode.USAGE, (command, out)
        assert "mallory" not in out
        assert err.startswith("error: JOURNAL_CORRUPT: ") and f"event {seq}" in err, err


def edit_ts(path: Path, seq: int) -> None:
    with closing(sqlite3.connect(path)) as db, db:
        ((body,),) = db.execute("SELECT body FROM events WHERE seq = ?", (seq,))
        db.execute(
            "UPDATE events SET body = ? WHERE seq = ?",
            (unpack(body).replace(b'"ts":', b'"ts":1', 1), seq),
        )


# --- the chain key ------------------------------------------------------------------------


async def test_a_keyed_journal_records_a_key_id_and_never_the_key(
    keyed: tuple[Path, str], tmp_path: Path
) -> None:
    path = copy(keyed[0], tmp_path / "keyed.db")
    with closing(sqlite3.connect(path)) as db:
        meta = dict(db.execute("SELECT key, value FROM meta"))
    assert meta["chain"] == "hmac-sha256"
    assert len(meta["chain_key_id"]) == 16
    assert KEY not in readable_bytes(path)
    assert KEY.hex().encode() not in readable_bytes(path)


@pytest.mark.parametrize("given", ["no key", "a wrong key"])
async def test_a_keyed_journal_refuses_to_open_without_its_key(
    keyed: tuple[Path, str], tmp_path: Path, given: str
) -> None:
    path = copy(keyed[0], tmp_path / "keyed.db")
    key = None if given == "no key" else b"another key of enough bytes"

    with pytest.raises(JournalKeyError) as caught:
        await reopen(path, chain_key=key)

    assert "key id" in str(caught.value)
    assert KEY.decode() not in str(caught.value)
    report = await verify_journal(path, chain_key=key)
    assert not report.ok and "key" in report.problem and report.first_bad_seq is None


async def test_a_key_cannot_be_added_to_a_journal_that_has_events(plain: Path) -> None:
    with pytest.raises(JournalKeyError, match="not keyed"):
        await reopen(plain, chain_key=KEY)
    assert not (await verify_journal(plain, chain_key=KEY)).ok


async def test_open_kernel_takes_the_key_from_the_environment(
    keyed: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = copy(keyed[0], tmp_path / "keyed.db")
    monkeypatch.setenv(CHAIN_KEY_ENV, KEY.decode())
    await reopen(path)
    assert (await verify_journal(path, chain_key=KEY)).ok


async def test_a_short_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(JournalKeyError, match="16 bytes"):
        await reopen(tmp_path / "j.db", chain_key=b"short")


def test_dirk_verify_and_anchor_take_the_key_from_the_environment_or_a_file(
    keyed: tuple[Path, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = copy(keyed[0], tmp_path / "keyed.db")
    status, out = verify_cli(path, capsys=capsys)
    assert status == 1 and out.count("\n") == 1 and "DIRK_CHAIN_KEY" in out

    key_file = tmp_path / "key"
    key_file.write_bytes(KEY + b"\n")
    assert verify_cli(path, "--key-file", str(key_file), capsys=capsys)[0] == 0
    monkeypatch.setenv(CHAIN_KEY_ENV, KEY.decode())
    assert verify_cli(path, capsys=capsys)[0] == 0
    assert main(["anchor", "--db", str(path)]) == 0
    assert capsys.readouterr().out.startswith("dirk-anchor v1 ")


# --- anchors ------------------------------------------------------------------------------


def test_an_anchor_round_trips_through_dirk(
    plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["anchor", "--db", str(plain)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("dirk-anchor v1 journal=") and f" seq={last_seq(plain)} " in line
    anchor_file = tmp_path / "anchor.txt"
    anchor_file.write_text(f"# kept off the journal's machine\n{line}\n")

    for argument in (line, str(anchor_file)):
        status, out = verify_cli(plain, "--anchor", argument, capsys=capsys)
        assert status == 0, out
        assert f"anchor ok: event {last_seq(plain)}" in out


def test_an_anchor_catches_a_tail_removed_behind_a_forged_head_record(
    plain: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["anchor", "--db", str(plain)])
    line = capsys.readouterr().out.strip()
    end = last_seq(plain)
    truncate(plain, end - 3)
    set_head(plain, end - 3)
    assert verify_cli(plain, capsys=capsys)[0] == 0  # without the anchor: undetectable

    status, out = verify_cli(plain, "--anchor", line, capsys=capsys)

    assert status == 1
    assert out == (
        f"verify: FAILED at seq {end - 2}: the journal ends at event {end - 3},"
        f" before the anchored event {end}: its tail was removed\n"
    )


def test_an_anchor_catches_a_rewritten_journal(
    plain: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["anchor", "--db", str(plain)])
    line = capsys.readouterr().out.strip()
    end = last_seq(plain)
    with closing(sqlite3.connect(plain)) as db, db:
        ((body, prev),) = db.execute(
            "SELECT e.body, p.hash FROM events e JOIN events p ON p.seq = e.seq - 1"
            " WHERE e.seq = ?",
            (end,),
        )
        body = unpack(body).replace(b'"ts":', b'"ts":1', 1)
        db.execute(
            "UPDATE events SET body = ?, hash = ? WHERE seq = ?", (body, chain(prev, body), end)
        )
    set_head(plain, end)
    assert verify_cli(plain, capsys=capsys)[0] == 0

    status, out = verify_cli(plain, "--anchor", line, capsys=capsys)

    assert status == 1
    assert out.startswith(f"verify: FAILED at seq {end}: event {end} is not the anchored one")


def test_an_anchor_of_another_journal_fails(
    plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.db"
    anyio.run(record, other)
    main(["anchor", "--db", str(other)])
    line = capsys.readouterr().out.strip()

    status, out = verify_cli(plain, "--anchor", line, capsys=capsys)

    assert status == 1 and "the anchor is of journal" in out


def test_a_malformed_anchor_is_a_bad_argument(
    plain: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", "--db", str(plain), "--anchor", "dirk-anchor v1 seq=1"]) == 2
    assert capsys.readouterr().err.startswith("error: BAD_ARGUMENT: --anchor: not an anchor")


# --- KernelStarted and KernelStopped carry the head ----------------------------------


async def test_kernel_started_and_stopped_record_the_head(plain: Path) -> None:
    before = last_seq(plain)
    await reopen(plain)
    async with open_journal(plain, readonly=True) as journal:
        events = await journal.read(before - 1)
        started = [e for e in events if isinstance(e.payload, KernelStarted)]
        stopped = [e for e in events if isinstance(e.payload, KernelStopped)]
    assert [e.seq for e in stopped] == [before, journal.head_seq]
    [start] = started
    assert isinstance(start.payload, KernelStarted)
    assert (start.payload.head_seq, start.payload.head_hash) == (before, start.prev_hash)
    stop = stopped[-1]
    assert isinstance(stop.payload, KernelStopped)
    assert (stop.payload.head_seq, stop.payload.head_hash) == (stop.seq - 1, stop.prev_hash)


# --- old journals, without a head record -----------------------------------------------


@pytest.mark.parametrize("name", ["trading", "booking"])
async def test_a_journal_from_before_head_records_verifies_and_gets_one_when_written(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / f"{name}.db"
    shutil.copyfile(GOLDEN / f"{name}.db", db)
    report = await verify_journal(db)
    assert report.ok and not report.head_record

    async with open_journal(db) as journal:
        await journal.check_chain()
        await journal.append([Draft(payload=KernelStopped(reason="TEST"))])
    report = await verify_journal(db)
    assert report.ok and report.head_record
    assert head_record(db) == f"{report.events} {report.head}"


async def test_removing_the_head_record_of_a_journal_a_kernel_wrote_is_caught(
    plain: Path,
) -> None:
    with closing(sqlite3.connect(plain)) as db, db:
        db.execute("DELETE FROM meta WHERE key = 'head'")
    report = await verify_journal(plain)
    assert not report.ok and "head record was removed" in report.problem


# --- verify never raises ------------------------------------------------------------------


def test_a_byte_that_makes_invalid_utf8_is_one_failed_line(
    plain: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with closing(sqlite3.connect(plain)) as db, db:
        ((seq, body),) = db.execute(
            "SELECT seq, body FROM events WHERE type = 'ProposalSubmitted' ORDER BY seq LIMIT 1"
        )
        body = unpack(body)
        at = body.index(b'"test.transfer"') + 1
        db.execute(
            "UPDATE events SET body = ? WHERE seq = ?", (body[:at] + b"\xff" + body[at + 1 :], seq)
        )

    status, out = verify_cli(plain, capsys=capsys)

    assert status == 1
    assert out.startswith(f"verify: FAILED at seq {seq}: event {seq} does not decode")
    assert out.count("\n") == 1


class Image(bytes):
    """A journal file's bytes, shown short in a failing example's report."""

    def __repr__(self) -> str:
        return f"<journal image of {len(self)} bytes>"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Image:
    """The bytes of a small journal, with checkpoints and snapshots, in one file."""
    tmp = tmp_path_factory.mktemp("small")
    anyio.run(lambda: record(tmp / "live.db", checkpoint_every=8))
    return Image(copy(tmp / "live.db", tmp / "small.db").read_bytes())


@pytest.fixture(scope="module")
def corrupt_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("corrupt")


# Each flip: (where, which byte to xor in, whether to aim at a byte that holds something).
FLIPS = st.lists(
    st.tuples(st.integers(0, 2**31), st.integers(1, 255), st.booleans()), min_size=1, max_size=4
)


@settings(
    max_examples=120,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(flips=FLIPS)
def test_any_corruption_is_ok_or_one_failed_line_never_a_traceback(
    small: Image,
    corrupt_dir: Path,
    capsys: pytest.CaptureFixture[str],
    flips: list[tuple[int, int, bool]],
) -> None:
    # Half the flips land on bytes that hold something: most of a small file is free space.
    used = [offset for offset, byte in enumerate(small) if byte]
    corrupted = bytearray(small)
    for where, xor, aimed in flips:
        corrupted[used[where % len(used)] if aimed else where % len(small)] ^= xor
    path = corrupt_dir / "j.db"
    for stale in corrupt_dir.iterdir():
        stale.unlink()
    path.write_bytes(bytes(corrupted))

    status = main(["verify", "--db", str(path)])

    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    if status == 1:
        # One line per failure (replay may find several), each saying so.
        assert lines and all(line.startswith("verify: FAILED") for line in lines), out
    else:
        assert status == 0, out
        assert lines[-1].startswith("verify: ok events=")


# --- a closed pipe ------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["flows"], ["anchor"], ["verify"]])
def test_a_closed_pipe_ends_a_command_quietly(plain: Path, command: list[str]) -> None:
    read_end, write_end = os.pipe()
    # The reader is gone before the command writes a byte, as after `| head -1` has its line.
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "kernel", *command, "--db", str(plain)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == 141


def test_dirk_flows_into_head_prints_one_line_and_no_traceback(plain: Path) -> None:
    result = subprocess.run(
        f'"{sys.executable}" -m kernel flows --db "{plain}" | head -1',
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.stderr == ""
    assert result.stdout.startswith("DFID")
    assert result.stdout.count("\n") == 1
