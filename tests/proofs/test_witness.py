"""A witness, run as ``dirk witness`` against a writer that truncates and re-grows its journal.

The writer holds the checkpoint key (it is the log): every checkpoint it signs verifies.
What catches it is the witness's memory of the last checkpoint it cosigned.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import anyio
import pytest

from kernel.cli import main
from kernel.core.merkle import EMPTY_ROOT
from kernel.core.notes import NoteError, checkpoint_text, open_note, sign, split_note
from kernel.proofs.check import read_keys
from kernel.proofs.witness import Witness, WitnessRefused
from tests.proofs.test_checkpoints import cut, heads, last_seq
from tests.support.proofs import KeyFiles, run_flows, signing_kernel


def witness(
    path: Path, keys: dict[str, KeyFiles], state: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    status = main(
        [
            "witness", "--db", str(path), "--log-key", str(keys["log"].public),
            "--key-file", str(keys["witness"].private), "--state", str(state),
            "--name", "witness.example/w1",
        ]
    )  # fmt: skip
    out, err = capsys.readouterr()
    return status, out + err


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, KeyFiles]:
    return {name: KeyFiles(tmp_path / "keys", name) for name in ("log", "witness")}


def grow(path: Path, key: KeyFiles, amounts: list[int]) -> None:
    async def run() -> None:
        async with signing_kernel(path, key) as kernel:
            await run_flows(kernel, amounts)

    anyio.run(run)


def test_a_witness_cosigns_a_growing_journal_and_refuses_one_truncated_and_regrown(
    tmp_path: Path, keys: dict[str, KeyFiles], capsys: pytest.CaptureFixture[str]
) -> None:
    path, state = tmp_path / "j.db", tmp_path / "witness.state"
    grow(path, keys["log"], [100, 200])
    status, out = witness(path, keys, state, capsys)
    assert status == 0, out
    first = last_seq(path)
    assert f"cosigned events 1..{first} (after 0)" in out
    # Written back: the journal's own checkpoint now carries the cosignature.
    vkey = tmp_path / "w.vkey"
    from kernel.core.notes import ED25519, raw_public
    from kernel.core.notes import vkey as make_vkey

    vkey.write_text(make_vkey("witness.example/w1", ED25519, raw_public(keys["witness"].key)))
    note = heads(path)[-1][1]
    log_and_witness = read_keys(keys["log"].public_text + "\n" + vkey.read_text())
    _, signatures = open_note(
        note,
        log_and_witness.for_log(split_note(note)[0].split("\n")[0])
        + log_and_witness.for_witnesses(),
    )
    assert {s.type for s in signatures} == {1, 4}

    # It grows honestly: consistent, cosigned.
    grow(path, keys["log"], [300])
    status, out = witness(path, keys, state, capsys)
    assert status == 0 and f"(after {first})" in out, out
    cosigned = last_seq(path)

    # The writer cuts its history back and grows another past it, signing as it goes.
    cut(path, first - 3)
    grow(path, keys["log"], [7, 8, 9, 10])
    assert last_seq(path) > cosigned
    assert main(["verify", "--db", str(path), "--public-key", str(keys["log"].public)]) == 0
    capsys.readouterr()
    status, out = witness(path, keys, state, capsys)
    assert status == 1
    assert "WITNESS_REFUSED: 422" in out and "forked history" in out
    # What it cosigned is what it keeps.
    assert Witness("witness.example/w1", keys["witness"].key, [], state).size == cosigned

    # Truncated and not regrown: smaller than what it cosigned.
    cut(path, first - 3)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("DELETE FROM tree_heads WHERE size > ?", (first - 6,))
    grow(path, keys["log"], [])
    assert last_seq(path) < cosigned
    status, out = witness(path, keys, state, capsys)
    assert status == 1 and "WITNESS_REFUSED: 400" in out


def test_the_witness_follows_tlog_witness_rules(tmp_path: Path, keys: dict[str, KeyFiles]) -> None:
    log = keys["log"].key
    w = Witness(
        "w", keys["witness"].key, [read_keys(keys["log"].public_text).keys[0]], tmp_path / "s"
    )
    origin = "example.com/log"
    empty = sign(checkpoint_text(origin, 0, EMPTY_ROOT), origin, log)
    w.add_checkpoint(0, [], empty, 1)
    with pytest.raises(WitnessRefused) as refused:
        w.add_checkpoint(3, [], empty, 1)
    assert refused.value.status == 409 and refused.value.size == 0
    other = KeyFiles(tmp_path / "k", "other").key
    with pytest.raises(WitnessRefused) as refused:
        w.add_checkpoint(0, [], sign(checkpoint_text(origin, 1, b"\x01" * 32), origin, other), 1)
    assert refused.value.status == 403
    with pytest.raises(WitnessRefused) as refused:
        w.add_checkpoint(
            0, [], sign(checkpoint_text("x.example/y", 1, b"\x01" * 32), "x.example/y", log), 1
        )
    assert refused.value.status == 404
    one = sign(checkpoint_text(origin, 1, b"\x01" * 32), origin, log)
    w.add_checkpoint(0, [], one, 2)
    same_size_other_root = sign(checkpoint_text(origin, 1, b"\x02" * 32), origin, log)
    with pytest.raises(WitnessRefused) as refused:
        w.add_checkpoint(1, [], same_size_other_root, 3)
    assert refused.value.status == 422
    (tmp_path / "s").write_text("{not json")
    with pytest.raises(WitnessRefused) as refused:
        Witness("w", keys["witness"].key, [], tmp_path / "s")
    assert refused.value.status == 500
    with pytest.raises(NoteError):
        open_note(one, [])


def test_dirk_key_public_prints_the_verifier_keys_verify_bundle_takes(
    tmp_path: Path, keys: dict[str, KeyFiles], capsys: pytest.CaptureFixture[str]
) -> None:
    path, state, bundle = tmp_path / "j.db", tmp_path / "witness.state", tmp_path / "flow.json"

    async def run() -> list[str]:
        async with signing_kernel(path, keys["log"]) as kernel:
            return await run_flows(kernel, [100])

    [dfid] = anyio.run(run)
    assert witness(path, keys, state, capsys)[0] == 0
    assert main(["export", "--db", str(path), "--flow", dfid, "--bundle", str(bundle)]) == 0
    capsys.readouterr()

    def dirk(*args: str) -> tuple[int, str, str]:
        status = main(list(args))
        out, err = capsys.readouterr()
        return status, out, err

    # The log's key as ed25519:..., the witness's as a C2SP verifier key under its name.
    status, out, _ = dirk("key", "public", "--key-file", str(keys["log"].private))
    assert status == 0 and out == keys["log"].public_text + "\n"
    name = "witness.example/w1"
    status, out, _ = dirk(
        "key", "public", "--key-file", str(keys["witness"].private), "--name", name
    )
    assert status == 0 and out.startswith(name + "+")
    vkey = tmp_path / "w.vkey"
    vkey.write_text(out)
    log = str(keys["log"].public)
    args = ["verify-bundle", str(bundle), "--public-key", log, "--quorum", "1"]
    assert dirk(*args)[0] == 1  # the cosignature is there, but no key to check it with
    assert dirk(*args, "--public-key", str(vkey))[0] == 0
    # Another name is another key ID: its cosignature does not count.
    other = tmp_path / "other.vkey"
    other.write_text(
        dirk("key", "public", "--key-file", str(keys["witness"].private), "--name", "w2")[1]
    )
    assert dirk(*args, "--public-key", str(other))[0] == 1

    # Bad input: a reason code, never a traceback; and never the private key's text.
    keys["log"].public.chmod(0o600)
    for argv, code in (
        (["--key-file", str(keys["log"].public)], "KEY_UNUSABLE"),
        (["--key-file", str(tmp_path / "none.pem")], "KEY_UNUSABLE"),
        (["--key-file", str(keys["witness"].private), "--name", "a b"], "BAD_ARGUMENT"),
    ):
        status, out, err = dirk("key", "public", *argv)
        assert status == 2 and out == "" and f"error: {code}:" in err, err
        assert "PRIVATE KEY" not in err
