"""Evidence bundles: exported by ``dirk export``, checked by ``dirk verify-bundle`` and by the
hundred-line verifier docs/proofs.md shows, run as it is written there."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from kernel.cli import main
from tests.support.proofs import KeyFiles, run_flows, signing_kernel

DOC = Path(__file__).parents[2] / "docs" / "proofs.md"


def doc_verifier(folder: Path) -> Path:
    """The verifier of docs/proofs.md, extracted from the page into a file."""
    text = DOC.read_text(encoding="utf-8")
    [code] = re.findall(r"```python\n(# verify_bundle\.py.*?)```", text, re.DOTALL)
    assert 60 <= len(code.splitlines()) <= 120
    path = folder / "verify_bundle.py"
    path.write_text(code)
    return path


@pytest.fixture
def exported(tmp_path: Path) -> tuple[Path, KeyFiles, KeyFiles, str]:
    key, other = KeyFiles(tmp_path / "k", "log"), KeyFiles(tmp_path / "k", "other")
    path = tmp_path / "j.db"

    async def run() -> list[str]:
        async with signing_kernel(path, key) as kernel:
            return await run_flows(kernel, [100, 250])

    dfids = anyio.run(run)
    bundle = tmp_path / "flow.json"
    assert main(["export", "--db", str(path), "--flow", dfids[1], "--bundle", str(bundle)]) == 0
    return bundle, key, other, dfids[1]


def run_doc(verifier: Path, bundle: Path, key: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(verifier), str(bundle), str(key)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_bundle_verifies_with_dirk_and_with_the_documented_verifier(
    exported: tuple[Path, KeyFiles, KeyFiles, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bundle, key, other, dfid = exported
    capsys.readouterr()
    assert main(["verify-bundle", str(bundle), "--public-key", str(key.public)]) == 0
    assert f"flow {dfid}" in capsys.readouterr().out
    verifier = doc_verifier(tmp_path)
    done = run_doc(verifier, bundle, key.public)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"ok: flow {dfid}:")
    document = json.loads(bundle.read_text())
    assert document["packs"] and document["keys"][0]["key"] == key.public_text
    # Another key: neither accepts it.
    assert run_doc(verifier, bundle, other.public).returncode == 1
    assert main(["verify-bundle", str(bundle), "--public-key", str(other.public)]) == 1


@pytest.mark.parametrize("tamper", ["event", "proof", "seq", "dfid", "root"])
def test_a_tampered_bundle_fails_both_verifiers(
    exported: tuple[Path, KeyFiles, KeyFiles, str],
    tmp_path: Path,
    tamper: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bundle, key, _, _ = exported
    document = json.loads(bundle.read_text())
    entry = document["events"][-1]
    match tamper:
        case "event":
            body = base64.b64decode(entry["event"]).replace(b'"seq"', b'"seq" ', 1)
            entry["event"] = base64.b64encode(body).decode()
        case "proof":
            entry["proof"][0] = base64.b64encode(b"\x00" * 32).decode()
        case "seq":
            entry["seq"] += 1
        case "dfid":
            document["dfid"] = "another-flow"
        case "root":
            lines = document["checkpoint"].split("\n")
            lines[2] = base64.b64encode(b"\x01" * 32).decode()
            document["checkpoint"] = "\n".join(lines)
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(document))
    assert run_doc(doc_verifier(tmp_path), forged, key.public).returncode == 1
    assert main(["verify-bundle", str(forged), "--public-key", str(key.public)]) == 1
    assert "verify-bundle: FAILED" in capsys.readouterr().out


def test_a_flow_no_checkpoint_covers_yet_is_refused_with_a_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.helpers import kernel_for

    path = tmp_path / "j.db"

    async def run() -> list[str]:
        async with kernel_for(path) as kernel:
            return await run_flows(kernel, [1])

    [dfid] = anyio.run(run)
    status = main(["export", "--db", str(path), "--flow", dfid, "--bundle", str(tmp_path / "b")])
    assert status == 1 and "NO_CHECKPOINT" in capsys.readouterr().err
    key = KeyFiles(tmp_path / "k", "log")
    assert main(["checkpoint", "--db", str(path), "--key-file", str(key.private)]) == 0
    assert main(["export", "--db", str(path), "--flow", dfid, "--bundle", str(tmp_path / "b")]) == 0
