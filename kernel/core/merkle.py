"""The journal's Merkle tree: RFC 9162 (= RFC 6962) section 2.1 hashing, proofs and checks.

Every event is a leaf, ``SHA-256(0x00 || canonical bytes)``, at index ``seq - 1``; an
inner node is ``SHA-256(0x01 || left || right)``; the empty tree's root is ``SHA-256()``.
A tree of ``n`` leaves splits at the largest power of two *smaller* than ``n``, so
nothing is padded. The 0x00/0x01 prefixes keep a 64-byte event from passing as a node,
and a verifier computes the leaf hash from the event itself, never from a proof.

:class:`Frontier` appends in O(log n) and reports the complete subtrees each append
finishes; a store keeps those of height :data:`STORED_LEVEL` and above (see
:mod:`kernel.journal.tree`) and every root and proof is computed from them and at most
``2**STORED_LEVEL`` leaves. The checks are transcribed step by step from RFC 9162
sections 2.1.3.2 and 2.1.4.2, with transparency-dev/merkle's edge cases (an index past
the size, a proof hash too many or too few, consistency from size 0 refused).
Only hashlib: ../shared/notes/transparency-log.md has the vectors it was checked with.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

EMPTY_ROOT = hashlib.sha256(b"").digest()
"""The root of the empty tree: SHA-256 of nothing."""
STORED_LEVEL = 4
"""The lowest height of the subtrees a store keeps: one hash per 16 events (and half as
many above), about 4 bytes an event, where every node would cost ~85 (benchmark P6)."""

_sha256 = hashlib.sha256

RangeHash = Callable[[int, int], bytes]
"""``MTH(D[a:b])`` of an aligned range: what proofs are made of."""


def leaf_hash(entry: bytes) -> bytes:
    """Return ``SHA-256(0x00 || entry)``: the leaf of one event's canonical bytes."""
    return _sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """Return ``SHA-256(0x01 || left || right)``."""
    return _sha256(b"\x01" + left + right).digest()


def split(n: int) -> int:
    """Return the largest power of two smaller than ``n`` (``n >= 2``)."""
    return 1 << ((n - 1).bit_length() - 1)


def root_of(leaves: Sequence[bytes]) -> bytes:
    """Return ``MTH`` of leaf hashes, by the RFC's recursion (for tests and small ranges)."""
    n = len(leaves)
    if n == 0:
        return EMPTY_ROOT
    if n == 1:
        return leaves[0]
    k = split(n)
    return node_hash(root_of(leaves[:k]), root_of(leaves[k:]))


def fold(parts: Sequence[bytes]) -> bytes:
    """Hash perfect subtrees (largest first, left to right) into the root of their range."""
    root = parts[-1]
    for part in reversed(parts[:-1]):
        root = node_hash(part, root)
    return root


def decompose(a: int, b: int) -> list[tuple[int, int]]:
    """Return the perfect subtrees ``(level, index)`` that cut the range ``[a, b)``, left first.

    ``a`` must be a multiple of the largest of them (true of every node a proof names).
    """
    parts = []
    while a < b:
        level = (b - a).bit_length() - 1
        while a % (1 << level):
            level -= 1
        parts.append((level, a >> level))
        a += 1 << level
    return parts


