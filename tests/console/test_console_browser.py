"""The operator console in a real browser: Playwright driving Debian's chromium.

One kernel (tests/support/console_kernel.py) and one ``dirk console`` run as
separate processes on the same journal for the whole module; each test opens
its own flows. Screenshots of the main pages go to ``$DIRK_SCREENSHOTS`` (a
temporary directory unless set), to be looked at.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from kernel.inbox import DecideRequest
from kernel.inbox.requests import decode_row
from kernel.journal.inbox_store import open_inbox
from tests.support.browser import (
    ROOT,
    Console,
    Kernel,
    chromium,
    console_extra,
    running_console,
    running_kernel,
    unavailable,
)
from tests.support.console_kernel import MARKUP
from tests.support.postgres import PostgresServer, postgres_server  # noqa: F401

try:
    from playwright.async_api import Browser, Page, async_playwright, expect
except ImportError:  # checked per test: skipped outside CI, a failure under CI
    async_playwright = None  # type: ignore[assignment]

# Playwright's async API runs on asyncio only.
pytestmark = pytest.mark.parametrize("anyio_backend", ["asyncio"])

RED = "rgb(198, 40, 40)"
WAIT_MS = 15_000


if async_playwright is not None:
    # Two shared cores under CI: give every expectation the time a kernel round trip may take.
    expect.set_options(timeout=WAIT_MS)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Kernel, Console]]:
    console_extra()
    db = tmp_path_factory.mktemp("console") / "j.db"
    with running_kernel(db) as kernel, running_console(db, "--poll", "0.05") as console:
        yield kernel, console


@pytest.fixture(scope="module")
def shots() -> Path:
    where = os.environ.get("DIRK_SCREENSHOTS") or tempfile.mkdtemp(prefix="dirk-console-shots-")
    path = Path(where)
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if async_playwright is None:
        unavailable("Playwright is not installed: pip install playwright")
    path = chromium()
    async with async_playwright() as p:
        # As root (CI, containers) chromium's sandbox cannot start: --no-sandbox.
        launched = await p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            await launched.close()


async def signed_in(browser: Browser, console: Console, name: str = "ana") -> Page:
    page = await browser.new_page(viewport={"width": 1200, "height": 900})
    await page.goto(console.login)
    await page.fill("input[name=name]", name)
    await page.click("button[type=submit]")
    await expect(page.locator("#operator")).to_have_text(name)
    return page


async def opened(kernel: Kernel, what: str) -> str:
    return await anyio.to_thread.run_sync(kernel.open, what)


def count(db: Path, type_: str, dfid: str) -> int:
    with closing(sqlite3.connect(db)) as conn:
        ((n,),) = conn.execute(
            "SELECT count(*) FROM events WHERE type = ? AND dfid = ?", (type_, dfid)
        ).fetchall()
    return int(n)


def inbox_rows(db: Path, dfid: str) -> int:
    """How many decisions on ``dfid`` the inbox holds, taken or not."""
    with open_inbox(str(db), readonly=True) as store:
        rows = store.rows(pending=False)
    decisions = [decode_row(row.body).request for row in rows]
    return sum(1 for r in decisions if isinstance(r, DecideRequest) and r.dfid == dfid)


async def test_the_queue_shows_high_impact_first_and_unmistakably(
    setup: tuple[Kernel, Console], browser: Browser, shots: Path
) -> None:
    kernel, console = setup
    memo = await opened(kernel, "memo")
    invoice = await opened(kernel, "invoice")
    page = await signed_in(browser, console)
    high, low = page.locator(f"#esc-{invoice}"), page.locator(f"#esc-{memo}")
    await expect(high).to_have_class("esc HIGH_IMPACT")
    await expect(high).to_have_css("border-top-color", RED)
    await expect(high).to_have_css("border-top-width", "4px")
    await expect(high.locator(".impact")).to_have_css("background-color", RED)
    await expect(high.locator(".code")).to_have_text("LOW_CONFIDENCE")
    await expect(high).to_contain_text("confidence 0.2 is below the threshold 0.5")
    await expect(high).to_contain_text("clerk")
    await expect(high).to_contain_text("expires")
    await expect(low).to_have_class("esc LOW_IMPACT")
    await expect(low).not_to_have_css("border-top-color", RED)
    # HIGH_IMPACT first, though the memo waited longer.
    order = await page.locator("#queue .esc").evaluate_all("cards => cards.map(c => c.id)")
    assert order.index(f"esc-{invoice}") < order.index(f"esc-{memo}")
    await page.screenshot(path=shots / "console-queue.png", full_page=True)


async def test_a_new_escalation_appears_without_a_reload(
    setup: tuple[Kernel, Console], browser: Browser
) -> None:
    kernel, console = setup
    page = await signed_in(browser, console)
    await page.evaluate("window.stillTheSamePage = true")
    dfid = await opened(kernel, "invoice")
    await expect(page.locator(f"#esc-{dfid}")).to_be_visible(timeout=WAIT_MS)
    assert await page.evaluate("window.stillTheSamePage === true")


async def test_high_impact_approval_takes_the_typed_hash_and_executes_once(
    setup: tuple[Kernel, Console], browser: Browser, shots: Path
) -> None:
    kernel, console = setup
    dfid = await opened(kernel, "invoice")
    db = Path(kernel.effects.with_suffix(""))
    watcher = await signed_in(browser, console, "bo")  # another operator, on the queue
    await expect(watcher.locator(f"#esc-{dfid}")).to_be_visible()
    page = await signed_in(browser, console)
    await page.goto(f"{console.url}/flows/{dfid}")
    await page.screenshot(path=shots / "console-review.png", full_page=True)
    approve = page.locator("form.approve")

    await approve.locator("input[name=reason]").fill("checked the invoice")
    await approve.locator("button").click()
    await expect(page.locator("#refusal")).to_have_attribute("data-code", "CONFIRMATION_REQUIRED")

    await approve.locator("input[name=confirm]").fill("0000000000")
    await approve.locator("input[name=reason]").fill("checked the invoice")
    await approve.locator("button").click()
    await expect(page.locator("#refusal")).to_have_attribute("data-code", "ACTION_MISMATCH")
    assert inbox_rows(db, dfid) == 0  # nothing reached the kernel

    short = (await page.locator(".why ~ .columns code.hash").text_content() or "").strip()
    await approve.locator("input[name=confirm]").fill(short)
    await approve.locator("input[name=reason]").fill("checked the invoice")
    await approve.locator("button").click()
    # The kernel, a separate process, takes the row and executes; the page follows live.
    await expect(page.locator("#status strong")).to_have_text("CLOSED", timeout=WAIT_MS)
    await expect(page.locator(".decided")).to_contain_text("approve by ana")
    await expect(page.locator("#forms")).to_contain_text("No decision is asked for")
    # The decided card leaves the other operator's open page too.
    await expect(watcher.locator(f"#esc-{dfid}")).to_have_count(0, timeout=WAIT_MS)
    assert len(kernel.effects_of(dfid)) == 1
    assert count(db, "ExecutionSucceeded", dfid) == 1
    assert count(db, "HumanDecided", dfid) == 1
    assert inbox_rows(db, dfid) == 1


async def test_a_modification_is_judged_again(
    setup: tuple[Kernel, Console], browser: Browser
) -> None:
    kernel, console = setup
    dfid = await opened(kernel, "invoice")
    page = await signed_in(browser, console)
    await page.goto(f"{console.url}/flows/{dfid}")
    modify = page.locator("form.modify")
    # One field per parameter, prefilled with the proposal's; the preview shows the change.
    await expect(modify.get_by_label("account")).to_have_value("acc-1")
    await modify.get_by_label("amount_cents").fill("900")
    await modify.get_by_role("button", name="Show the change").click()
    diff = page.locator("#diff")
    await expect(diff.locator("tbody tr")).to_have_count(1)
    await expect(diff.locator("td.now")).to_have_text("900")
    await expect(diff.locator("td.was")).not_to_have_text("900")
    modify = page.locator("form.modify")
    await modify.locator("input[name=reason]").fill("pay only the first instalment")
    await modify.get_by_role("button", name="Modify", exact=True).click()
    story = page.locator("ol.narrative")
    await expect(story).to_contain_text("human modification", timeout=WAIT_MS)
    await expect(story).to_contain_text('"amount_cents": 900')
    # The DIM's verdict on the human's parameters is shown, then what followed.
    await expect(story).to_contain_text("ACCEPTED by a human", timeout=WAIT_MS)
    await expect(page.locator("#status strong")).to_have_text("CLOSED", timeout=WAIT_MS)


async def test_a_rejection_closes_the_flow(setup: tuple[Kernel, Console], browser: Browser) -> None:
    kernel, console = setup
    dfid = await opened(kernel, "memo")
    page = await signed_in(browser, console)
    await page.goto(f"{console.url}/flows/{dfid}")
    reject = page.locator("form.reject")
    await reject.locator("input[name=reason]").fill("the rates do not change")
    await reject.locator("button").click()
    await expect(page.locator("#status strong")).to_have_text("ABORTED", timeout=WAIT_MS)
    await expect(page.locator("#status")).to_contain_text("HUMAN_REJECTED")
    await expect(page.locator(".decided")).to_contain_text("reject by ana")
    assert kernel.effects_of(dfid) == []


async def test_markup_in_an_explanation_is_shown_as_text(
    setup: tuple[Kernel, Console], browser: Browser, shots: Path
) -> None:
    kernel, console = setup
    dfid = await opened(kernel, "markup")
    page = await signed_in(browser, console)
    await page.goto(f"{console.url}/flows/{dfid}")
    await expect(page.locator("#explain")).to_have_text(MARKUP)
    assert await page.locator("#explain script, #explain img, #explain b").count() == 0
    assert await page.title() != "pwned"
    assert await page.evaluate("document.title") not in ("pwned", "1")
    await page.screenshot(path=shots / "console-markup.png", full_page=True)


async def test_the_other_pages_render(
    setup: tuple[Kernel, Console], browser: Browser, shots: Path
) -> None:
    kernel, console = setup
    await opened(kernel, "invoice")
    page = await signed_in(browser, console)
    await page.goto(f"{console.url}/flows?status=ESCALATED")
    await expect(page.locator("table.flows tbody tr").first).to_contain_text("ESCALATED")
    await page.screenshot(path=shots / "console-flows.png", full_page=True)
    await page.goto(f"{console.url}/agents")
    await expect(page.locator("#agent-clerk .agent-status")).to_have_text("ACTIVE")
    await page.screenshot(path=shots / "console-agents.png", full_page=True)
    await page.goto(f"{console.url}/rules")
    await expect(page.locator("h1")).to_have_text("The rulebook")


def example_journal(name: str, db: Path) -> None:
    args = ["--minutes", "40", "--operator", "none"] if name == "trading" else []
    subprocess.run(
        [sys.executable, "-m", f"examples.{name}", "--seed", "1", "--db", str(db), *args],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )


def decided(db: Path) -> list[str]:
    with closing(sqlite3.connect(db)) as conn:
        got = conn.execute("SELECT dfid FROM events WHERE type = 'HumanDecided'").fetchall()
    return [dfid for (dfid,) in got]


@pytest.mark.parametrize("example", ["trading", "booking"])
async def test_the_console_reads_the_examples_journals_with_no_kernel_running(
    example: str, browser: Browser, shots: Path, tmp_path: Path
) -> None:
    console_extra()
    db = tmp_path / f"{example}.db"
    await anyio.to_thread.run_sync(example_journal, example, db)
    with running_console(db) as console:
        page = await signed_in(browser, console)
        cards = page.locator("#queue .esc")
        if example == "trading":  # --operator none: its escalations wait
            await expect(cards.first).to_be_visible()
            assert await cards.count() >= 1
            await expect(cards.first).to_have_css("border-top-color", RED)
            await page.screenshot(path=shots / f"console-{example}-queue.png", full_page=True)
            await cards.first.locator("a.review").click()
            await expect(page.locator("form.approve input[name=confirm]")).to_be_visible()
            await page.screenshot(path=shots / f"console-{example}-review.png", full_page=True)
        else:  # the booking story's operator decided in the script: nothing waits
            await expect(page.locator("#queue .empty")).to_be_visible()
            (dfid, *_) = decided(db)
            await page.goto(f"{console.url}/flows/{dfid}")
            await expect(page.locator(".decided")).to_contain_text("approve by rui")
            await expect(page.locator("#forms")).to_contain_text("No decision is asked for")
        await page.goto(f"{console.url}/flows")
        assert await page.locator("table.flows tbody tr").count() > 1
        await page.screenshot(path=shots / f"console-{example}-flows.png", full_page=True)


async def test_on_postgres_the_page_follows_by_notification(
    postgres_server: PostgresServer,  # noqa: F811
    browser: Browser,
    tmp_path: Path,
) -> None:
    console_extra()
    url = postgres_server.new_url()
    # trust authentication ignores the password, which must show nowhere.
    url = url.replace("postgres@", "postgres:hush-hush@", 1)
    with (
        running_kernel(url, effects=tmp_path / "effects") as kernel,
        # SQLite's poll interval at its longest: anything live within WAIT_MS came by NOTIFY.
        running_console(url, "--poll", "60") as console,
    ):
        assert "hush-hush" not in console.banner and "postgresql://" in console.banner
        page = await signed_in(browser, console)
        await page.evaluate("window.stillTheSamePage = true")
        dfid = await opened(kernel, "invoice")
        card = page.locator(f"#esc-{dfid}")
        await expect(card).to_be_visible()
        await expect(card).to_have_class("esc HIGH_IMPACT")
        # `dirk decide`, another process, queues a rejection; the kernel applies it.
        decide = [sys.executable, "-m", "kernel", "decide", dfid, "--db", url, "--reject"]
        done = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [*decide, "--operator", "bo", "--reason", "not this week"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
        )
        assert done.returncode == 0, done.stderr
        await expect(card).to_have_count(0)
        assert await page.evaluate("window.stillTheSamePage === true")
        await page.goto(f"{console.url}/flows/{dfid}")
        await expect(page.locator("#status strong")).to_have_text("ABORTED")
        await expect(page.locator(".decided")).to_contain_text("reject by bo")
    assert not (tmp_path / "effects").exists()


async def test_an_agent_demoted_by_its_budget_is_shown_and_restored_with_a_reason(
    browser: Browser, shots: Path, tmp_path: Path
) -> None:
    console_extra()
    db = tmp_path / "budget.db"
    # One escalation an hour: the clerk's second escalation demotes it, for real.
    with (
        running_kernel(db, None, "--budget", "1") as kernel,
        running_console(db, "--poll", "0.05") as console,
    ):
        page = await signed_in(browser, console)
        await page.goto(f"{console.url}/agents")
        await page.evaluate("window.stillTheSamePage = true")
        status = page.locator("#status-clerk")
        await expect(status).to_have_text("ACTIVE")
        first = await opened(kernel, "invoice")
        await expect(page.locator("#esc-count-clerk")).to_have_text("1")
        second = await opened(kernel, "invoice")
        # The page follows: the kernel's demotion, its reason, the clerk's history.
        await expect(status).to_have_attribute("data-status", "PASSIVE")
        await expect(status.locator(".demoted")).to_have_text("demoted: escalation budget spent")
        change = page.locator("#change-clerk")
        await expect(change).to_contain_text("PASSIVE by kernel: ESCALATION_BUDGET_EXHAUSTED")
        await expect(change).to_contain_text("escalated more than 1 times per 3600 s")
        history = page.locator("#history-clerk tbody tr")
        await expect(history).to_have_count(1)
        await expect(history.first).to_contain_text("PASSIVE")
        await expect(history.first).to_contain_text("kernel")
        assert await page.evaluate("window.stillTheSamePage === true")
        await page.screenshot(path=shots / "console-agents-demoted.png", full_page=True)
        assert count(db, "FlowAborted", second) == 1  # over budget: aborted, not queued
        assert count(db, "FlowEscalated", first) == 1 and count(db, "FlowAborted", first) == 0
        assert await anyio.to_thread.run_sync(kernel.open, "invoice") == "none"  # it is passive

        # The operator restores it, with a reason; the kernel applies the inbox row.
        row = page.locator("#agent-clerk")
        await row.locator("select[name=status]").select_option("ACTIVE")
        await row.locator("input[name=reason]").fill("budget raised after review <ok>")
        await row.locator("button").click()
        await expect(status).to_have_text("ACTIVE")
        await expect(change).to_have_text("ACTIVE by ana: budget raised after review <ok>")
        await expect(history).to_have_count(2)
        await expect(history.first).to_contain_text("ana")  # newest first
        await expect(history.first).to_contain_text("budget raised after review <ok>")
        await page.screenshot(path=shots / "console-agents-restored.png", full_page=True)
        # Restored, its bucket is full again: its next flow escalates and waits.
        third = await opened(kernel, "invoice")
        await page.goto(console.url)
        await expect(page.locator(f"#esc-{third}")).to_be_visible()
