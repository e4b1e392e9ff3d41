"""Every console page is axe-core clean in a real browser, in the light and the dark scheme.

axe-core (from npm, tests/support/axe.py) is injected into each page of a running
console over a running kernel: the sign-in page, the queue, a review page (with its
modify preview), the flows, the rules, the agents and the audit page.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Literal

import anyio
import pytest

from tests.support.axe import axe_script, violations
from tests.support.browser import (
    Console,
    Kernel,
    chromium,
    console_extra,
    running_console,
    running_kernel,
    unavailable,
)

try:
    from playwright.async_api import Browser, Page, async_playwright, expect
except ImportError:  # checked per test: skipped outside CI, a failure under CI
    async_playwright = None  # type: ignore[assignment]

# Playwright's async API runs on asyncio only.
pytestmark = pytest.mark.parametrize("anyio_backend", ["asyncio"])

RULES = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Kernel, Console]]:
    console_extra()
    db = tmp_path_factory.mktemp("console-axe") / "j.db"
    with running_kernel(db) as kernel, running_console(db, "--poll", "0.05") as console:
        yield kernel, console


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if async_playwright is None:
        unavailable("Playwright is not installed: pip install playwright")
    path = chromium()
    async with async_playwright() as p:
        launched = await p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            await launched.close()


async def checked(page: Page, what: str) -> list[str]:
    """axe's violations on the page as it is now, each line naming the page."""
    await page.add_script_tag(path=str(axe_script()))
    result = await page.evaluate(
        "async (tags) => await axe.run(document,"
        " {runOnly: {type: 'tag', values: tags}, resultTypes: ['violations']})",
        RULES,
    )
    return [f"{what}: {line}" for line in violations(result)]


@pytest.mark.parametrize("scheme", ["light", "dark"])
async def test_every_page_is_axe_clean(
    setup: tuple[Kernel, Console], browser: Browser, scheme: Literal["light", "dark"]
) -> None:
    kernel, console = setup
    invoice = await anyio.to_thread.run_sync(kernel.open, "invoice")
    await anyio.to_thread.run_sync(kernel.open, "memo")
    # The console's CSP allows this origin's scripts only: axe is injected past it.
    context = await browser.new_context(
        bypass_csp=True,
        color_scheme=scheme,
        viewport={"width": 1200, "height": 900},
    )
    page = await context.new_page()
    found: list[str] = []
    await page.goto(console.login)
    found += await checked(page, "sign-in")
    await page.fill("input[name=name]", "ana")
    await page.click("button[type=submit]")
    await expect(page.locator("#operator")).to_have_text("ana")
    for path in (
        "/",
        f"/flows/{invoice}",
        "/flows",
        "/flows?q=clerk",
        "/rules",
        "/agents",
        "/audit",
    ):
        await page.goto(console.url + path)
        found += await checked(page, path)
    await page.goto(f"{console.url}/flows/{invoice}")
    modify = page.locator("form.modify")
    await modify.get_by_label("amount_cents").fill("900")
    await modify.get_by_role("button", name="Show the change").click()
    await expect(page.locator("#diff")).to_be_visible()
    found += await checked(page, "modify preview")
    # The toggle overrides the system's scheme, and the page stays clean in it.
    other = "light" if scheme == "dark" else "dark"
    await page.goto(f"{console.url}/theme?mode={other}&back=/")
    await expect(page.locator("html")).to_have_attribute("data-theme", other)
    found += await checked(page, f"queue ({other} by the toggle)")
    await context.close()
    assert found == [], "\n".join(found)
