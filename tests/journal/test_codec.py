"""The stored form of event bodies: deflated with a preset dictionary, plain JSON still read."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel import FlowStatus
from kernel.cli import main
from kernel.core.events import Draft, FlowCreated, TriggerFired, canonical, chain
from kernel.core.ports import ManualClock
from kernel.core.reasons import ExitCode
from kernel.journal import codec
from kernel.journal.codec import (
    CURRENT,
    BodyPacker,
    BodyUnreadable,
    dictionary,
    unpack,
)
from kernel.journal.copy import copy_journal
from kernel.journal.opening import open_journal
from kernel.journal.store import SCHEMA_VERSION, JournalCorrupt
from kernel.journal.verify import verify_journal
from kernel.state.snapshots import verify_projections
from kernel.testing import SeededIds
from tests.support import GOLDEN
from tests.support.helpers import ScriptedAgent, kernel_for, transfer
from tests.support.postgres import PostgresServer, postgres_server  # noqa: F401

DICTIONARY_SHA256 = {
    1: "bd237374d9ca468e920e8c5e1c219b6fca405524dcf77b0d6b1410c24bdf73e1",
    2: "4814f49526b5edfc38ce9812952c54414a4af9f2816e294e269e70a98ec82411",
}
"""Every dictionary ever released: changing one would make the rows written with it unreadable."""

SETTINGS = settings(max_examples=200, derandomize=True, deadline=None)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.text(max_size=40)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=25,
)
bodies = st.dictionaries(st.text(max_size=20), json_values, max_size=8).map(
    lambda value: msgspec.json.encode(value, order="sorted")
)


def trigger(x: int, dfid: str | None = None) -> Draft:
    return Draft(payload=TriggerFired(topic="t", facts={"x": x}), dfid=dfid)


def stored_bodies(path: Path) -> list[bytes]:
    with closing(sqlite3.connect(path)) as db:
        return [bytes(body) for (body,) in db.execute("SELECT body FROM events ORDER BY seq")]


def set_body(path: Path, seq: int, body: bytes) -> None:
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE events SET body = ? WHERE seq = ?", (body, seq))


def test_every_released_dictionary_is_the_one_released() -> None:
    for number, sha in DICTIONARY_SHA256.items():
        assert hashlib.sha256(dictionary(number)).hexdigest() == sha
    assert CURRENT in DICTIONARY_SHA256


@SETTINGS
@given(bodies)
def test_a_body_packs_and_unpacks_to_its_canonical_bytes(body: bytes) -> None:
    stored = BodyPacker().pack(body)
    assert stored[0] == CURRENT
    assert unpack(stored) == body
    assert BodyPacker().pack(stored) == stored  # a stored body is never packed twice
    assert unpack(body) == body  # plain JSON is its own stored form


@SETTINGS
@given(st.binary(max_size=300))
def test_any_bytes_unpack_or_are_refused_as_unreadable(stored: bytes) -> None:
    try:
        body = unpack(stored)
    except BodyUnreadable as exc:
        assert str(exc)
    else:
        assert stored[:1] == b"{" or body


@SETTINGS
@given(bodies, st.data())
def test_a_cut_or_lengthened_compressed_body_is_unreadable(
    body: bytes, data: st.DataObject
) -> None:
    # A flipped bit may still inflate (DEFLATE ignores its padding bits): the event's
    # hash, over the inflated bytes, is what tells a change of meaning.
    stored = BodyPacker().pack(body)
    cut = data.draw(st.integers(1, len(stored) - 1))
    with pytest.raises(BodyUnreadable):
        unpack(stored[:cut])
    with pytest.raises(BodyUnreadable):
        unpack(stored + data.draw(st.binary(min_size=1, max_size=4)))


def test_a_body_naming_an_unknown_dictionary_is_refused_clearly() -> None:
    stored = BodyPacker().pack(b'{"seq":1}')
    with pytest.raises(BodyUnreadable, match="dictionary 3, unknown to this kernel"):
        unpack(b"\x03" + stored[1:])
    with pytest.raises(BodyUnreadable, match="empty"):
        unpack(b"")


async def test_new_bodies_are_compressed_and_hashed_as_canonical_bytes(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with open_journal(path, clock=ManualClock()) as journal:
        events = await journal.append([trigger(i, f"d{i}") for i in range(20)])
    stored = stored_bodies(path)
    assert all(body[0] == CURRENT for body in stored)
    prev = bytes(32)
    for event, body in zip(events, stored, strict=True):
        canonical_body = canonical(msgspec.structs.replace(event, prev_hash="", hash=""))
        assert unpack(body) == canonical_body
        prev = chain(prev, canonical_body)
        assert prev.hex() == event.hash
    assert sum(map(len, stored)) < sum(len(unpack(b)) for b in stored) * 0.6


async def test_a_kernel_told_not_to_compress_stores_json_and_both_forms_read_back(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    async with kernel_for(path, compress=False) as kernel:
        await kernel.register(ScriptedAgent(steps=[transfer(100)]))
        [first] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(first)).status is FlowStatus.CLOSED
    plain = len(stored_bodies(path))
    assert plain > 0 and all(body[0] == ord("{") for body in stored_bodies(path))
    async with kernel_for(path, ids=SeededIds(8)) as kernel:  # the default compresses
        await kernel.register(ScriptedAgent(steps=[transfer(100)]))
        [second] = await kernel.trigger("bank.invoice")
        assert (await kernel.wait_flow(second)).status is FlowStatus.CLOSED
    later = stored_bodies(path)[plain:]
    assert later and all(body[0] == CURRENT for body in later)
    report = await verify_journal(path)
    assert report.ok, report.problem
    async with open_journal(path, readonly=True) as journal:
        replay = await verify_projections(journal)
    assert replay.ok, replay.problems


@pytest.mark.parametrize("name", ["trading", "booking"])
async def test_a_plain_journal_takes_compressed_rows_beside_its_own(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / "old.db"
    shutil.copyfile(GOLDEN / f"{name}.db", path)
    old = stored_bodies(path)
    assert all(body[:1] == b"{" for body in old)
    async with open_journal(path, readonly=True) as journal:
        before = await journal.read()
    with closing(sqlite3.connect(path)) as db:
        ((version,),) = db.execute("SELECT value FROM meta WHERE key = 'schema_version'")
    assert version == "1"  # reading changes nothing

    async with open_journal(path) as journal:
        added = await journal.append([Draft(payload=FlowCreated(root_dfid="new"), dfid="new")])
    stored = stored_bodies(path)
    assert stored[: len(old)] == old  # old rows are never rewritten
    assert stored[len(old)][0] == CURRENT
    with closing(sqlite3.connect(path)) as db:
        ((version,),) = db.execute("SELECT value FROM meta WHERE key = 'schema_version'")
    assert version == SCHEMA_VERSION  # a kernel that cannot read its rows now refuses it

    report = await verify_journal(path)
    assert report.ok, report.problem
    assert (report.events, report.head) == (len(old) + 1, added[0].hash)
    async with open_journal(path, readonly=True) as journal:
        assert await journal.read() == [*before, *added]
        replay = await verify_projections(journal)
    assert replay.ok, replay.problems


async def journal_of(path: Path, count: int) -> None:
    async with open_journal(path, clock=ManualClock()) as journal:
        await journal.append([trigger(i, f"d{i % 3}") for i in range(count)])


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda body: body[:-3], "compressed body is damaged"),
        (lambda body: body + b"\x00\x01", "compressed body is damaged"),
        (lambda body: b"\x07" + body[1:], "dictionary 7, unknown to this kernel"),
        (lambda body: body[:6] + bytes([body[6] ^ 0xFF]) + body[7:], "event 5"),
    ],
    ids=["truncated", "trailing", "unknown-dictionary", "flipped"],
)
def test_verify_names_a_damaged_compressed_body_and_its_seq(
    tmp_path: Path,
    damage: Callable[[bytes], bytes],
    problem: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "j.db"
    anyio.run(journal_of, path, 10)
    set_body(path, 5, damage(stored_bodies(path)[4]))

    report = anyio.run(verify_journal, path)
    assert not report.ok
    assert (report.first_bad_seq, report.events) == (5, 4)
    assert problem in report.problem and "event 5" in report.problem

    assert main(["verify", "--db", str(path)]) == ExitCode.FAILED
    out = capsys.readouterr()
    assert out.out.startswith("verify: FAILED at seq 5: event 5 ")
    assert "Traceback" not in out.out + out.err
    anyio.run(reads_up_to_the_damage, path)


async def reads_up_to_the_damage(path: Path) -> None:
    async with open_journal(path, readonly=True) as journal:
        assert len(await journal.read(stop=5)) == 4
        with pytest.raises(JournalCorrupt, match=r"does not decode|event 5"):
            events = await journal.read(start=5, stop=6)
            # A flipped bit may still inflate: then only the hash tells, when checked.
            assert events and events[0].seq == 5
            await journal.check_chain()


async def test_a_journal_whose_last_body_is_unreadable_is_refused_on_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    await journal_of(path, 3)
    set_body(path, 3, b"\x03" + stored_bodies(path)[2][1:])
    with pytest.raises(JournalCorrupt, match="dictionary 3, unknown") as caught:
        async with open_journal(path):
            pass
    assert caught.value.seq == 3


@settings(
    max_examples=4,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=30))
async def test_a_copy_to_postgres_keeps_canonical_json_and_back_compresses_again(
    tmp_path_factory: pytest.TempPathFactory,
    postgres_server: PostgresServer,  # noqa: F811
    xs: list[int],
) -> None:
    here = tmp_path_factory.mktemp("c") / "j.db"
    async with open_journal(here, clock=ManualClock()) as journal:
        for x in xs:
            await journal.append([trigger(x, f"d{x % 3}")])
    there, back = postgres_server.new_url(), tmp_path_factory.mktemp("c") / "back.db"
    await copy_journal(here, there)
    await copy_journal(there, back)

    reports = [await verify_journal(where) for where in (here, there, back)]
    assert len({(r.ok, r.events, r.head, r.journal_id) for r in reports}) == 1
    assert reports[0].ok and reports[0].events == len(xs)
    # PostgreSQL keeps canonical JSON, readable by SQL; SQLite compresses it again.
    import psycopg

    with psycopg.connect(there) as conn:
        rows = conn.execute("SELECT convert_from(body, 'UTF8')::jsonb ->> 'seq' FROM events")
        assert sorted(int(seq) for (seq,) in rows) == list(range(1, len(xs) + 1))
    assert stored_bodies(back) == stored_bodies(here)


# Dictionary 1 (DEFLATE) is what kernels 0.2.0 and before wrote; it is read forever.
ZLIB_1 = 1


@SETTINGS
@given(bodies)
def test_a_dictionary_1_body_still_unpacks_and_the_current_packer_converts_it(body: bytes) -> None:
    old = BodyPacker(ZLIB_1).pack(body)
    assert old[0] == ZLIB_1 != CURRENT
    assert unpack(old) == body
    converted = BodyPacker().pack(old)
    assert converted[0] == CURRENT
    assert unpack(converted) == body


@SETTINGS
@given(bodies, st.sampled_from([ZLIB_1, CURRENT]), st.data())
def test_a_cut_or_lengthened_body_of_either_codec_is_unreadable(
    body: bytes, number: int, data: st.DataObject
) -> None:
    stored = BodyPacker(number).pack(body)
    cut = data.draw(st.integers(1, len(stored) - 1))
    with pytest.raises(BodyUnreadable):
        unpack(stored[:cut])
    with pytest.raises(BodyUnreadable):
        unpack(stored + data.draw(st.binary(min_size=1, max_size=4)))


@SETTINGS
@given(st.binary(max_size=300))
def test_any_bytes_after_the_zstd_number_unpack_or_are_refused(frame: bytes) -> None:
    try:
        body = unpack(bytes([CURRENT]) + frame)
    except BodyUnreadable as exc:
        assert str(exc)
    else:
        assert isinstance(body, bytes)


def test_a_zstd_body_claiming_more_than_the_limit_is_refused_before_inflating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stored = BodyPacker().pack(b'{"pad":"' + b"x" * 500 + b'"}')
    monkeypatch.setattr(codec, "MAX_BODY", 100)
    with pytest.raises(BodyUnreadable, match="more than 100 bytes"):
        unpack(stored)


async def test_an_old_dictionary_1_journal_opens_verifies_grows_and_copies_to_zstd(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    await journal_of(path, 6)
    # What a 0.2.0 kernel wrote: every body deflated with dictionary 1.
    old_packer = BodyPacker(ZLIB_1)
    for seq, body in enumerate(stored_bodies(path), start=1):
        set_body(path, seq, old_packer.pack(unpack(body)))
    assert {body[0] for body in stored_bodies(path)} == {ZLIB_1}
    before = await verify_journal(path)
    assert before.ok and before.events == 6

    async with open_journal(path, clock=ManualClock()) as journal:
        assert len(await journal.read()) == 6
        await journal.append([trigger(99, "d9")])
    assert [body[0] for body in stored_bodies(path)] == [ZLIB_1] * 6 + [CURRENT]
    grown = await verify_journal(path)
    assert grown.ok and grown.events == 7

    copy = tmp_path / "copy.db"
    report = await copy_journal(path, copy)
    assert report.head == grown.head and report.events == 7
    assert {body[0] for body in stored_bodies(copy)} == {CURRENT}
    assert [unpack(b) for b in stored_bodies(copy)] == [unpack(b) for b in stored_bodies(path)]
