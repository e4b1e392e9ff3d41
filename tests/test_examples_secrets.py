"""The examples on a keyed journal and on PostgreSQL: verified, and no secret printed.

A kernel keys a new journal from ``DIRK_CHAIN_KEY``; ``verify_journal`` reads the same
variable, so the examples' summary says ``verified`` for the journal they just wrote
(it said False before, and they exited 1). A PostgreSQL URL with a password is shown
without it, as ``dirk`` shows it (trust-and-edges.md, D10).
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest

from examples import booking, trading
from kernel.audit import verify_journal
from kernel.journal.head import CHAIN_KEY_ENV
from tests.support.postgres import PostgresServer, postgres_server  # noqa: F401

KEY = "an-example-chain-key-of-32-bytes"
PASSWORD = "s3cret-Pa55word"


def run(
    module: Any, db: str, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, dict[str, Any], str]:
    """Run an example in this process; return its status, its JSON summary, all it printed."""
    code = module.main(["--db", db, "--json", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out.strip().splitlines()[-1]), out + err


@pytest.mark.parametrize("module", [trading, booking], ids=["trading", "booking"])
def test_an_example_on_a_journal_keyed_from_the_environment_says_verified(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    module: Any,
) -> None:
    monkeypatch.setenv(CHAIN_KEY_ENV, KEY)
    db = tmp_path / "keyed.db"
    args = ("--minutes", "40") if module is trading else ()
    code, summary, printed = run(module, str(db), capsys, *args)
    assert code == 0 and summary["verified"] is True
    assert KEY not in printed
    with closing(sqlite3.connect(db)) as conn:
        assert dict(conn.execute("SELECT key, value FROM meta"))["chain"] == "hmac-sha256"
    # The library reads the key from the environment; without it the keyed journal fails.
    assert anyio.run(verify_journal, db).ok
    monkeypatch.delenv(CHAIN_KEY_ENV)
    assert not anyio.run(verify_journal, db).ok


def test_an_example_on_postgresql_never_prints_the_password(
    postgres_server: PostgresServer,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = postgres_server.new_url().replace("postgres@", f"postgres:{PASSWORD}@", 1)
    code, summary, printed = run(booking, url, capsys)
    assert code == 0 and summary["verified"] is True
    assert PASSWORD not in printed
    assert "postgres:***@" in summary["verify"]
