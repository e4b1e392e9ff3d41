"""``dirk verify`` in one read of the journal finds exactly what the two separate passes find."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.audit import open_journal, verify_journal, verify_projections
from kernel.audit.verification import verify_all
from kernel.journal.verify import VerifyReport
from kernel.state.snapshots import ProjectionReport
from tests.journal.test_integrity import Image, copy, record


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    """A small journal with checkpoints and snapshots, as one file's bytes."""
    tmp = tmp_path_factory.mktemp("image")
    anyio.run(lambda: record(tmp / "live.db", checkpoint_every=4))
    return Image(copy(tmp / "live.db", tmp / "small.db").read_bytes())


async def separately(path: Path) -> tuple[VerifyReport, ProjectionReport | None]:
    """What dirk verify ran before: the chain, then, if it checked out, a second read to fold.

    Raises what the fold raised (a snapshot that does not read).
    """
    chain = await verify_journal(path)
    if not chain.ok:
        return chain, None
    async with open_journal(path, readonly=True) as journal:
        return chain, await verify_projections(journal)


def same(one: tuple[VerifyReport, ProjectionReport | None], other: object) -> bool:
    same: bool = msgspec.to_builtins(one) == msgspec.to_builtins(other)
    return same


async def test_a_sound_journal_verifies_alike_in_one_read(image: bytes, tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    path.write_bytes(image)
    found = await verify_all(path)
    assert found[0].ok and found[1] is not None and found[1].ok
    assert found[1].checkpoints >= 1 and found[1].snapshots >= 1
    assert same(found, await separately(path))


async def test_a_forged_checkpoint_is_found_in_one_read(image: bytes, tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    path.write_bytes(image)
    with closing(sqlite3.connect(path)) as db, db:
        ((seq,),) = db.execute("SELECT max(seq) FROM snapshots")
        db.execute("UPDATE snapshots SET body = x'00' WHERE seq = ?", (seq,))
    chain, replay = await verify_all(path)
    assert chain.ok and replay is not None and not replay.ok
    assert f"at seq {seq}: snapshot does not match replay" in replay.problems
    assert same((chain, replay), await separately(path))


@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.tuples(st.integers(0, 2**31), st.integers(1, 255)), min_size=1, max_size=3))
def test_any_damage_is_found_alike_in_one_read_or_two(
    image: bytes, tmp_path_factory: pytest.TempPathFactory, flips: list[tuple[int, int]]
) -> None:
    used = [offset for offset, byte in enumerate(image) if byte]
    damaged = bytearray(image)
    for where, xor in flips:
        damaged[used[where % len(used)]] ^= xor
    path = tmp_path_factory.mktemp("d") / "j.db"
    path.write_bytes(bytes(damaged))

    async def outcome(
        check: Callable[[Path], Awaitable[tuple[VerifyReport, ProjectionReport | None]]],
    ) -> tuple[VerifyReport | None, object]:
        """The chain's report (None if it raised) and the projections' report or failure."""
        try:
            chain, replay = await check(path)
        except Exception:
            return None, "raised"
        if not chain.ok:
            return chain, None
        return chain, replay if replay is not None else "failed"

    async def both() -> None:
        found, before = await outcome(verify_all), await outcome(separately)
        chain = await verify_journal(path)
        # One read finds the same chain problem, or checks the same chain out; and then
        # the same projections, or a failure of them as the two reads failed.
        assert found[0] in (chain, None) and before[0] in (chain, None)
        if chain.ok:
            assert found[1] == before[1] or (
                "raised" in (found[1], before[1])
                and (
                    not isinstance(found[1], ProjectionReport)
                    and not isinstance(before[1], ProjectionReport)
                )
            )
        else:
            assert found == before == (chain, None)

    anyio.run(both)
