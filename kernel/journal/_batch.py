"""Group commit's batch: the appends gathered for one transaction, sealed into rows.

:meth:`~kernel.journal.store.Journal.append` adds a request to the pending batch;
the journal's writer seals every request of it (:func:`seal_requests`), grows
the Merkle tree by their rows (:func:`grown`) and writes them in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio

from kernel.core.events import Draft, Event, with_derived
from kernel.core.merkle import Frontier, leaf_hash
from kernel.journal.head import Row
from kernel.journal.sealing import seal
from kernel.journal.tree import Node


class Batch:
    """The appends gathered for one transaction, and their outcomes."""

    __slots__ = ("done", "durable", "ready", "requests", "results")

    def __init__(self) -> None:
        self.requests: list[Sequence[Draft]] = []
        # Per request: its events, the exception its own drafts raised, or None if not written.
        self.results: list[list[Event] | Exception | None] = []
        self.ready = anyio.Event()  # the first append, or closing, wakes the writer
        self.done = anyio.Event()
        self.durable = False
        """Whether an append of it wants its own sync (group commit: any one syncs all)."""

    def add(self, drafts: Sequence[Draft], durable: bool = True) -> int:
        """Add one append's drafts, wake the writer; return the index of its result."""
        self.durable = self.durable or durable
        self.requests.append(drafts)
        self.results.append(None)
        self.ready.set()
        return len(self.requests) - 1


def lazy_append(writer: Any, batch: Batch) -> Callable[..., None] | None:
    """The writer's ``append_lazy`` if it has one and no append of ``batch`` asked to sync."""
    return None if batch.durable else getattr(writer, "append_lazy", None)


def seal_requests(
    batch: Batch,
    seq: int,
    prev: bytes,
    ts: int,
    key: bytes | None,
    check: Callable[[Sequence[Event]], None] | None,
) -> tuple[list[Row], list[tuple[int, list[Event]]]]:
    """Seal each request of ``batch`` after event ``seq`` (hash ``prev``), in order.

    Returns the rows and, per request sealed, its index and events. A request whose
    drafts cannot be encoded, or that ``check`` refuses, gets its exception as its
    result and takes no seq: the next request goes on from the last one sealed.
    """
    rows: list[Row] = []
    sealed: list[tuple[int, list[Event]]] = []
    for index, drafts in enumerate(batch.requests):
        try:
            request_rows, events = seal(drafts, seq, prev, ts, key)
            if check is not None:
                check(with_derived(events))
        except Exception as exc:
            # A draft that cannot be encoded fails its own caller, not the whole batch.
            batch.results[index] = exc
            continue
        rows += request_rows
        sealed.append((index, events))
        seq, prev = request_rows[-1][0], request_rows[-1][4]
    return rows, sealed


def grown(tree: Frontier | None, rows: Sequence[Row]) -> tuple[Frontier | None, list[Node]]:
    """Return a copy of ``tree`` grown by ``rows``, and the nodes it stores (none: no tree).

    Leaves are over the canonical bytes the chain hashes; a copy of the frontier, so a
    failed transaction leaves the tree at the head.
    """
    if tree is None:
        return None, []
    tree = tree.copy()
    nodes: list[Node] = []
    for row in rows:
        nodes += tree.append(leaf_hash(row[3]))
    return tree, nodes
