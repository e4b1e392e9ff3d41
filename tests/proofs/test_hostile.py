"""Any input at the proof commands' entry points: a clear refusal, never a traceback.

A bundle, a key file, a checkpoint kept elsewhere and a flow id come from outside; each
is drawn from tests/support/hostile.py (lone surrogates, C0/C1 controls, huge numbers,
deep nesting) and handed to the real CLI in process.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings

from kernel.cli import main
from kernel.core.notes import NoteError
from kernel.proofs.bundle import BundleError, verify_bundle
from kernel.proofs.check import read_keys
from tests.support.hostile import deeply_nested_json, hostile_text, hostile_values
from tests.support.proofs import KeyFiles, run_flows, signing_kernel

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, KeyFiles, str]:
    folder = tmp_path_factory.mktemp("hostile")
    key = KeyFiles(folder, "log")
    path = folder / "j.db"

    async def run() -> list[str]:
        async with signing_kernel(path, key) as kernel:
            return await run_flows(kernel, [10])

    [dfid] = anyio.run(run)
    return path, key, dfid


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        status = main(args)
    except SystemExit as exc:  # argparse, for an argument it cannot take
        status = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return status, out + err


@SETTINGS
@given(hostile_values())
def test_a_hostile_bundle_is_refused_by_dirk_and_by_the_library(
    signed: tuple[Path, KeyFiles, str],
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    value: object,
) -> None:
    _, key, _ = signed
    keys = read_keys(key.public_text)
    for document in (value, {"format": "dirk-bundle/v1", "checkpoint": value, "dfid": value,
                             "events": [value], "packs": value}):  # fmt: skip
        try:
            data = json.dumps(document).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError):
            continue
        with pytest.raises(BundleError):
            verify_bundle(data, keys)
        bundle = tmp_path_factory.mktemp("b") / "bundle.json"
        bundle.write_bytes(data)
        status, _ = run(["verify-bundle", str(bundle), "--public-key", str(key.public)], capsys)
        assert status == 1
    with pytest.raises(BundleError):
        verify_bundle(deeply_nested_json(5_000).encode(), keys)


@SETTINGS
@given(hostile_text(max_size=120))
def test_hostile_keys_checkpoints_and_ids_are_refused_in_one_line(
    signed: tuple[Path, KeyFiles, str],
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    text: str,
) -> None:
    path, key, _ = signed
    folder = tmp_path_factory.mktemp("h")
    hostile = folder / "hostile.txt"
    hostile.write_bytes(text.encode("utf-8", "surrogatepass"))
    with pytest.raises(NoteError):
        read_keys(text + "\nnot a key")
    status, said = run(["verify", "--db", str(path), "--public-key", str(hostile)], capsys)
    assert status in (1, 2) and said
    status, said = run(
        [
            "verify",
            "--db",
            str(path),
            "--public-key",
            str(key.public),
            "--checkpoint",
            str(hostile),
        ],
        capsys,
    )
    assert status in (1, 2) and said
    assert run(["prove", "--db", str(path), "--flow", text], capsys)[0] in (1, 2)
    assert run(["export", "--db", str(path), "--flow", text, "--bundle", str(folder / "b")],
               capsys)[0] in (1, 2)  # fmt: skip


def test_prove_with_any_numbers_never_raises(
    signed: tuple[Path, KeyFiles, str], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, _ = signed
    for old, new in ((0, 0), (-1, 5), (5, 3), (1, 2**70), (2**63, 2**64), (3, 3)):
        status, _ = run(["prove", "--db", str(path), "--consistency", str(old), str(new)], capsys)
        assert status in (0, 2)
    for seq in (0, -5, 2**64):
        assert run(["prove", "--db", str(path), "--event", str(seq)], capsys)[0] in (1, 2)
