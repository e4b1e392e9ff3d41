"""The Merkle tree and the signed notes against published vectors and an independent library.

The vectors are transparency-dev/merkle's and the C2SP test vector of
../shared/notes/transparency-log.md (an RFC 8032 key signing, another cosigning); the
independent implementation is pymerkle 7.0.0 (its roots and inclusion proofs are RFC
6962's; its consistency proofs are another format, so those are checked by our
verifier against the RFC recursion instead).
"""

from __future__ import annotations

import base64
import itertools

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st
from pymerkle import InmemoryTree  # type: ignore[import-untyped]
from pymerkle import verify_inclusion as pymerkle_verify_inclusion
from pymerkle.proof import InclusionProof  # type: ignore[import-untyped]

from kernel.core.merkle import (
    Frontier,
    consistency_proof,
    decompose,
    fold,
    inclusion_proof,
    leaf_hash,
    root_of,
    verify_consistency,
    verify_inclusion,
)
from kernel.core.notes import (
    NoteError,
    Verifier,
    checkpoint_text,
    cosign,
    open_note,
    parse_checkpoint,
    parse_tlog_proof,
    parse_vkey,
    raw_public,
    sign,
    tlog_proof,
    vkey,
)
from kernel.journal.tree import TiledTree
from tests.support.hostile import hostile_text

LEAVES = [
    bytes.fromhex(x)
    for x in [
        "", "00", "10", "2021", "3031", "40414243", "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    ]
]  # fmt: skip
ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
LOG_SEED = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"
WITNESS_SEED = "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb"
SIGNED = (
    "example.com/dirk-test\n8\nXcnaeacGWamtVZy3Ad7ZoqudgjqtL0lgz+Nw7/RgQyg=\n\n"
    "— example.com/dirk-test xiS7EK64yq5uKIgGbMsO2Schw5Y3T9oUanRMmgKS/eCwZfKOtAwxmlWciekIJy0xTM7y"
    "+FthZyNsBaReZ6jv5AgP5g4=\n"
    "— witness.example/w1 BNLYMwAAAABrB3aAZVU7THUiPhlbDSNtVy5SPRMRT/55MMg4FVb1LeGRzMJ6pvYaq+tq4228"
    "LrGKzmiGj50RMV7B+RbLNHPguSv2BA==\n"
)


def stored_tree(leaves: list[bytes]) -> dict[tuple[int, int], bytes]:
    """Every complete subtree of the leaves, as a Frontier with nothing left out reports them."""
    frontier, nodes = Frontier(stored=0), {}
    for leaf in leaves:
        for level, index, node in frontier.append(leaf):
            nodes[(level, index)] = node
    return nodes


def test_roots_and_proofs_match_the_rfc_6962_reference_vectors() -> None:
    leaves = [leaf_hash(d) for d in LEAVES]
    for n in range(9):
        assert root_of(leaves[:n]).hex() == ROOTS[n]
    nodes = stored_tree(leaves)

    def range_hash(a: int, b: int) -> bytes:
        return fold([nodes[key] for key in decompose(a, b)])

    assert [h.hex()[:8] for h in inclusion_proof(5, 8, range_hash)] == [
        "bc1a0643", "ca854ea1", "d37ee418",
    ]  # fmt: skip
    assert [h.hex()[:8] for h in consistency_proof(6, 8, range_hash)] == [
        "0ebc5d34", "ca854ea1", "d37ee418",
    ]  # fmt: skip
    assert [h.hex()[:8] for h in consistency_proof(2, 5, range_hash)] == ["5f083f0a", "bc1a0643"]


def test_the_thousand_leaf_vector_and_a_frontier_rebuilt_from_stored_subtrees() -> None:
    leaves = [leaf_hash(str(i).encode()) for i in range(1000)]
    frontier = Frontier()
    stored: dict[tuple[int, int], bytes] = {}
    for leaf in leaves:
        for level, index, node in frontier.append(leaf):
            assert level >= 4
            stored[(level, index)] = node
    assert (
        frontier.root().hex() == "638afa98022925bacfddadb15ef22fd0199c1ac99c2973b6158243d13fce05c2"
    )
    # 2n/16 stored subtrees: what P6 counts.
    assert len(stored) == 2 * (1000 // 16) - bin(1000 // 16).count("1")
    rebuilt = Frontier(992, [stored[key] for key in decompose(0, 992)])
    for leaf in leaves[992:]:
        rebuilt.append(leaf)
    assert rebuilt.root() == frontier.root()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=70), st.data())
def test_every_proof_verifies_and_every_altered_one_does_not(
    entries: list[bytes], data: st.DataObject
) -> None:
    leaves = [leaf_hash(e) for e in entries]
    nodes = stored_tree(leaves)

    def range_hash(a: int, b: int) -> bytes:
        return fold([nodes[key] for key in decompose(a, b)])

    n = len(leaves)
    root = root_of(leaves)
    m = data.draw(st.integers(0, n - 1))
    proof = inclusion_proof(m, n, range_hash)
    assert verify_inclusion(m, n, leaves[m], proof, root)
    assert not verify_inclusion(m, n, leaf_hash(entries[m] + b"!"), proof, root)
    assert not verify_inclusion(m + 1, n, leaves[m], proof, root) or leaves[m] in leaves[m + 1 :]
    if proof:
        flipped = [bytes([proof[0][0] ^ 1]) + proof[0][1:], *proof[1:]]
        assert not verify_inclusion(m, n, leaves[m], flipped, root)
        assert not verify_inclusion(m, n, leaves[m], proof[:-1], root)
    old = data.draw(st.integers(1, n))
    consistency = consistency_proof(old, n, range_hash)
    assert verify_consistency(old, n, consistency, root_of(leaves[:old]), root)
    assert not verify_consistency(old, n, [*consistency, root], root_of(leaves[:old]), root)
    if old < n:
        other = root_of([leaf_hash(b"forged"), *leaves[1:old]])
        assert not verify_consistency(old, n, consistency, other, root)
    assert not verify_consistency(0, n, [], root_of([]), root)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=60), st.data())
