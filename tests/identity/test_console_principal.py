"""The console's flow page names whom the flow acts for; an old flow says none was recorded."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import anyio

from kernel.core.events import Principal
from tests.support import ROOT
from tests.support.browser import console_extra
from tests.support.mcp_kernel import memory_kernel, require_mcp

console_extra()
require_mcp()

from starlette.testclient import TestClient  # noqa: E402

from kernel.console._app import Settings, create_app  # noqa: E402
from kernel.console._auth import Gate  # noqa: E402
from kernel.mcp import Embedded  # noqa: E402

MALLORY = Principal(
    tenant="acme", user="mallory", email="<script>alert(1)</script>@x", vouched_by="token:ed"
)


def page_of(db: Path, dfid: str) -> str:
    gate = Gate(None)
    app = create_app(Settings(db=str(db)), gate, now_ns=lambda: 0)
    with TestClient(app, follow_redirects=False) as client:
        client.get("/login")
        nonce = client.cookies.get("dirk_console_login")
        client.post("/login", data={"nonce": nonce, "name": "ana", "secret": gate.token})
        return client.get(f"/flows/{dfid}").text


def test_the_flow_page_shows_the_principal_as_text(tmp_path: Path) -> None:
    db = tmp_path / "j.db"

    async def propose() -> str:
        async with memory_kernel(db) as kernel:
            policy = {"kind": "memory.query", "topic": "rooms"}
            return (await Embedded(kernel).propose("ide", policy, "look", 1.0, MALLORY)).dfid

    page = page_of(db, anyio.run(propose))
    assert "on behalf of <strong>mallory</strong>" in page
    assert "tenant <strong>acme</strong>" in page and "vouched by <code>token:ed</code>" in page
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page


def test_an_old_flow_page_says_no_principal_recorded(tmp_path: Path) -> None:
    db = tmp_path / "booking.db"
    shutil.copy(ROOT / "tests" / "golden" / "booking.db", db)
    with sqlite3.connect(db) as conn:
        [(dfid,)] = conn.execute("SELECT dfid FROM events WHERE dfid IS NOT NULL LIMIT 1")
    assert "no principal recorded" in page_of(db, dfid)
