"""The console for real queues, in process: the journal's clock, search, pages, the audit page.

Over the trading example's journals: one where nobody answered (escalations wait),
and one where the scripted operator did (decisions and credentials to audit).
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from examples import trading
from tests.support.browser import ROOT, console_extra
from tests.support.hostile import hostile_text
from tests.support.serving import env_without_keys, folded

console_extra()

from starlette.testclient import TestClient  # noqa: E402

from kernel.console._views import act_of, diff, edited_params  # noqa: E402
from kernel.console._web import cell as _cell  # noqa: E402
from kernel.core import events as ev  # noqa: E402
from tests.support.console_client import signed_in  # noqa: E402


def desk(folder: Path, *args: str) -> Path:
    db = folder / "desk.db"
    done = subprocess.run(
        [sys.executable, "-m", "examples.trading", "--seed", "1", "--db", str(db), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return db


@pytest.fixture(scope="module")
def waiting(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 60-minute day nobody answered: 66 flows, escalations waiting."""
    return desk(tmp_path_factory.mktemp("waiting"), "--minutes", "60", "--operator", "none")


@pytest.fixture(scope="module")
def answered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 30-minute day the scripted operator answered."""
    return desk(tmp_path_factory.mktemp("answered"), "--minutes", "30")


@pytest.fixture
def on_waiting(waiting: Path) -> Iterator[TestClient]:
    yield from signed_in(waiting)


@pytest.fixture
def on_answered(answered: Path) -> Iterator[TestClient]:
    yield from signed_in(answered)


def dfids_of(page: str) -> list[str]:
    return re.findall(r'<a href="/flows/([0-9a-f-]{36})"><code>', page)


# --- one clock for people ------------------------------------------------------------


def test_ages_are_on_the_journals_clock_as_the_cli_says(
    waiting: Path, on_waiting: TestClient
) -> None:
    cli = subprocess.run(
        [sys.executable, "-m", "kernel", "escalations", "--db", str(waiting), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env_without_keys(),
    )
    rows = [json.loads(line) for line in cli.stdout.splitlines()]
    assert rows
    queue = on_waiting.get("/").text
    for row in rows:
        card = queue.split(f'id="esc-{row["dfid"]}"', 1)[1].split("</article>", 1)[0]
        waited = re.search(r"<dt>waiting</dt><dd>([^<]+)</dd>", card)
        assert waited is not None and waited.group(1) == row["age"], (card, row)
    assert "overdue" not in queue and not re.search(r"<dd>\d+d</dd>", queue)


def test_amounts_in_reasons_read_in_dollars(on_waiting: TestClient) -> None:
    queue = on_waiting.get("/").text
    # The pack names its currency (trading 0.4.0), so the reason itself reads in it.
    assert re.search(r"[\d,]+\.\d\d USD is above 25,000\.00 USD", queue), queue
    assert not re.search(r"amount \d+ is above \d+", queue)


# --- search and pages ------------------------------------------------------------------


def test_pages_reach_every_flow_of_the_journal(waiting: Path, on_waiting: TestClient) -> None:
    everyone = set(folded(waiting).flows)
    assert len(everyone) > 50
    first = on_waiting.get("/flows").text
    pages = [first]
    while 'rel="next"' in pages[-1]:  # 50 a page, as many pages as it takes
        pages.append(on_waiting.get(f"/flows?page={len(pages) + 1}").text)
    last = pages[-1]
    assert len(dfids_of(first)) == 50 and len(pages) >= 2
    shown = [dfid for text in pages for dfid in dfids_of(text)]
    assert set(shown) == everyone and len(shown) == len(everyone)  # each once
    assert 'rel="prev"' in last
    assert f"of {len(everyone)}" in first
    # Out of range, or not a number: the nearest page, never an error.
    assert dfids_of(on_waiting.get("/flows?page=999").text) == dfids_of(last)
    assert dfids_of(on_waiting.get("/flows?page=x").text) == dfids_of(first)


def test_search_finds_a_flow_by_dfid_prefix_trace_id_and_words(
    waiting: Path, on_waiting: TestClient
) -> None:
    projections = folded(waiting)
    dfid = sorted(projections.waiting)[0]
    assert dfids_of(on_waiting.get(f"/flows?q={dfid[:8]}").text) == [dfid]
    trace = dfid.replace("-", "")[:20]
    assert dfids_of(on_waiting.get(f"/flows?q={trace}").text) == [dfid]
    by_words = dfids_of(on_waiting.get("/flows?q=pm-2 INITECH&status=ESCALATED").text)
    expected = {
        f.dfid
        for f in projections.flows.values()
        if f.agent_id == "pm-2" and f.status == "ESCALATED"
    }
    assert set(by_words) == expected
    assert "No flow matches." in on_waiting.get("/flows?q=no-such-thing-anywhere").text


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(q=hostile_text(max_size=60))
def test_any_search_text_is_answered_never_a_traceback(on_waiting: TestClient, q: str) -> None:
    answer = on_waiting.get("/flows", params={"q": q.encode("utf-8", "replace").decode()})
    assert answer.status_code == 200


# --- the audit page -----------------------------------------------------------------------


def test_the_audit_page_lists_every_human_act(answered: Path, on_answered: TestClient) -> None:
    page = on_answered.get("/audit").text
    assert "<h1>Who did what</h1>" in page
    types = re.findall(r'<tr class="act" data-type="(\w+)">', page)
    assert types.count("CredentialIssued") == len(trading.AGENTS)  # one per desk agent
    assert types.count("HumanDecided") >= 1
    decided = on_answered.get("/audit?kind=decision").text
    assert set(re.findall(r'data-type="(\w+)"', decided)) <= {"HumanDecided"}
    nobody = on_answered.get("/audit?operator=nobody").text
    assert "No act matches." in nobody


def test_the_audit_exports_what_is_shown_as_csv_and_json(on_answered: TestClient) -> None:
    shown = on_answered.get("/audit?operator=dana").text
    count = len(re.findall(r'<tr class="act"', shown))
    as_json = on_answered.get("/audit.json?operator=dana")
    assert as_json.headers["content-disposition"].startswith("attachment")
    records = json.loads(as_json.text)
    assert len(records) == count and all(r["operator"] == "dana" for r in records)
    as_csv = on_answered.get("/audit.csv?operator=dana")
    assert as_csv.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert [int(r["seq"]) for r in rows] == [r["seq"] for r in records]
    assert set(rows[0]) == set(records[0])


def test_a_csv_cell_never_runs_as_a_formula() -> None:
    assert _cell("=HYPERLINK(1)") == "'=HYPERLINK(1)"
    assert _cell("+1") == "'+1" and _cell("@x") == "'@x" and _cell("ok") == "ok"
    assert _cell(5) == 5


def test_the_kernels_own_demotion_is_not_a_human_act() -> None:
    kernel = ev.Event(seq=1, ts=1, payload=ev.AgentStatusChanged(status="PASSIVE", reason="budget"))
    assert act_of(kernel) is None
    person = ev.Event(
        seq=2,
        ts=1,
        agent_id="pm-1",
        payload=ev.AgentStatusChanged(status="ACTIVE", reason="ok", operator="ana"),
    )
    act = act_of(person)
    assert act is not None and (act.operator, act.target, act.what) == ("ana", "pm-1", "ACTIVE")


# --- modify as a form, with a diff -----------------------------------------------------------


def test_a_modify_form_keeps_each_parameters_type_and_shows_the_change() -> None:
    proposed = {"quantity": 162, "limit_price": "295.81", "side": "buy"}
    form = {"param.quantity": "80", "param.limit_price": "290.00", "param.side": "buy"}
    edited = edited_params(proposed, form)
    assert edited == {"quantity": 80, "limit_price": "290.00", "side": "buy"}
    assert [(c.name, c.was, c.now) for c in diff(proposed, edited)] == [
        ("limit_price", "295.81", "290.00"),
        ("quantity", "162", "80"),
    ]
    # Text where a number was stays text: the kernel refuses it with its reason.
    assert edited_params(proposed, {"param.quantity": "12 lots"})["quantity"] == "12 lots"


def test_show_the_change_previews_and_queues_nothing(waiting: Path, on_waiting: TestClient) -> None:
    dfid = sorted(folded(waiting).waiting)[0]
    page = on_waiting.get(f"/flows/{dfid}").text
    token = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    assert page.index('id="forms"') < page.index("The proposed action")  # the forms first
    answer = on_waiting.post(
        f"/flows/{dfid}/decide",
        data={"csrf": token, "decision": "modify", "param.quantity": "1", "preview": "1"},
    )
    assert answer.status_code == 200
    assert 'id="diff"' in answer.text and "<code>1</code>" in answer.text
    assert "A decision waits in the inbox" not in answer.text


# --- dark mode ---------------------------------------------------------------------------


def test_the_colour_scheme_toggle_is_remembered_and_goes_back_only_here(
    on_waiting: TestClient,
) -> None:
    assert 'data-theme="' not in on_waiting.get("/flows").text  # the system's preference
    chosen = on_waiting.get("/theme?mode=dark&back=/flows%3Fq%3Dpm-1")
    assert chosen.status_code == 303 and chosen.headers["location"] == "/flows?q=pm-1"
    assert 'data-theme="dark"' in on_waiting.get("/flows").text
    assert on_waiting.get("/theme?mode=light&back=//evil.example/").headers["location"] == "/"
    assert 'data-theme="light"' in on_waiting.get("/").text
    on_waiting.get("/theme?mode=auto")
    assert 'data-theme="' not in on_waiting.get("/").text
