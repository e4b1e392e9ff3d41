"""The release as a user gets it: the sdist holds the whole checkout, its metadata is complete.

The sdist is built as ``python -m build --sdist`` builds it (check-manifest's question,
asked here without it): every file ``git ls-files`` lists must be in it, and nothing
else but what the build adds (PKG-INFO, setup.cfg, the egg-info). .ci/run then
installs that sdist into a fresh virtual environment and imports its tests.
"""

from __future__ import annotations

import email
import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from kernel.registry import KERNEL_VERSION
from tests.support import ROOT

BUILD_ADDS = {"PKG-INFO", "setup.cfg"}
"""What the build writes into an sdist beside the checkout's files (and the egg-info)."""


def _setuptools_new_enough() -> bool:
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return False
    return major >= 77


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist of this checkout, built by ``python -m build --sdist``."""
    if importlib.util.find_spec("build") is None:
        pytest.skip("the build package is missing: pip install -e '.[test]'")
    out = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "build", "--sdist", "--outdir", str(out)]
    # Without isolation when this environment can build it (no download), else as pip would.
    if _setuptools_new_enough():
        command.append("--no-isolation")
    built = subprocess.run(
        [*command, str(ROOT)], capture_output=True, text=True, timeout=600, check=False
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    [archive] = out.glob("*.tar.gz")
    return archive


def _members(archive: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive) as tar:
        return {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name}


def test_the_sdist_holds_every_file_of_the_checkout_and_nothing_else(sdist: Path) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an unpacked sdist has no file list to compare with)")
    listed = subprocess.run(
        # Tracked, and new files not ignored: what the next commit may hold.
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    tracked = {name for name in listed if name and (ROOT / name).is_file()}
    files = {name for name, m in _members(sdist).items() if m.isfile()}
    assert sorted(tracked - files) == []
    extra = {f for f in files - tracked if f not in BUILD_ADDS and ".egg-info/" not in f}
    # An ignored file in a grafted folder (a stray journal, a cache) would show here.
    assert sorted(extra) == []
    # What the tests need to run from the sdist is there: support packages, golden journals.
    assert {"tests/support/__init__.py", "tests/support/hostile.py", "mkdocs.yml"} <= files
    assert any(f.startswith("tests/golden/") and f.endswith(".db") for f in files)


def test_the_metadata_names_version_license_and_classifiers(sdist: Path) -> None:
    with tarfile.open(sdist) as tar:
        [info] = [
            m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")
        ]
        extracted = tar.extractfile(info)
        assert extracted is not None
        meta = email.message_from_bytes(extracted.read())
    assert meta["Name"] == "dir-kernel"
    assert meta["Version"] == KERNEL_VERSION == "0.2.0"
    # PEP 639: an SPDX expression and the file it names, no License classifier.
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    classifiers = meta.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]
    assert meta["Requires-Python"] == ">=3.11"
    extras = set(meta.get_all("Provides-Extra") or [])
    named = {"docs", "mcp", "console", "postgres", "nats", "otlp", "test", "lint", "frameworks"}
    assert named <= extras
