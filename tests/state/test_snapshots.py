"""Snapshots are trusted by the hash of their bytes, recorded in the checkpoint event.

Older checkpoints (without that hash) still vouch for a snapshot through the
projection digest, so journals written before keep opening from their snapshots.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kernel.audit import fold, open_journal
from kernel.core.events import Draft, ProjectionCheckpoint
from kernel.state.snapshots import capture, encode_snapshot, trusted_snapshot, verify_projections
from tests.audit.test_time_travel import record


async def test_a_checkpoint_records_the_hash_of_its_snapshot_bytes(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    await record(path, triggers=20)
    async with open_journal(path, readonly=True) as journal:
        events = await journal.read()
        points = [e.payload for e in events if isinstance(e.payload, ProjectionCheckpoint)]
        assert points
        kept = await journal.snapshot_seqs()
        assert kept and kept[-1] == points[-1].seq  # older ones may have been thinned out
        for point in points:
            stored = await journal.read_snapshot(point.seq)
            assert (stored is not None) == (point.seq in kept)
            if stored is not None:
                assert point.snapshot == hashlib.sha256(stored[1]).hexdigest()
        restored = await trusted_snapshot(journal)
    assert restored is not None and restored.last_seq == points[-1].seq
    assert restored.digest() == fold([e for e in events if e.seq <= points[-1].seq]).digest()


async def test_a_checkpoint_without_a_snapshot_hash_still_vouches_by_digest(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    await record(path, every=0, triggers=10)  # no checkpoints of its own
    async with open_journal(path) as journal:
        projections = fold(await journal.read())
        digest, body = encode_snapshot(capture(projections))
        await journal.write_snapshot(projections.last_seq, digest, body)
        # As a kernel before snapshot hashes recorded it: the digest alone.
        await journal.append(
            [Draft(payload=ProjectionCheckpoint(seq=projections.last_seq, digest=digest))]
        )
    async with open_journal(path, readonly=True) as journal:
        restored = await trusted_snapshot(journal)
        report = await verify_projections(journal)
    assert restored is not None and restored.digest() == projections.digest()
    assert report.ok and report.snapshots == 1, report.problems


async def test_a_snapshot_whose_bytes_differ_from_the_recorded_hash_is_not_loaded(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    await record(path, every=0, triggers=10)
    async with open_journal(path) as journal:
        projections = fold(await journal.read())
        digest, body = encode_snapshot(capture(projections))
        # Same state, but bytes the checkpoint does not name (e.g. appended garbage).
        await journal.write_snapshot(projections.last_seq, digest, body + b"\x00")
        snapshot = hashlib.sha256(body).hexdigest()
        await journal.append(
            [
                Draft(
                    payload=ProjectionCheckpoint(
                        seq=projections.last_seq, digest=digest, snapshot=snapshot
                    )
                )
            ]
        )
    async with open_journal(path, readonly=True) as journal:
        assert await trusted_snapshot(journal) is None
        report = await verify_projections(journal)
    assert report.problems == [f"at seq {projections.last_seq}: snapshot does not match replay"]
