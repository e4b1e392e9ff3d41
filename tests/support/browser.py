"""Real processes and a real browser for the console's tests.

``running_console`` starts ``dirk console`` on a free 127.0.0.1 port (port 0)
and reads the address and the sign-in link it prints; ``running_kernel``
starts tests/support/console_kernel.py. ``chromium`` finds Debian's chromium
for Playwright (``executable_path``; never ``playwright install``, which
downloads browsers). Outside CI a missing chromium or Playwright skips the
test with the reason; under ``CI=true`` it fails it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from kernel.journal.codec import unpack
from tests.support.operators import with_keys

ROOT = Path(__file__).resolve().parent.parent.parent
START_TIMEOUT_S = 60.0


def unavailable(reason: str) -> None:
    """Skip the test for ``reason``, or fail it under CI, where everything must run."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI=true: the console's browser tests must run)")
    pytest.skip(reason)


def chromium() -> str:
    """The path of the system's chromium, or skip/fail the test."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    unavailable("no chromium on PATH (Debian: apt-get install chromium)")
    raise AssertionError  # unreachable: unavailable() raises


def console_extra() -> None:
    """Skip/fail when the console extra is not installed."""
    try:
        import jinja2  # noqa: F401
        import sse_starlette  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        unavailable(f"the console extra is not installed ({exc}): pip install -e '.[console]'")


@dataclass
class Console:
    """A running ``dirk console``."""

    url: str
    login: str
    """The sign-in link with this run's token (token mode), or the plain sign-in page."""
    proc: subprocess.Popen[str]
    banner: str = ""
    """The first line it printed (``dirk console for DB on URL``)."""


@contextmanager
def running_console(db: Path | str, *args: str) -> Iterator[Console]:
    """Run ``dirk console --db DB --port 0 ARGS``; yield it once it listens; stop it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernel", "console", "--db", str(db), "--port", "0", *args],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=with_keys(),  # the kernel trusts the suite's keys; the console signs with its own
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if not first.startswith("dirk console for"):
            proc.kill()
            raise AssertionError(f"console did not start: {first!r} {proc.communicate()[1]}")
        url = first.rsplit(" on ", 1)[1].strip().rstrip("/")
        login = url + "/login"
        if "--operators" not in args:
            login = proc.stdout.readline().split("sign in: ", 1)[1].strip()
        yield Console(url=url, login=login, proc=proc, banner=first)
    finally:
        stop(proc)


@dataclass
class Kernel:
    """A running tests/support/console_kernel.py."""

    proc: subprocess.Popen[str]
    effects: Path

    def open(self, what: str) -> str:
        """Open a flow (``invoice``, ``memo``, ``markup``); return its DFID once it escalated."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        dfid = self.proc.stdout.readline().strip()
        assert dfid, self.proc.stderr.read() if self.proc.stderr else "kernel ended"
        return dfid

    def effects_of(self, dfid: str) -> list[str]:
        """The adapter calls the kernel made for flow ``dfid`` (their keys, one a call)."""
        db = self.effects.with_suffix("")
        with closing(sqlite3.connect(db)) as conn:
            # A start's row, or the acceptance whose row carries it (ProposalAccepted.start).
            bodies = conn.execute(
                "SELECT body FROM events WHERE type IN ('ExecutionStarted', 'ProposalAccepted')"
                " AND dfid = ?",
                (dfid,),
            ).fetchall()
        payloads = [json.loads(unpack(body))["payload"] for (body,) in bodies]
        intents = [p.get("intent") or p.get("start") for p in payloads]
        keys = {intent["key"] for intent in intents if intent}
        if not self.effects.exists():
            return []
        return [k for k in self.effects.read_text(encoding="utf-8").splitlines() if k in keys]


@contextmanager
def running_kernel(db: Path | str, effects: Path | None = None, *args: str) -> Iterator[Kernel]:
    """Run tests/support/console_kernel.py on ``db`` with ``args``; yield it once ready; stop it.

    ``effects`` is where its adapter writes (``DB.effects`` by default; give it for a URL).
    """
    effects = effects or Path(str(db) + ".effects")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.console_kernel", str(db), str(effects), *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=with_keys(),  # the kernel trusts the suite's keys; the console signs with its own
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line != "ready\n":
            proc.kill()
            raise AssertionError(f"kernel did not start: {line!r} {proc.communicate()[1]}")
        yield Kernel(proc=proc, effects=effects)
    finally:
        if proc.poll() is None:
            try:
                _, err = proc.communicate(timeout=START_TIMEOUT_S)  # closes stdin: stop
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise
            assert proc.returncode == 0, err


def stop(proc: subprocess.Popen[str]) -> None:
    """Stop a server: SIGTERM, then SIGKILL if it does not end in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
