"""``dirk prove`` and ``dirk export`` as c2sp.org/tlog-proof@v1, read by a verifier of our own.

The verifier (tests/proofs/tlog_verifier.py) is written from the C2SP texts with hashlib
and cryptography only, and is first checked against a published-style vector (RFC 8032
keys, RFC 6962 leaves): what it accepts from dirk, a reader of the format would.
"""

from __future__ import annotations

import base64
from pathlib import Path

import anyio
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kernel.cli import main
from kernel.core.events import is_derived
from kernel.journal.opening import open_journal
from kernel.proofs.bundle import _bare
from tests.proofs import tlog_verifier
from tests.proofs.tlog_verifier import Refused, verify
from tests.support.proofs import KeyFiles, run_flows, signing_kernel

# Entry 5 (hex 40414243) of the RFC 6962 test leaves, in a tree of 8, signed with the RFC
# 8032 section 7.1 TEST 1 key and cosigned with the TEST 2 key at 1795651200.
VECTOR = (
    "c2sp.org/tlog-proof@v1\n"
    "index 5\n"
    "vBoGQ7EuTS18d5GPROD095qDi2z57FtcKD4fTYhZnms=\n"
    "yoVOoSjtBQtBs1/8G4e46yveRh6eO1WW7Oa51ZdaCuA=\n"
    "037kGJdt2VdTwcc4Yrk5j6Kiz5tP8P3+izDNlSCWFLc=\n"
    "\n"
    "example.com/dirk-test\n"
    "8\n"
    "XcnaeacGWamtVZy3Ad7ZoqudgjqtL0lgz+Nw7/RgQyg=\n"
    "\n"
    "\u2014 example.com/dirk-test xiS7EK64yq5uKIgGbMsO2Schw5Y3T9oUanRMmgKS/eCwZfKOtAwxmlWcie"
    "kIJy0xTM7y+FthZyNsBaReZ6jv5AgP5g4=\n"
    "\u2014 witness.example/w1 BNLYMwAAAABrB3aAZVU7THUiPhlbDSNtVy5SPRMRT/55MMg4FVb1LeGRzMJ6p"
    "vYaq+tq4228LrGKzmiGj50RMV7B+RbLNHPguSv2BA==\n"
)
LOG_KEY = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
WITNESS_KEY = bytes.fromhex("3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c")
WITNESS = "witness.example/w1"


def raw_public(pem: Path) -> bytes:
    """The raw public key of a private key file, read with cryptography alone."""
    key = serialization.load_pem_private_key(pem.read_bytes(), password=None)
    assert isinstance(key, Ed25519PrivateKey)
    return key.public_key().public_bytes_raw()


def test_the_verifier_accepts_the_vector_and_nothing_else() -> None:
    witnesses = {WITNESS: WITNESS_KEY}
    proven = verify(
        VECTOR, bytes.fromhex("40414243"), "example.com/dirk-test", LOG_KEY, witnesses, 1
    )
    assert (proven.index, proven.size, proven.witnesses) == (5, 8, [WITNESS])
    wrong = [
        (VECTOR, bytes.fromhex("3031"), LOG_KEY, "is not in the tree"),
        (VECTOR.replace("index 5", "index 4"), bytes.fromhex("40414243"), LOG_KEY, "not in"),
        (VECTOR.replace("index 5", "index 05"), bytes.fromhex("40414243"), LOG_KEY, "decimal"),
        (VECTOR.replace("\n8\n", "\n9\n"), bytes.fromhex("40414243"), LOG_KEY, "signature"),
        (VECTOR, bytes.fromhex("40414243"), WITNESS_KEY, "did not sign"),
    ]
    for text, entry, key, why in wrong:
        with pytest.raises(Refused, match=why):
            verify(text, entry, "example.com/dirk-test", key, witnesses)
    with pytest.raises(Refused, match="1 witnesses cosigned; 2 needed"):
        verify(VECTOR, bytes.fromhex("40414243"), "example.com/dirk-test", LOG_KEY, witnesses, 2)
    # Independent of the code it checks: nothing of dirk's is imported.
    source = Path(tlog_verifier.__file__).read_text(encoding="utf-8")
    assert "from kernel" not in source and "import kernel" not in source


@pytest.fixture
def journal(tmp_path: Path) -> tuple[Path, KeyFiles, KeyFiles, list[str]]:
    log, witness = KeyFiles(tmp_path / "k", "log"), KeyFiles(tmp_path / "k", "witness")
    path = tmp_path / "j.db"

    async def run() -> list[str]:
        async with signing_kernel(path, log) as kernel:
            return await run_flows(kernel, [10, 20])

    return path, log, witness, anyio.run(run)


