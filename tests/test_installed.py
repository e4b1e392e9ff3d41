"""The library and its examples are installed; benchmarks and tests run from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def python_in(cwd: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_the_library_imports_from_anywhere(tmp_path: Path) -> None:
    ran = python_in(tmp_path, "import kernel, kernel.testing, agents_sdk, policies.trading")
    assert ran.returncode == 0, ran.stderr


def test_benchmarks_and_tests_are_not_installed(tmp_path: Path) -> None:
    for name in ("benchmarks", "tests"):
        ran = python_in(tmp_path, f"import {name}")
        assert ran.returncode == 1 and f"No module named '{name}'" in ran.stderr, name
