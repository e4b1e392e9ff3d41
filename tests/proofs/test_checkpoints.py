"""Signed checkpoints: what a kernel signs, and what ``dirk verify --public-key`` catches.

Each attack is made as whoever can write the journal file but does not hold the
checkpoint key would make it: with sqlite3 on a copy of a journal a real kernel wrote,
recomputing every hash, the head record and the tree where they can.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sqlite3
from pathlib import Path

import anyio
import msgspec
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kernel.cli import main
from kernel.core.events import CheckpointKeyChanged, Draft, TriggerFired, canonical, chain
from kernel.core.keys import KeyUnusable
from kernel.core.notes import split_note
from kernel.core.ports import ManualClock
from kernel.journal.head import head_value
from kernel.journal.opening import open_journal
from kernel.journal.verify import verify_journal
from kernel.proofs.signing import KEY_ENV, Signing
from tests.support.proofs import KeyFiles, run_flows, signing_kernel


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[KeyFiles, KeyFiles]:
    folder = tmp_path_factory.mktemp("keys")
    return KeyFiles(folder, "log"), KeyFiles(folder, "next")


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, keys: tuple[KeyFiles, KeyFiles]) -> Path:
    """A journal a signing kernel wrote: three flows, checkpoints on its clock, one at close."""
    path = tmp_path_factory.mktemp("signed") / "j.db"

    async def record() -> None:
        clock = ManualClock()
        async with signing_kernel(path, keys[0], clock=clock) as kernel:
            await run_flows(kernel, [100])
            clock.advance(1.5)
            await kernel.wait_quiet()
            await run_flows(kernel, [200, 300])

    anyio.run(record)
    return path


@pytest.fixture
def journal(signed: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "j.db"
    with (
        contextlib.closing(sqlite3.connect(signed)) as a,
        contextlib.closing(sqlite3.connect(dest)) as b,
    ):
        a.backup(b)
    return dest


def verify(path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = main(["verify", "--db", str(path), *args])
    out, err = capsys.readouterr()
    return status, out + err


def heads(path: Path) -> list[tuple[int, str]]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [
            (int(s), str(n))
            for s, n in db.execute("SELECT size, note FROM tree_heads ORDER BY size")
        ]


def last_seq(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return int(db.execute("SELECT max(seq) FROM events").fetchone()[0])


def test_a_kernel_signs_its_tree_on_its_clock_and_as_it_stops(
    journal: Path, keys: tuple[KeyFiles, KeyFiles], capsys: pytest.CaptureFixture[str]
) -> None:
    signed = heads(journal)
    assert len(signed) >= 2
    # The last one covers everything, the KernelStopped included.
    assert signed[-1][0] == last_seq(journal)
    report = anyio.run(verify_journal, journal)
    assert report.ok and report.tree_heads == signed
    status, out = verify(journal, capsys, "--public-key", str(keys[0].public))
    assert status == 0, out
    assert f"the latest covers events 1..{last_seq(journal)}" in out


def test_a_forged_append_with_everything_but_the_signing_key_fails(
    journal: Path, keys: tuple[KeyFiles, KeyFiles], capsys: pytest.CaptureFixture[str]
) -> None:
    # The forger appends an event, chained, fixes the head record and rebuilds the tree:
    # everything the file holds agrees.
    with contextlib.closing(sqlite3.connect(journal)) as db, db:
        seq, prev = db.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        draft = Draft(payload=TriggerFired(topic="forged", facts={"x": 1}))
        from kernel.core.events import stamp

        body = canonical(stamp(draft, seq + 1, 1))
        hash_ = chain(prev, body)
        db.execute(
            "INSERT INTO events VALUES (?, 'TriggerFired', NULL, ?, ?)", (seq + 1, body, hash_)
        )
        db.execute("UPDATE meta SET value = ? WHERE key = 'head'", (head_value(seq + 1, hash_),))
        db.execute("DELETE FROM tree_nodes")
        db.execute("DELETE FROM meta WHERE key = 'tree'")
    assert verify(journal, capsys)[0] == 0  # the file alone cannot tell
    status, out = verify(journal, capsys, "--public-key", str(keys[0].public))
    assert status == 1
    assert f"events {seq + 1}..{seq + 1} are not covered by any signed checkpoint" in out


def test_a_checkpoint_forged_without_the_key_or_signed_by_another_fails(
    journal: Path, keys: tuple[KeyFiles, KeyFiles], capsys: pytest.CaptureFixture[str]
) -> None:
    size, note = heads(journal)[-1]
    text, lines = split_note(note)
    forged = text + "\n" + lines[0][:-8] + "AAAAAAA=" + "\n"
    with contextlib.closing(sqlite3.connect(journal)) as db, db:
        db.execute("UPDATE tree_heads SET note = ? WHERE size = ?", (forged, size))
    status, out = verify(journal, capsys, "--public-key", str(keys[0].public))
    assert status == 1 and "does not verify" in out
    # The genuine journal against another key: no checkpoint is signed by a key given.
    status, out = verify(journal, capsys, "--public-key", str(keys[1].public))
    assert status == 1 and "not signed by a key given" in out


def test_truncation_rollback_and_a_fork_are_caught_against_a_checkpoint_kept_elsewhere(
    journal: Path,
    keys: tuple[KeyFiles, KeyFiles],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kept = tmp_path / "kept.checkpoint"
    size, note = heads(journal)[-1]
    kept.write_text(note)
    pub = str(keys[0].public)
    assert verify(journal, capsys, "--public-key", pub, "--checkpoint", str(kept))[0] == 0

    # Rolled back to an earlier genuine state: it verifies on its own, not against `kept`.
    earlier, _ = heads(journal)[0]
    rolled = tmp_path / "rolled.db"
    shutil.copyfile(journal, rolled)
    cut(rolled, earlier)
    assert verify(rolled, capsys, "--public-key", pub)[0] == 0
    status, out = verify(rolled, capsys, "--public-key", pub, "--checkpoint", str(kept))
    assert status == 1 and "truncated or rolled back" in out

    # Forked: the writer (key in hand) cuts history and grows another one past `size`.
    async def regrow() -> None:
        async with signing_kernel(rolled, keys[0]) as kernel:
            await run_flows(kernel, [700, 800, 900, 950])

    anyio.run(regrow)
    assert last_seq(rolled) > size
    assert verify(rolled, capsys, "--public-key", pub)[0] == 0
    status, out = verify(rolled, capsys, "--public-key", pub, "--checkpoint", str(kept))
    assert status == 1 and "a forked or rewritten history" in out


def cut(path: Path, keep: int) -> None:
    """Put a journal back to its first ``keep`` events, as a restore from a backup would."""
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        (hash_,) = db.execute("SELECT hash FROM events WHERE seq = ?", (keep,)).fetchone()
        db.execute("DELETE FROM events WHERE seq > ?", (keep,))
        db.execute("DELETE FROM tree_heads WHERE size > ?", (keep,))
        db.execute("DELETE FROM tree_nodes")
        db.execute("DELETE FROM meta WHERE key = 'tree'")
        db.execute("UPDATE meta SET value = ? WHERE key = 'head'", (head_value(keep, hash_),))
        db.execute("DELETE FROM snapshots WHERE seq > ?", (keep,))


def test_a_rotated_key_is_recorded_and_checkpoints_of_the_old_one_still_verify(
    journal: Path, keys: tuple[KeyFiles, KeyFiles], capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = keys

    async def rotate() -> list[object]:
        async with signing_kernel(journal, new) as kernel:
            await run_flows(kernel, [5])
        async with open_journal(journal, readonly=True) as opened:
            return [e.payload for e in await opened.read(types=["CheckpointKeyChanged"])]

    changes = anyio.run(rotate)
    assert [c.key for c in changes if isinstance(c, CheckpointKeyChanged)] == [
        old.public_text, new.public_text,
    ]  # fmt: skip
    assert isinstance(changes[-1], CheckpointKeyChanged) and changes[-1].previous == old.public_text
    keyfile = journal.parent / "both.pub"
    keyfile.write_text(old.public_text + "\n" + new.public_text + "\n")
    status, out = verify(journal, capsys, "--public-key", str(keyfile))
    assert status == 0, out
    status, out = verify(journal, capsys, "--public-key", str(new.public))
    assert status == 1 and "not signed by a key given" in out


def test_the_private_key_never_reaches_events_spans_logs_or_the_console(
    tmp_path: Path,
    keys: tuple[KeyFiles, KeyFiles],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    key = keys[0]
    raw = key.key.private_bytes_raw()
    secrets = [key.pem.encode(), raw, raw.hex().encode(), *_b64_forms(raw)]
    monkeypatch.setenv(KEY_ENV, key.pem)  # from the environment this time
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    path = tmp_path / "j.db"
    caplog.set_level(logging.DEBUG)
    from tests.support.helpers import kernel_for

    async def run() -> list[str]:
        async with kernel_for(path, signing=Signing(), tracer_provider=provider) as kernel:
            return await run_flows(kernel, [10])

    [dfid] = anyio.run(run)
    for command in (["show", dfid, "--db", str(path)], ["flows", "--db", str(path)]):
        main(command)
    main(["verify", "--db", str(path), "--public-key", str(key.public)])
    seen = capsys.readouterr()
    spans = b"".join(
        msgspec.json.encode(dict(s.attributes or {})) for s in exporter.get_finished_spans()
    )
    stored = path.read_bytes() + b"".join(p.read_bytes() for p in tmp_path.glob("j.db-*"))
    for secret in secrets:
        for where, data in {
            "journal": stored,
            "spans": spans,
            "logs": caplog.text.encode(),
            "console": (seen.out + seen.err).encode(),
        }.items():
            assert secret not in data, where
    assert heads(path), "it signed"


def _b64_forms(raw: bytes) -> list[bytes]:
    import base64

    return [base64.b64encode(raw).rstrip(b"="), base64.urlsafe_b64encode(raw).rstrip(b"=")]


async def test_a_bad_key_stops_the_open_and_names_where_it_came_from_never_what_it_holds(
    tmp_path: Path, keys: tuple[KeyFiles, KeyFiles], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.helpers import kernel_for

    loose = tmp_path / "loose.pem"
    shutil.copyfile(keys[0].private, loose)
    loose.chmod(0o644)
    with pytest.raises(KeyUnusable, match="readable by others"):
        async with kernel_for(tmp_path / "a.db", signing=Signing(key_file=str(loose))):
            pass
    monkeypatch.setenv(KEY_ENV, "-----BEGIN PRIVATE KEY-----\nnot a key\n")
    with pytest.raises(KeyUnusable) as caught:
        async with kernel_for(tmp_path / "b.db", signing=Signing()):
            pass
    assert "not a key" not in str(caught.value)


def test_a_keyed_journal_verifies_with_the_public_key_alone_and_a_forgery_still_fails(
    tmp_path: Path, keys: tuple[KeyFiles, KeyFiles], capsys: pytest.CaptureFixture[str]
) -> None:
    """D8: verifying a keyed chain needed the secret that forges it; the public key does not."""
    path = tmp_path / "keyed.db"

    async def run() -> None:
        async with signing_kernel(path, keys[0], chain_key=b"k" * 32) as kernel:
            await run_flows(kernel, [10, 20])

    anyio.run(run)
    status, out = verify(path, capsys)
    assert status == 1 and "needs its chain key" in out
    status, out = verify(path, capsys, "--public-key", str(keys[0].public))
    assert status == 0, out
    assert "checked without its key" in out and "signatures ok" in out
    # Without the chain key and without the signing key: an edited body is caught by the tree.
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        (seq, body) = db.execute(
            "SELECT seq, body FROM events WHERE type = 'TriggerFired' LIMIT 1"
        ).fetchone()
        from kernel.journal.codec import unpack

        edited = unpack(body).replace(b'"topic":"bank', b'"topic":"bonk')
        db.execute("UPDATE events SET body = ? WHERE seq = ?", (edited, seq))
    status, out = verify(path, capsys, "--public-key", str(keys[0].public))
    assert status == 1 and "FAILED" in out
