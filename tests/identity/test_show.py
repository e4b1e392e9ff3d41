"""``dirk show`` names whom a flow acts for; a flow from before principals says so."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import anyio
import pytest

from kernel.cli._main import main
from kernel.core.events import Principal
from tests.support import ROOT
from tests.support.mcp_kernel import memory_kernel, require_mcp

require_mcp()

from kernel.mcp import Embedded  # noqa: E402

ALICE = Principal(
    tenant="acme", user="alice", email="alice@acme.example", scopes=[], vouched_by="token:ed"
)


def show(capsys: pytest.CaptureFixture[str], db: Path, dfid: str) -> str:
    assert main(["show", dfid, "--db", str(db)]) == 0
    return capsys.readouterr().out


def test_show_prints_the_principal_of_a_flow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"

    async def propose() -> str:
        async with memory_kernel(db) as kernel:
            policy = {"kind": "memory.query", "topic": "rooms"}
            answer = await Embedded(kernel).propose("ide", policy, "look", 1.0, ALICE)
            assert answer.verdict == "ACCEPTED"
            return answer.dfid

    dfid = anyio.run(propose)
    out = show(capsys, db, dfid)
    assert "on behalf of: alice <alice@acme.example>, tenant acme (vouched by token:ed)" in out
    assert "tier interactive, chain -" in out
    assert "scopes claimed: (none)" in out


def test_an_old_flow_has_no_principal_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "booking.db"
    shutil.copy(ROOT / "tests" / "golden" / "booking.db", db)
    with sqlite3.connect(db) as conn:
        [(dfid,)] = conn.execute("SELECT dfid FROM events WHERE dfid IS NOT NULL LIMIT 1")
    out = show(capsys, db, dfid)
    assert "on behalf of: no principal recorded" in out
