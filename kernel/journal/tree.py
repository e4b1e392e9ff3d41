"""The journal's Merkle tree as a store keeps it: complete subtrees of 16 events and up.

The writer keeps the tree's frontier in memory and, in the same transaction as the
events and the head record, stores each complete subtree of height
:data:`~kernel.core.merkle.STORED_LEVEL` (16 events) or more as a row ``(level, idx,
hash)`` of ``tree_nodes``: ``2n/16`` rows for ``n`` events, about 4 bytes an event
(benchmark P6), where storing every node would cost ~85. Nothing is re-read to append:
the frontier is rebuilt once, when the journal is opened, from at most ``log2 n``
stored nodes and the last 15 events. Any root or proof for any size is computed from
stored nodes and the leaves of at most two partial tiles of 16 events
(:class:`TreeReader`): benchmark P15 times it.

``meta.tree`` says the journal keeps a tree (:data:`TREE_MARK`). A journal written
before trees existed has none: the first open for writing builds it from every event
(once, in the writer's transaction, O(n)); until then a proof hashes the events it
needs and ``dirk verify`` computes the tree from the events regardless.

Signed checkpoints (kernel.proofs) live beside it in ``tree_heads (size, note)``,
outside the hash chain like snapshots: each is its own proof (a signature over a root
that the events either give or do not).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Iterable, Sequence

from kernel.core.merkle import (
    EMPTY_ROOT,
    STORED_LEVEL,
    Frontier,
    consistency_proof,
    decompose,
    fold,
    inclusion_proof,
    leaf_hash,
    root_of,
)
from kernel.journal.codec import unpack

TREE_MARK = f"rfc6962 stored-level {STORED_LEVEL}"
"""``meta.tree`` of a journal whose writer keeps ``tree_nodes`` (level >= 4) for every event."""
TILE = 1 << STORED_LEVEL

Node = tuple[int, int, bytes]
"""A stored complete subtree: level, index at that level, hash."""
NodeKey = tuple[int, int]


def aligned(size: int) -> int:
    """Return the largest multiple of 16 not above ``size``: where stored nodes end."""
    return size - size % TILE


def frontier_keys(size: int) -> list[NodeKey]:
    """Return the stored nodes a frontier of ``size`` events is built from (the rest: events)."""
    return decompose(0, aligned(size))


def frontier_from(
    size: int, nodes: dict[NodeKey, bytes], tail: Sequence[bytes]
) -> tuple[Frontier, list[Node]]:
    """Rebuild the frontier of ``size`` events from its stored nodes and last leaves.

    Returns the frontier and nothing else to store (the tail's nodes are below level 4).
    """
    start = aligned(size)
    keys = frontier_keys(size)
    missing = [key for key in keys if key not in nodes]
    if missing:
        raise LookupError(f"tree node {missing[0]} is missing")
    frontier = Frontier(start, [nodes[key] for key in keys])
    if len(tail) != size - start:
        raise LookupError(f"events {start + 1}..{size} are needed to rebuild the tree")
    for leaf in tail:
        frontier.append(leaf)
    return frontier, []


def leaves_of(bodies: Iterable[bytes]) -> list[bytes]:
    """Return the leaf hashes of stored bodies (compressed or not): over the canonical bytes."""
    return [leaf_hash(unpack(body)) for body in bodies]


class TiledTree:
    """The tree over events in order, grown a batch of leaf hashes at a time (``verify``).

    What :class:`~kernel.core.merkle.Frontier` computes leaf by leaf, in fewer steps: each
    aligned tile of 16 leaves is hashed to its root at once, and only tile roots enter a
    frontier (whose level 0 is the tree's level 4). :attr:`nodes` gets every complete
    subtree of level 4 and up, the ones a store keeps, and :attr:`roots` the root at each
    size in ``wanted`` (the signed checkpoints' sizes).
    """

    def __init__(self, wanted: Iterable[int] = ()) -> None:
        self.size = 0
        self.nodes: dict[NodeKey, bytes] = {}
        self.roots: dict[int, bytes] = {}
        self._wanted = sorted(set(wanted), reverse=True)  # the next one last
        self._tiles = Frontier(stored=0)
        self._tail: list[bytes] = []
        self._root_if_wanted()

    def add(self, leaves: Sequence[bytes]) -> None:
        """Append the leaves of the next events, in order."""
        start = 0
        wanted = self._wanted
        while wanted and wanted[-1] <= self.size + len(leaves) - start:
            # A checkpoint's size falls among these leaves: its root is taken on the way.
            cut = start + wanted[-1] - self.size
            self._grow(leaves[start:cut])
            start = cut
            self._root_if_wanted()
        self._grow(leaves[start:] if start else leaves)

    def _root_if_wanted(self) -> None:
        wanted = self._wanted
        while wanted and wanted[-1] <= self.size:
            size = wanted.pop()
            if size == self.size:
                self.roots[size] = self.root()

    def _grow(self, leaves: Sequence[bytes]) -> None:
        # Tile by tile, not leaf by leaf: verify grows the tree by every event's leaf.
        tail, nodes, tiles = self._tail, self.nodes, self._tiles
        start, count = 0, len(leaves)
        if tail:
            start = min(TILE - len(tail), count)
            tail.extend(leaves[:start])
            if len(tail) < TILE:
                self.size += count
                return
            tiles_done: list[Sequence[bytes]] = [list(tail)]
            tail.clear()
        else:
            tiles_done = []
        whole = start + (count - start) // TILE * TILE
        tiles_done += [leaves[i : i + TILE] for i in range(start, whole, TILE)]
        tail.extend(leaves[whole:])
        for tile in tiles_done:
            for level, index, node in tiles.append(_tile_root(tile)):
                nodes[(level + STORED_LEVEL, index)] = node
        self.size += count

    def root(self) -> bytes:
        """Return the root of the tree of the leaves added so far."""
        parts = self._tiles.parts()
        if self._tail:
            parts.append(root_of(self._tail))
        return fold(parts) if parts else EMPTY_ROOT


def _tile_root(leaves: Sequence[bytes]) -> bytes:
    """Return the root of 16 leaves: 8, 4, 2 and 1 inner nodes."""
    sha256 = hashlib.sha256
    level = leaves
    while len(level) > 1:
        level = [
            sha256(b"\x01" + level[i] + level[i + 1]).digest() for i in range(0, len(level), 2)
        ]
    return level[0]


class TreeBuilder:
    """Build a tree over events in order (an old journal's first open, a copy, ``verify``)."""

    def __init__(self) -> None:
        self.frontier = Frontier()
        self.nodes: list[Node] = []

    def add(self, canonical: bytes) -> None:
        """Append the event whose canonical bytes are ``canonical``."""
        self.nodes += self.frontier.append(leaf_hash(canonical))


LeafReader = Callable[[int, int], Awaitable[list[bytes]]]
"""Leaf hashes of events ``start..stop - 1`` (1-based seqs), in order."""
NodeReader = Callable[[Sequence[NodeKey]], Awaitable[dict[NodeKey, bytes]]]


class TreeReader:
    """Roots and proofs for any size, from stored nodes and the few events below them.

    ``built`` False (a journal no kernel opened for writing since trees exist) computes
    everything from the events: correct, and O(size).
    """

    def __init__(self, nodes: NodeReader, leaves: LeafReader, built: bool) -> None:
        self._nodes = nodes
        self._leaves = leaves
        self._built = built

    async def _hashes(self, ranges: Sequence[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        """Return ``MTH(D[a:b])`` of each aligned range, reading each stored node once."""
        parts = {key for a, b in ranges for key in decompose(a, b)}
        stored = [key for key in parts if key[0] >= STORED_LEVEL] if self._built else []
        found = await self._nodes(stored) if stored else {}
        missing = [key for key in stored if key not in found]
        if missing:
            raise LookupError(f"tree node {missing[0]} is missing from the store")
        wanted = sorted(key for key in parts if key not in found)
        for level, index in wanted:
            start, stop = index << level, (index + 1) << level
            found[(level, index)] = root_of(await self._leaves(start + 1, stop + 1))
        return {(a, b): fold([found[key] for key in decompose(a, b)]) for a, b in ranges}

    async def _run(
        self, proof: Callable[[Callable[[int, int], bytes]], list[bytes]]
    ) -> list[bytes]:
        asked: list[tuple[int, int]] = []

        def record(a: int, b: int) -> bytes:
            asked.append((a, b))
            return EMPTY_ROOT

        proof(record)
        hashes = await self._hashes(asked)
        return proof(lambda a, b: hashes[(a, b)])

    async def root(self, size: int) -> bytes:
        """Return the root of the tree of the first ``size`` events."""
        if size == 0:
            return EMPTY_ROOT
        return (await self._hashes([(0, size)]))[(0, size)]

    async def inclusion(self, seq: int, size: int) -> list[bytes]:
        """Return the proof of event ``seq`` (leaf ``seq - 1``) in the tree of ``size``."""
        return await self._run(lambda rh: inclusion_proof(seq - 1, size, rh))

    async def consistency(self, old: int, new: int) -> list[bytes]:
        """Return the consistency proof from the tree of ``old`` events to the one of ``new``."""
        return await self._run(lambda rh: consistency_proof(old, new, rh))
