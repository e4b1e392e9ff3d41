"""The journal-store port: what a database must do to hold a journal.

:class:`~kernel.journal.store.Journal` does everything that is the same for
every store (sealing, canonical bytes, the chain, the head record, group
commit, listeners, subscriptions) and reaches its database only through the
three small protocols here. A store is a module with :func:`open_store` and
:func:`open_snapshot` of these shapes: :mod:`kernel.journal._sqlite` (the
default, a file) and :mod:`kernel.journal._postgres` (a shared server, behind
the ``dir-kernel[postgres]`` extra). :func:`backend_for` picks one by location.

Errors: a reader raises :class:`~kernel.journal.errors.JournalError` (never the
driver's own); a writer may raise anything, which fails the journal.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from kernel.core.merkle import Frontier
from kernel.journal.errors import is_postgres
from kernel.journal.head import Row
from kernel.journal.tree import Node, NodeKey

EventRow = tuple[int, bytes, bytes, bytes | None]
"""An event as :meth:`StoreReader.events` returns it: seq, body, hash, the previous row's hash
(None when read without it)."""


class Head(NamedTuple):
    """The journal's identity and last committed event, as checked on open."""

    journal_id: str
    seq: int
    hash: bytes


class StoreReader(Protocol):
    """Reads of committed events; never waits for a commit in flight."""

    async def events(
        self,
        start: int,
        stop: int | None,
        dfid: str | None,
        types: Sequence[str] | None,
        limit: int | None,
        hashes: bool = True,
    ) -> list[EventRow]:
        """Return events from ``start`` (to ``stop``, exclusive) in seq order, filtered.

        ``hashes`` False leaves the previous row's hash None: a scan of consecutive rows
        has it from the row before, without the join.
        """
        ...

    async def rows(self, start: int, last: int, limit: int) -> list[Row]:
        """Return the rows with ``start <= seq <= last`` in seq order, at most ``limit``."""
        ...

    async def hash_at(self, seq: int) -> bytes | None:
        """Return the hash of event ``seq``, or None if there is no such row."""
        ...

    async def snapshot_seqs(self) -> list[int]:
        """Return the seqs of the stored snapshots, oldest first."""
        ...

    async def read_snapshot(self, seq: int) -> tuple[str, bytes] | None:
        """Return the (digest, body) stored for ``seq``, or None."""
        ...

    async def tree_nodes(self, keys: Sequence[NodeKey]) -> dict[NodeKey, bytes]:
        """Return the stored Merkle tree nodes among ``keys`` (kernel.journal.tree)."""
        ...

    async def tree_heads(self) -> list[tuple[int, str]]:
        """Return the stored signed checkpoints as (tree size, note), smallest first."""
        ...

    async def aclose(self) -> None:
        """Close the reader's connection."""
        ...


class StoreWriter(Protocol):
    """The one writer of a journal; every method runs in a worker thread, one at a time.

    A writer may also offer ``append_lazy`` (``append``'s arguments): the same transaction,
    committed without a sync of its own (safe from a killed process; durable with the next
    synced commit). The journal calls it for a transaction none of whose appends asked
    for durability (:meth:`~kernel.journal.store.Journal.append` ``durable=False``); a
    writer without it commits every transaction as ``append`` does.

    It may also offer ``upkeep`` (no arguments) and an ``upkeep_due`` flag: the journal
    asks the flag after each commit and, when set, runs ``upkeep`` in a thread of its own,
    beside the commits, never between them (SQLite: the WAL's checkpoint, on a
    connection of its own, kernel.journal._sqlite_writer).
    """

    def append(
        self,
        rows: Sequence[Row],
        expected_seq: int,
        head: str,
        injected: bool,
        nodes: Sequence[Node] = (),
    ) -> None:
        """Write ``rows``, the tree ``nodes`` they complete and the head record ``head`` in one
        transaction, or nothing.

        ``expected_seq`` is the head this writer last committed: a store shared
        between processes refuses the transaction if the head moved meanwhile.
        ``injected`` fails the transaction before commit (:class:`JournalFaults`).
        """
        ...

    def write_snapshot(self, seq: int, digest: str, body: bytes) -> None:
        """Store (or replace) the snapshot taken after event ``seq``."""
        ...

    def drop_snapshots(self, seqs: list[int]) -> None:
        """Delete the snapshots stored for ``seqs``."""
        ...

    def store_tree_head(self, size: int, note: str) -> None:
        """Store (or replace) the signed checkpoint of the tree of ``size`` events."""
        ...

    def adopt(self, journal_id: str) -> None:
        """Take ``journal_id`` as this journal's id (a copy, before its first event)."""
        ...

    def close(self) -> None:
        """Close the writer's connections (and give up its lease, if any)."""
        ...


class OpenedStore(NamedTuple):
    """What :func:`open_store` returns: a reader, a writer (None read-only), the checked head."""

    reader: StoreReader
    writer: StoreWriter | None
    head: Head
    keyed: bool
    tree: Frontier | None = None
    """The writer's Merkle tree frontier at the head (None read-only)."""
    tree_built: bool = False
    """Whether the store keeps the tree's nodes (False: a journal from before trees)."""


class Snapshot(Protocol):
    """One consistent read of a whole journal, for ``verify`` and ``copy``."""

    async def meta(self) -> dict[str, str] | None:
        """Return the journal's meta (with its head record as ``head``); None if blank."""
        ...

    async def rows_from(self, start: int, limit: int) -> list[Row]:
        """Return at most ``limit`` rows with ``seq >= start``, in seq order."""
        ...

    async def tree_levels(self) -> list[int]:
        """Return the levels at which Merkle tree nodes are stored."""
        ...

    async def tree_nodes_from(self, level: int, after: int, limit: int) -> list[Node]:
        """Return at most ``limit`` stored nodes of ``level`` with index > ``after``, in order."""
        ...

    async def tree_heads(self) -> list[tuple[int, str]]:
        """Return the stored signed checkpoints as (tree size, note), smallest first."""
        ...


class Backend(Protocol):
    """A store: a module with these two functions."""

    async def open_store(
        self,
        location: str,
        *,
        readonly: bool,
        synchronous: str,
        chain_key: bytes | None,
        compress: bool = True,
    ) -> OpenedStore:
        """Open (creating if blank, unless ``readonly``) the journal at ``location``.

        ``compress``: store new bodies compressed where the store can (SQLite).
        """
        ...

    def open_snapshot(self, location: str) -> contextlib.AbstractAsyncContextManager[Snapshot]:
        """Open one read-only, consistent view of the journal at ``location``."""
        ...


def backend_for(location: str) -> Backend:
    """Return the store for ``location``: PostgreSQL for a ``postgresql://`` URL, else SQLite.

    The PostgreSQL store (and its driver) is imported only here, when asked for.
    """
    name = "kernel.journal._postgres" if is_postgres(location) else "kernel.journal._sqlite"
    module: Any = importlib.import_module(name)
    return module  # type: ignore[no-any-return]
