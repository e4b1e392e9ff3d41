"""The console's drift page: each breach with its window, and the demotion and restoration."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from kernel.testing import ManualClock
from tests.drift.test_live import WATCHED, pay
from tests.support.approvals_domain import pay_kernel, sender
from tests.support.browser import console_extra

console_extra()

from starlette.testclient import TestClient  # noqa: E402

from kernel.console._app import Settings, create_app  # noqa: E402
from kernel.console._auth import Gate  # noqa: E402
from tests.support.console_client import signed_in  # noqa: E402


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("drift-console") / "j.db"

    async def record() -> None:
        clock = ManualClock()
        async with pay_kernel(path, [WATCHED], clock=clock) as kernel:
            await kernel.register(sender())
            for cents in [100] * 10 + [0] * 8:  # the invoices go bad: refused
                await pay(kernel, clock, cents)
            await kernel.wait_quiet()  # the watch has judged, its demotion is on record
            await kernel.set_agent_status("clerk", "ACTIVE", operator="ana", reason="rolled back")

    anyio.run(record)
    return path


@pytest.fixture
def client(journal: Path) -> Iterator[TestClient]:
    yield from signed_in(journal)


def test_the_page_shows_the_breach_the_demotion_and_the_restoration(client: TestClient) -> None:
    page = client.get("/audit/drift")
    assert page.status_code == 200
    text = page.text
    assert text.count('class="breach"') == 1
    assert "refusals (pay@" in text and "agent clerk" in text and "refusal_rate" in text
    assert text.count('class="change"') == 2
    assert "<td>PASSIVE</td><td>drift</td>" in text
    assert "<td>ACTIVE</td><td>ana</td><td>rolled back</td>" in text
    assert 'href="/audit/drift"' in client.get("/audit").text


def test_without_a_login_the_page_is_closed(journal: Path) -> None:
    app = create_app(Settings(db=str(journal)), Gate(None))
    with TestClient(app, follow_redirects=False) as anonymous:
        answer = anonymous.get("/audit/drift")
    assert answer.status_code in (302, 303, 401)
    assert "clerk" not in answer.text