def rows(path: Path) -> dict[int, bytes]:
    """Every event's canonical bytes, by seq, as the journal holds them (the entries)."""

    async def read() -> dict[int, bytes]:
        async with open_journal(path, readonly=True) as opened:
            return {e.seq: _bare(e) for e in await opened.read() if not is_derived(e)}

    return anyio.run(read)


def origin_of(path: Path) -> str:
    async def read() -> str:
        async with open_journal(path, readonly=True) as opened:
            return f"dirk/{opened.journal_id}"

    return anyio.run(read)


def test_dirk_prove_writes_tlog_proofs_the_verifier_accepts(
    journal: tuple[Path, KeyFiles, KeyFiles, list[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, log, _, dfids = journal
    entries, origin, key = rows(path), origin_of(path), raw_public(log.private)
    seq = max(entries) // 2
    assert main(["prove", "--db", str(path), "--event", str(seq)]) == 0
    proven = verify(capsys.readouterr().out, entries[seq], origin, key)
    assert proven.index == seq - 1 and proven.extra == entries[seq]

    out = tmp_path / "proofs"
    assert main(["prove", "--db", str(path), "--flow", dfids[0], "--tlog-proof", str(out)]) == 0
    capsys.readouterr()
    files = sorted(out.glob("*.tlog-proof"))
    assert files
    for file in files:
        seq = int(file.name.removeprefix("event-").removesuffix(".tlog-proof"))
        assert verify(file.read_text(encoding="utf-8"), entries[seq], origin, key).index == seq - 1
    # Written once: a second run refuses to overwrite; a consistency proof has no entry.
    again = main(["prove", "--db", str(path), "--flow", dfids[0], "--tlog-proof", str(out)])
    cons = main(["prove", "--db", str(path), "--consistency", "1", "2", "--tlog-proof", str(out)])
    err = capsys.readouterr().err
    assert again == cons == 2 and err.count("error: BAD_ARGUMENT:") == 2


def test_an_exported_flow_as_tlog_proofs_holds_with_its_witness_and_fails_tampered(
    journal: tuple[Path, KeyFiles, KeyFiles, list[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, log, witness, dfids = journal
    state = tmp_path / "witness.state"
    assert main(
        [
            "witness", "--db", str(path), "--log-key", str(log.public),
            "--key-file", str(witness.private), "--state", str(state), "--name", WITNESS,
        ]
    ) == 0  # fmt: skip
    out, bundle = tmp_path / "proofs", tmp_path / "flow.json"
    args = ["export", "--db", str(path), "--flow", dfids[1], "--bundle", str(bundle)]
    assert main([*args, "--tlog-proof", str(out)]) == 0
    capsys.readouterr()
    entries, origin, key = rows(path), origin_of(path), raw_public(log.private)
    witnesses = {WITNESS: raw_public(witness.private)}
    files = sorted(out.glob("event-*.tlog-proof"))
    assert len(files) >= 3
    for file in files:
        # No entry given: the extra line carries the event, and the leaf is its hash.
        proven = verify(file.read_text(encoding="utf-8"), None, origin, key, witnesses, 1)
        assert proven.extra == entries[proven.index + 1] and proven.witnesses == [WITNESS]

    text = files[0].read_text(encoding="utf-8")
    head, _, note = text.partition("\n\n")
    lines = head.split("\n")
    extra = base64.b64decode(lines[1].removeprefix("extra "))
    forged_extra = base64.b64encode(extra.replace(b'"seq"', b'"seq" ')).decode()
    proof_at = 3 if len(lines) > 3 else 2
    flipped = list(lines)
    hashed = bytearray(base64.b64decode(flipped[proof_at]))
    hashed[0] ^= 1
    flipped[proof_at] = base64.b64encode(bytes(hashed)).decode()
    tampered = [
        "\n".join([lines[0], "extra " + forged_extra, *lines[2:]]) + "\n\n" + note,
        "\n".join(flipped) + "\n\n" + note,
        text.replace("\nindex ", "\nindex 1"),
    ]
    for bad in tampered:
        with pytest.raises(Refused):
            verify(bad, None, origin, key, witnesses, 1)
    with pytest.raises(Refused, match="0 witnesses cosigned"):
        verify(text, None, origin, key, {}, 1)
