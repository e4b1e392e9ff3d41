"""The optional parts the suite tests only where their extra is installed: the agent frameworks.

The test extra leaves the frameworks out (each is its own extra, pinned to the minor its
adapter was written against, and together they weigh more than the rest of the suite's
dependencies). Outside CI a test whose framework is missing skips with the extra that brings
it; under ``CI=true`` (``.ci/run`` installs ``frameworks``) the same absence fails it, as a
missing server does (tests/support/postgres.py).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def under_ci() -> bool:
    """Whether this run is CI's, where every optional part must be tested."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(module: str, extra: str) -> ModuleType:
    """Import ``module``, or skip (outside CI) or fail (under CI) for want of ``extra``.

    Works at a module's top (the whole module is skipped or fails to collect) and inside
    a test.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        why = f"{module} is not installed ({exc}): pip install -e '.[{extra}]'"
        if under_ci():
            pytest.fail(f"CI needs the {extra} extra: {why}", pytrace=False)
        pytest.skip(why, allow_module_level=True)
