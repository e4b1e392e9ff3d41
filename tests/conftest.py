"""The suite's shared set-ups, as fixtures.

``kernel`` is the most common one: a kernel on a real journal file
(``tmp_path / "j.db"``) with the suite's test pack, a fresh :class:`Bank` as
its adapter and a :class:`ManualClock`; ``bank`` and ``clock`` are the same
objects the kernel was given, for tests that look at the adapter or move time.

The suite runs in parallel (``pytest -n auto``, pytest-xdist) as well as in one process,
with the same results: each worker has its own temporary directories (pytest's basetemp per
worker), its own ports for the servers it starts (tests/support/ports.py), its own copies
of the module- and session-scoped fixtures (a server, a journal), and the environment a
serial run would have (:func:`_as_in_one_process`). Hypothesis' example database
(``.hypothesis/``) is shared by the workers: its writes are atomic renames and a test runs
in one worker at a time, so a failure one run found is replayed by the next, whichever
worker runs it; under ``CI=true`` Hypothesis' ``ci`` profile keeps no database at all.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Generator
from pathlib import Path

import pytest

from kernel import Kernel
from kernel.testing import ManualClock
from tests.support.helpers import Bank, kernel_for
from tests.support.operators import Keys, suite_keys

_TERMINAL = "DIRK_SUITE_TERMINAL"
"""The controller's LINES and COLUMNS ("" when unset), handed to the workers it starts."""


def _as_in_one_process() -> None:
    """Give an xdist worker the terminal size variables the run itself was started with.

    A worker finds ``LINES=24`` and ``COLUMNS=80`` in its environment that the shell had
    not set; the programs the tests start inherit them, and a ``dirk`` on a test's pseudo
    terminal 200 rows high then believes it is 24 rows high and pages what fits
    (tests/cli/test_cli_people.py). The controller (the process the person started) writes
    its own values down before it starts the workers; each worker puts them back.
    """
    if "PYTEST_XDIST_WORKER" not in os.environ:
        os.environ.setdefault(
            _TERMINAL, f"{os.environ.get('LINES', '')},{os.environ.get('COLUMNS', '')}"
        )
        return
    lines, _, columns = os.environ.get(_TERMINAL, ",").partition(",")
    for name, value in (("LINES", lines), ("COLUMNS", columns)):
        if value:
            os.environ[name] = value
        else:
            os.environ.pop(name, None)


_as_in_one_process()


def _sendable(text: str) -> str:
    """``text`` with any lone surrogate escaped (``\\ud800``), so it encodes as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Make a report a worker can send: its captured output without lone surrogates.

    Tests feed the kernel hostile text on purpose ("\\ud800" in an exception's message,
    tests/runtime/test_supervision.py), and the kernel logs it; an xdist worker sends each
    report to the controller as UTF-8, which has no lone surrogates, and an unsendable
    report crashes the whole run (INTERNALERROR). Escaped, the captured log still shows it.
    """
    report = yield
    report.sections = [(title, _sendable(text)) for title, text in report.sections]
    if report.longrepr is not None:
        text = str(report.longrepr)
        if _sendable(text) != text:  # a failure that quotes the hostile text: as plain text
            report.longrepr = _sendable(text)
    return report


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
