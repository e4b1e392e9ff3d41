"""The console's audit of attempts: one tenant at a time, never another's row beside it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from kernel.core import events as ev
from kernel.core.events import Draft
from kernel.journal.opening import open_journal
from tests.attempts.journal import Written, write
from tests.attempts.test_attempts import CALLS
from tests.support.browser import console_extra

console_extra()

from starlette.testclient import TestClient  # noqa: E402

from kernel.console._app import Settings, create_app  # noqa: E402
from kernel.console._auth import Gate  # noqa: E402


async def _written(path: Path) -> Written:
    written = await write(path, CALLS)
    async with open_journal(path) as journal:
        await journal.append(
            [Draft(payload=ev.TenantDeclared(tenant=ev.TenantSpec(id=t))) for t in ("t-a", "t-b")]
        )
    return written


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    return anyio.run(_written, tmp_path_factory.mktemp("console") / "j.db")


@pytest.fixture
def client(written: Written) -> Iterator[TestClient]:
    gate = Gate(None)
    app = create_app(Settings(db=str(written.path)), gate)
    with TestClient(app, follow_redirects=False) as client:
        client.get("/login")
        nonce = client.cookies["dirk_console_login"]
        client.post("/login", data={"nonce": nonce, "name": "ana", "secret": gate.token})
        yield client


def test_the_page_asks_for_a_tenant_first_and_lists_the_declared_ones(client: TestClient) -> None:
    page = client.get("/audit/attempts")

    assert page.status_code == 200
    assert "choose one" in page.text and "<option >t-a</option>" in page.text
    assert 'id="attempts"' not in page.text
    assert 'href="/audit/attempts"' in client.get("/audit").text


@pytest.mark.parametrize("tenant", ["t-a", "t-b", ""])
def test_a_tenants_page_shows_exactly_its_attempts(
    client: TestClient, written: Written, tenant: str
) -> None:
    page = client.get("/audit/attempts", params={"tenant": tenant}).text

    wanted = [e for e in written.expected if e[0] == tenant]
    assert page.count('<tr class="attempt"') == len(wanted)
    assert page.count(f'data-tenant="{tenant}"') == len(wanted)
    others = {e[3] for e in written.expected if e[0] != tenant}
    assert not any(f"/flows/{trace}" in page for trace in others)
    assert f"{len(wanted)} attempts" in page
    if tenant == "":
        assert "(no principal recorded)" in page


def test_the_export_is_the_tenants_attempts_as_json_lines(
    client: TestClient, written: Written
) -> None:
    got = client.get("/audit/attempts.jsonl", params={"tenant": "t-a", "user": "alice"})

    assert got.status_code == 200
    rows = [json.loads(line) for line in got.text.splitlines()]
    wanted = [e for e in written.expected if e[:2] == ("t-a", "alice")]
    assert [(r["tenant"], r["user"], r["decision"], r["trace_id"]) for r in rows] == wanted
    assert client.get("/audit/attempts.jsonl").status_code == 400


def test_signed_out_there_is_no_audit(written: Written) -> None:
    with TestClient(create_app(Settings(db=str(written.path)), Gate(None))) as anonymous:
        assert (
            anonymous.get("/audit/attempts?tenant=t-a", follow_redirects=False).status_code == 303
        )
        assert (
            anonymous.get("/audit/attempts.jsonl?tenant=t-a", follow_redirects=False).status_code
            == 303
        )
