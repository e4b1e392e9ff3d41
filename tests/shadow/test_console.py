"""The console's shadow page: each candidate's report, as ``dirk shadow report`` reads it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from kernel.audit import open_journal
from kernel.audit.shadow import digest, live_report
from tests.shadow.test_shadow import CANDIDATE, kernel, run_flows, trader
from tests.support.browser import console_extra

console_extra()

from starlette.testclient import TestClient  # noqa: E402

from tests.support.console_client import signed_in  # noqa: E402


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shadow-console") / "j.db"

    async def record() -> None:
        async with kernel(path) as k:
            await k.register(trader([4, 1, 3]))
            await k.load_shadow(CANDIDATE, operator="ana", reason="try")
            await run_flows(k, 3)
            await k.retire_shadow("desk", operator="ana", reason="seen enough")

    anyio.run(record)
    return path


@pytest.fixture
def client(journal: Path) -> Iterator[TestClient]:
    yield from signed_in(journal)


async def _report(journal: Path) -> tuple[str, int, list[str]]:
    async with open_journal(journal, readonly=True) as j:
        report = await live_report(j)
    return digest(report), report.start, [d.dfid for d in report.differences]


def test_the_page_shows_the_report_with_its_flows_and_digest(
    client: TestClient, journal: Path
) -> None:
    found, loaded, dfids = anyio.run(_report, journal)
    page = client.get("/audit/shadows")
    assert page.status_code == 200
    assert page.text.count('<tr class="shadow"') == 1
    assert "retired at #" in page.text and "desk 1.1.0" in page.text
    assert page.text.count('<tr class="difference"') == len(dfids) == 2
    assert all(f'href="/flows/{dfid}"' in page.text for dfid in dfids)
    assert f'<code id="digest">{found}</code>' in page.text
    assert 'href="/audit/shadows"' in client.get("/audit").text
    exported = client.get("/audit/shadows.json", params={"shadow": str(loaded)}).json()
    assert exported["digest"] == found and exported["differed"] == 2


@pytest.mark.parametrize("shadow", ["999", "-1", "x", "\u0661", "9" * 40])
def test_a_shadow_that_is_not_there_is_no_report(client: TestClient, shadow: str) -> None:
    page = client.get("/audit/shadows", params={"shadow": shadow})
    assert (page.status_code == 200 and 'id="differences"' not in page.text) or shadow == "x"
    assert client.get("/audit/shadows.json", params={"shadow": "999"}).status_code == 404
