"""Copy a journal between stores (SQLite and PostgreSQL, either way), verified on arrival.

The rows travel as they are: the same seqs, canonical bytes and hashes, under
the same journal id, so the copy verifies to the same head hash and an anchor
taken of the source holds for the copy. Only a target without events is taken.
"""

from __future__ import annotations

import os

import anyio
import msgspec

from kernel.journal._subscription import READ_BATCH
from kernel.journal.codec import unpack
from kernel.journal.errors import JournalError
from kernel.journal.head import head_value
from kernel.journal.port import backend_for
from kernel.journal.tree import TreeBuilder
from kernel.journal.verify import VerifyReport, verify_journal


class CopyReport(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`copy_journal` copied: events, the journal's id and the head it verified to."""

    events: int
    journal_id: str
    head: str


async def copy_journal(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    chain_key: bytes | None = None,
    batch: int = READ_BATCH,
) -> CopyReport:
    """Copy the journal at ``source`` into the empty journal store at ``target``.

    The source is verified first and copied up to the head it verified to (a
    kernel may go on appending to it meanwhile); the target is verified after.

    Raises:
        JournalError: The source does not verify, the target holds events (or
            something else), or the copy does not verify to the source's head.
    """
    source, target = os.fspath(source), os.fspath(target)
    before = await verify_journal(source, chain_key=chain_key)
    if not before.ok:
        raise JournalError(source, f"does not verify, so it is not copied: {before.problem}")
    keyed = before.keyed
    key = chain_key if keyed else None
    opened = await backend_for(target).open_store(
        target, readonly=False, synchronous="FULL", chain_key=key
    )
    writer = opened.writer
    assert writer is not None
    try:
        if opened.head.seq != 0:
            raise JournalError(target, f"holds {opened.head.seq} events: copy only into a new one")
        await anyio.to_thread.run_sync(writer.adopt, before.journal_id)
        copied = 0
        # The copy keeps its own Merkle tree, built as the rows arrive.
        tree = TreeBuilder()
        async with backend_for(source).open_snapshot(source) as snapshot:
            while copied < before.events:
                rows = await snapshot.rows_from(copied + 1, min(batch, before.events - copied))
                if not rows or rows[0][0] != copied + 1:
                    raise JournalError(source, f"event {copied + 1} went missing while copied")
                last_seq, last_hash = rows[-1][0], rows[-1][4]
                head = head_value(last_seq, last_hash, key)
                tree.nodes = []
                for row in rows:
                    tree.add(unpack(row[3]))
                await anyio.to_thread.run_sync(writer.append, rows, copied, head, False, tree.nodes)
                copied = last_seq
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(writer.close)
            await opened.reader.aclose()
    after = await verify_journal(target, chain_key=chain_key)
    _check_arrival(target, before, after)
    return CopyReport(events=after.events, journal_id=after.journal_id, head=after.head)


def _check_arrival(target: str, before: VerifyReport, after: VerifyReport) -> None:
    if not after.ok:
        raise JournalError(target, f"the copy does not verify: {after.problem}")
    arrived = (after.journal_id, after.events, after.head, after.keyed)
    if arrived != (before.journal_id, before.events, before.head, before.keyed):
        raise JournalError(
            target,
            f"the copy verifies to event {after.events} {after.head[:16]}..., the source to"
            f" event {before.events} {before.head[:16]}...",
        )
