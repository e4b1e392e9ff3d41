"""The tests here act as operators through the inbox: the suite's operators have keys."""

from __future__ import annotations

import pytest

from tests.support.operators import Keys


@pytest.fixture(autouse=True)
def _keys(operator_keys: Keys) -> Keys:
    """Every test here runs with the suite's keys in the environment (``operator_keys``)."""
    return operator_keys
