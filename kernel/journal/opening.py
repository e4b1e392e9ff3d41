"""Opening a journal: pick its store by location, start its writer, close it cleanly."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

import anyio

from kernel.core.ports import Clock, SystemClock
from kernel.journal._sqlite import SYNCHRONOUS
from kernel.journal.port import backend_for
from kernel.journal.store import Journal, JournalFaults


@contextlib.asynccontextmanager
async def open_journal(
    path: str | os.PathLike[str],
    *,
    clock: Clock | None = None,
    synchronous: str = "FULL",
    readonly: bool = False,
    faults: JournalFaults | None = None,
    chain_key: bytes | None = None,
    compress: bool = True,
    grace_s: float = 5.0,
    probe_s: float = 1.0,
) -> AsyncIterator[Journal]:
    """Open the journal at ``path``, creating it if it does not exist.

    On exit, pending appends are committed, the writer stops and the store is closed.

    Args:
        path: The SQLite file, or a ``postgresql://`` URL (the ``dir-kernel[postgres]`` extra).
            On PostgreSQL a writer first takes the journal's lease: a second writer
            waits here, as a standby, until the first is gone.
        clock: Where event timestamps come from; the system clock by default.
        synchronous: SQLite's ``PRAGMA synchronous``; FULL makes every commit durable
            (on PostgreSQL, OFF and NORMAL turn ``synchronous_commit`` off).
        readonly: Open for reading only (appends raise :class:`JournalClosed`).
        faults: Faults to inject, for tests.
        chain_key: The chain key (see :func:`chain_key_from`): a new journal is keyed
            with it; a keyed journal needs it to be appended to (reading does not).
            Only a journal without events can be given a key.
        compress: Store new SQLite bodies deflated (:mod:`kernel.journal.codec`), or as
            canonical JSON; both forms are always read. PostgreSQL keeps JSON.
        grace_s: How long a store that cannot be reached is retried before the journal
            reports it away (:mod:`kernel.journal.outage`); appends wait either way.
        probe_s: How often an idle writer asks its store whether it is there.

    Raises:
        JournalCorrupt: Not a SQLite database, or its last event does not check out, or
            the head record says its tail was removed or appended to.
        JournalKeyError: The key is missing (for writing), wrong, or the journal is unkeyed.
        JournalForeign: A SQLite database (or PostgreSQL schema) of something else.
        JournalVersionError: A journal of a schema version this kernel does not read.
        JournalError: The file (or server) cannot be used at all.
    """
    synchronous = synchronous.upper()
    if synchronous not in SYNCHRONOUS:
        raise ValueError(f"synchronous must be one of {sorted(SYNCHRONOUS)}, not {synchronous!r}")
    location = os.fspath(path)
    opened = await backend_for(location).open_store(
        location,
        readonly=readonly,
        synchronous=synchronous,
        chain_key=chain_key,
        compress=compress,
    )
    writer = opened.writer
    journal: Journal | None = None
    try:
        journal = Journal(
            location,
            opened.reader,
            writer,
            opened.head,
            clock or SystemClock(),
            faults or JournalFaults(),
            chain_key if opened.keyed else None,
            opened.keyed,
            opened.tree,
            opened.tree_built,
            grace_s=grace_s,
            probe_s=probe_s,
        )
        body_error: Exception | None = None
        async with anyio.create_task_group() as tg:
            if writer is not None:
                tg.start_soon(journal.run_writer)
                tg.start_soon(journal.run_upkeep)
                tg.start_soon(journal.store.run_hooks)
            try:
                yield journal
            except Exception as exc:
                # Re-raised outside the task group, so the caller sees it and not an ExceptionGroup.
                body_error = exc
            finally:
                journal.stop_writer()
                journal.store.stop_hooks()
        if body_error is not None:
            raise body_error
    finally:
        with anyio.CancelScope(shield=True):
            if journal is not None:
                journal.close()
            if writer is not None:
                await anyio.to_thread.run_sync(writer.close)
            await opened.reader.aclose()