class Frontier:
    """The right edge of a growing tree: the perfect subtrees that cut ``[0, size)``.

    ``append`` adds one leaf and returns the subtrees it completed at height
    ``stored`` and above, which a store keeps; what lies below is recomputed from
    events when needed.
    """

    __slots__ = ("_stack", "size", "stored")

    def __init__(self, size: int = 0, parts: Sequence[bytes] = (), stored: int = STORED_LEVEL):
        levels = [level for level, _ in decompose(0, size)]
        if len(levels) != len(parts):
            raise ValueError(f"a tree of {size} leaves has {len(levels)} frontier hashes")
        self._stack: list[tuple[int, bytes]] = list(zip(levels, parts, strict=True))
        self.size = size
        self.stored = stored

    def append(self, leaf: bytes) -> list[tuple[int, int, bytes]]:
        """Add one leaf hash; return the ``(level, index, hash)`` it completed at ``stored`` up."""
        index, node, level = self.size, leaf, 0
        stack, stored = self._stack, self.stored
        done: list[tuple[int, int, bytes]] = [(0, index, leaf)] if stored == 0 else []
        while (index >> level) & 1:
            # The new node is a right child: hash it with its left sibling.
            node = node_hash(stack.pop()[1], node)
            level += 1
            if level >= stored:
                done.append((level, index >> level, node))
        stack.append((level, node))
        self.size = index + 1
        return done

    def root(self) -> bytes:
        """Return the root of the tree so far."""
        if not self._stack:
            return EMPTY_ROOT
        return fold([h for _, h in self._stack])

    def parts(self) -> list[bytes]:
        """Return the frontier's hashes, largest subtree first."""
        return [h for _, h in self._stack]

    def copy(self) -> Frontier:
        """Return an independent copy (to try an append that may be rolled back)."""
        twin = Frontier(stored=self.stored)
        twin._stack, twin.size = list(self._stack), self.size
        return twin


def inclusion_proof(index: int, size: int, range_hash: RangeHash) -> list[bytes]:
    """Return ``PATH(index, D[size])`` (RFC 9162 2.1.3.1), the sibling hashes from the leaf up."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of {size}")
    path, start, end = [], 0, size
    while end - start > 1:
        k = split(end - start)
        if index < start + k:
            path.append(range_hash(start + k, end))
            end = start + k
        else:
            path.append(range_hash(start, start + k))
            start += k
    return path[::-1]


def consistency_proof(old: int, new: int, range_hash: RangeHash) -> list[bytes]:
    """Return ``PROOF(old, D[new])`` (RFC 9162 2.1.4.1); empty when ``old == new``."""
    if not 0 < old <= new:
        raise ValueError(f"no consistency proof from {old} to {new}")
    path, start, end, whole, m = [], 0, new, True, old
    while m != end - start:
        k = split(end - start)
        if m <= k:
            path.append(range_hash(start + k, end))
            end = start + k
        else:
            path.append(range_hash(start, start + k))
            start, m, whole = start + k, m - k, False
    if not whole:
        path.append(range_hash(start, end))
    return path[::-1]


def verify_inclusion(
    index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes
) -> bool:
    """Tell whether ``proof`` shows ``leaf`` at ``index`` in the tree of ``size`` with ``root``."""
    if not 0 <= index < size or len(leaf) != 32 or not _all_hashes(proof):
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            fn, sn = _past_right_edge(fn, sn)
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


def verify_consistency(
    old: int, new: int, proof: Sequence[bytes], old_root: bytes, new_root: bytes
) -> bool:
    """Tell whether ``proof`` shows the tree of ``old`` leaves is a prefix of the one of ``new``.

    Size 0 is refused, as transparency-dev/merkle does: the empty tree is a prefix of every
    tree, and a caller (a witness told ``old 0``) accepts it without a proof.
    """
    if old <= 0 or old > new:
        return False
    if old == new:
        return not proof and old_root == new_root
    if not proof or not _all_hashes(proof):
        return False
    hashes = list(proof)
    if old & (old - 1) == 0:
        # D[0:old] is a node of the new tree: the proof leaves it out (2.1.4.2 step 2).
        hashes = [old_root, *hashes]
    return _consistent_roots(old - 1, new - 1, hashes) == (old_root, new_root)


def _all_hashes(proof: Sequence[bytes]) -> bool:
    """Whether every node of a proof has a SHA-256 hash's length."""
    return all(len(p) == 32 for p in proof)


def _past_right_edge(fn: int, sn: int) -> tuple[int, int]:
    """Climb while the node is a right child (RFC 9162 2.1.3.2 and 2.1.4.2)."""
    while fn and not fn & 1:
        fn, sn = fn >> 1, sn >> 1
    return fn, sn


def _consistent_roots(fn: int, sn: int, hashes: list[bytes]) -> tuple[bytes, bytes] | None:
    """Fold a consistency proof (RFC 9162 2.1.4.2): the old and new roots, or None."""
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = hashes[0]
    for c in hashes[1:]:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            fn, sn = _past_right_edge(fn, sn)
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return (fr, sr) if sn == 0 else None
