"""``dirk prove``'s proofs, checked by an independent RFC 6962 implementation (pymerkle)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import anyio
import pytest
from pymerkle import InmemoryTree  # type: ignore[import-untyped]
from pymerkle import verify_inclusion as pymerkle_verify_inclusion
from pymerkle.proof import InclusionProof  # type: ignore[import-untyped]

from kernel.cli import main
from kernel.core.events import is_derived
from kernel.core.merkle import leaf_hash, verify_consistency
from kernel.core.notes import open_note, parse_checkpoint, parse_tlog_proof
from kernel.journal.opening import open_journal
from kernel.proofs.bundle import _bare
from kernel.proofs.check import read_keys
from tests.support.proofs import KeyFiles, run_flows, signing_kernel


@pytest.fixture
def journal(tmp_path: Path) -> tuple[Path, KeyFiles, list[str]]:
    key = KeyFiles(tmp_path / "k", "log")
    path = tmp_path / "j.db"

    async def run() -> list[str]:
        async with signing_kernel(path, key) as kernel:
            return await run_flows(kernel, [10, 20, 30])

    return path, key, anyio.run(run)


def every_event(path: Path) -> list[bytes]:
    async def read() -> list[bytes]:
        async with open_journal(path, readonly=True) as opened:
            # The rows: a derived FlowClosed has no leaf of its own.
            return [_bare(e) for e in await opened.read() if not is_derived(e)]

    return anyio.run(read)


def test_an_inclusion_proof_from_dirk_prove_verifies_with_pymerkle(
    journal: tuple[Path, KeyFiles, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, key, _ = journal
    entries = every_event(path)
    independent = InmemoryTree(algorithm="sha256")
    for entry in entries:
        independent.append_entry(entry)
    for seq in (1, 7, len(entries) // 2, len(entries)):
        assert main(["prove", "--db", str(path), "--event", str(seq)]) == 0
        index, proof, note, extra = parse_tlog_proof(capsys.readouterr().out)
        assert (index, extra) == (seq - 1, entries[seq - 1])
        text, _ = open_note(note, read_keys(key.public_text).for_log(note.split("\n")[0]))
        checkpoint = parse_checkpoint(text)
        # pymerkle builds its own tree from the same events and agrees on the signed root...
        assert independent.get_root(checkpoint.size) == checkpoint.root
        template = independent.prove_inclusion(seq, checkpoint.size)
        assert template.path[1:] == proof
        # ...and its verifier accepts our proof (it raises otherwise).
        with_leaf = [leaf_hash(extra), *proof]
        ours = InclusionProof(
            template.algorithm,
            template.security,
            template.size,
            template.index,
            template.rule,
            with_leaf,
        )
        pymerkle_verify_inclusion(leaf_hash(extra), checkpoint.root, ours)


def test_a_flow_and_a_consistency_proof(
    journal: tuple[Path, KeyFiles, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, dfids = journal
    entries = every_event(path)
    assert main(["prove", "--db", str(path), "--flow", dfids[1], "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [e["seq"] for e in found["events"]] and all(
        json.loads(base64.b64decode(e["event"]))["dfid"] == dfids[1] for e in found["events"]
    )
    n = len(entries)
    assert main(["prove", "--db", str(path), "--consistency", "5", str(n), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert verify_consistency(
        5, n, [base64.b64decode(h) for h in found["proof"]],
        base64.b64decode(found["old_root"]), base64.b64decode(found["new_root"]),
    )  # fmt: skip
    assert main(["prove", "--db", str(path), "--consistency", "0", "3"]) == 2
    assert main(["prove", "--db", str(path), "--event", str(n + 5)]) == 1
    assert "UNKNOWN_SEQ" in capsys.readouterr().err
