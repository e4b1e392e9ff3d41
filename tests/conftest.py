"""The suite's shared set-ups, as fixtures.

``kernel`` is the most common one: a kernel on a real journal file
(``tmp_path / "j.db"``) with the suite's test pack, a fresh :class:`Bank` as
its adapter and a :class:`ManualClock`; ``bank`` and ``clock`` are the same
objects the kernel was given, for tests that look at the adapter or move time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kernel import Kernel
from kernel.testing import ManualClock
from tests.support.helpers import Bank, kernel_for
from tests.support.operators import Keys, suite_keys


@pytest.fixture
def bank() -> Bank:
    """The bank the ``kernel`` fixture's kernel calls."""
    return Bank()


@pytest.fixture
def clock() -> ManualClock:
    """The clock the ``kernel`` fixture's kernel runs on."""
    return ManualClock()


@pytest.fixture
async def kernel(tmp_path: Path, bank: Bank, clock: ManualClock) -> AsyncIterator[Kernel]:
    """An open kernel on ``tmp_path / "j.db"`` with the test pack, ``bank`` and ``clock``."""
    async with kernel_for(tmp_path / "j.db", bank=bank, clock=clock) as opened:
        yield opened


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """The kernel runs on asyncio (aiosqlite): pin it, even where trio is installed."""
    return "asyncio"


@pytest.fixture
def operator_keys(monkeypatch: pytest.MonkeyPatch) -> Keys:
    """Keys for the suite's operators, the console and the MCP server, in the environment.

    ``DIRK_KEYRING`` and ``DIRK_KEY`` point at them, so kernels (in this process or
    started from it) trust them and ``dirk decide`` and the other clients sign with them.
    They are the suite's one set (tests.support.operators.suite_keys): a kernel or a
    console a module started before this test's environment was set uses them too.
    """
    keys = suite_keys()
    for name, value in keys.env().items():
        monkeypatch.setenv(name, value)
    return keys
