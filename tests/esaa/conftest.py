"""Every test here works a real git repository: without git they skip (and fail under CI)."""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture(autouse=True)
def _git() -> None:
    """Skip the test when no ``git`` is on PATH, or fail it under CI, where everything runs."""
    if shutil.which("git") is None:
        reason = "git is not installed: the roadmap's adapter works a real repository"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI=true: every test must run)")
        pytest.skip(reason)