def test_our_roots_and_inclusion_proofs_agree_with_pymerkle(
    entries: list[bytes], data: st.DataObject
) -> None:
    tree = InmemoryTree(algorithm="sha256")
    for entry in entries:
        tree.append_entry(entry)
    leaves = [leaf_hash(e) for e in entries]
    n = len(entries)
    assert tree.get_root() == root_of(leaves)
    m = data.draw(st.integers(0, n - 1))
    nodes = stored_tree(leaves)
    ours = inclusion_proof(m, n, lambda a, b: fold([nodes[k] for k in decompose(a, b)]))
    theirs = tree.prove_inclusion(m + 1, n)  # pymerkle counts leaves from 1
    assert theirs.path[0] == leaves[m] and theirs.path[1:] == ours
    # Our proof, in pymerkle's own form, passes pymerkle's own check (it raises if not).
    pymerkle_verify_inclusion(leaves[m], root_of(leaves), as_pymerkle(theirs, ours, leaves[m]))


def as_pymerkle(template: InclusionProof, ours: list[bytes], leaf: bytes) -> InclusionProof:
    """Our inclusion proof in pymerkle's form (its path starts with the leaf)."""
    proof = InclusionProof(template.algorithm, template.security, template.size,
                           template.index, template.rule, [leaf, *ours])  # fmt: skip
    return proof


def test_the_c2sp_test_vector_is_reproduced_byte_for_byte_and_verifies() -> None:
    log = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(LOG_SEED))
    witness = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(WITNESS_SEED))
    name = "example.com/dirk-test"
    assert vkey(name, 1, raw_public(log)) == (
        "example.com/dirk-test+c624bb10+AddamAGCsQq31Uv+08lkBzoO4XLz2qYjJa8CGmj3B1Ea"
    )
    text = checkpoint_text(name, 8, bytes.fromhex(ROOTS[8]))
    note = sign(text, name, log) + cosign(text, "witness.example/w1", witness, 1795651200)
    assert note == SIGNED
    known = [
        Verifier(name, 1, raw_public(log)),
        Verifier("witness.example/w1", 4, raw_public(witness)),
    ]
    body, signatures = open_note(note, known)
    assert parse_checkpoint(body).size == 8
    assert [(s.name, s.timestamp) for s in signatures] == [
        (name, None), ("witness.example/w1", 1795651200),
    ]  # fmt: skip
    assert parse_vkey(vkey(name, 1, raw_public(log))) == known[0]
    # Renamed, altered or unknown: refused, as C2SP says.
    with pytest.raises(NoteError):
        open_note(note.replace("\n8\n", "\n9\n"), known)
    with pytest.raises(NoteError):
        open_note(note, [Verifier("other.example/name", 1, raw_public(log))])
    renamed = note.replace("— example.com/dirk-test", "— other.example/name")
    with pytest.raises(NoteError):
        open_note(renamed, [Verifier("other.example/name", 1, raw_public(log))])


def test_a_tlog_proof_round_trips() -> None:
    text = tlog_proof(5, [b"\x01" * 32, b"\x02" * 32], SIGNED, b"entry")
    assert parse_tlog_proof(text) == (5, [b"\x01" * 32, b"\x02" * 32], SIGNED, b"entry")


@given(hostile_text(max_size=200))
def test_hostile_text_is_refused_as_a_note_a_key_or_a_proof_never_raised(text: str) -> None:
    for parse in (lambda t: open_note(t, []), parse_vkey, parse_tlog_proof, parse_checkpoint):
        try:
            parse(text)
        except NoteError:
            pass
    with pytest.raises(NoteError):
        open_note(SIGNED.replace("example.com/dirk-test\n", text + "\n", 1), [])
    assert base64.b64decode(SIGNED.split()[-1])


@settings(max_examples=80, deadline=None)
@given(st.integers(min_value=0, max_value=300), st.data())
def test_a_tiled_tree_grown_in_batches_agrees_with_the_frontier_leaf_by_leaf(
    n: int, data: st.DataObject
) -> None:
    # What verify builds (kernel.journal.tree.TiledTree): the same stored nodes, the same
    # roots at the checkpoints' sizes, however the leaves are cut into batches.
    leaves = [leaf_hash(i.to_bytes(2, "big")) for i in range(n)]
    wanted = data.draw(st.sets(st.integers(min_value=0, max_value=n + 3), max_size=4))
    frontier, nodes, roots = Frontier(), {}, {}
    if 0 in wanted:
        roots[0] = frontier.root()
    for leaf in leaves:
        for level, index, node in frontier.append(leaf):
            nodes[(level, index)] = node
        if frontier.size in wanted:
            roots[frontier.size] = frontier.root()
    tree = TiledTree(wanted)
    cuts = sorted(data.draw(st.sets(st.integers(min_value=1, max_value=max(n - 1, 1)))))
    for a, b in itertools.pairwise([0, *[c for c in cuts if c < n], n]):
        tree.add(leaves[a:b])
    assert tree.nodes == nodes
    assert tree.roots == roots
    assert tree.root() == frontier.root() == root_of(leaves)
    assert tree.size == n
