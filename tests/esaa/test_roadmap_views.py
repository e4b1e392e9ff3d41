"""``dirk roadmap`` and the console's roadmap page, over a journal a real kernel wrote."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from kernel.audit import fold, open_journal
from kernel.core.reasons import ExitCode
from kernel.state.roadmap.domain import Roadmap
from kernel.state.roadmap.view import projection_hash
from tests.esaa.kit import claim, complete, desk, run
from tests.support.browser import console_extra

ESCAPE = "\x1b[2J\x1b]0;pwned\x07"
ONE = "def one() -> int:\n    return 1\n"


async def build(where: Path) -> int:
    """A roadmap with a done task, an issue on it (text with terminal escapes) and its hotfix."""
    async with desk(where) as d:
        await d.open()
        await d.act("ada", claim("T-1"))
        await d.patch("ada", "T-1", {"pkg/one.py": ONE})
        await d.act("ada", run("T-1", "ok"))
        await d.act("ada", complete("T-1"))
        report = {"kind": "esaa.report", "task": "T-1", "title": f"<b>bad</b>{ESCAPE}"}
        assert (await d.act("quinn", report)).done
        await d.act("bo", claim("T-3"))
        return d.kernel.projections.last_seq


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    where = tmp_path_factory.mktemp("roadmap-views")
    return where / "j.db", anyio.run(build, where)


def dirk(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from kernel.cli import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_dirk_roadmap_prints_each_task_phase_and_issue(
    built: tuple[Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    db, _ = built
    code, out, _ = dirk(capsys, "roadmap", "--db", str(db))
    assert code == ExitCode.OK
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("T-")}
    assert rows["T-1"][:5] == ["T-1", "PH-1", "impl", "done", "ada"]
    assert rows["T-3"][3:5] == ["in_progress", "bo"]
    assert rows["T-2"][3] == "ready" and rows["T-4"][3] == "blocked"
    assert rows["T-1.fix1"][2:4] == ["hotfix", "ready"]
    assert "phase PH-1: 1/4 done, open" in out  # T-1, T-2, T-3 and the hotfix
    assert "-> hotfix T-1.fix1" in out
    # What an agent wrote is shown, never obeyed by the terminal.
    assert "\x1b" not in out and "\\x1b[2J" in out


def test_dirk_roadmap_json_is_the_replayed_roadmap_with_its_hash(
    built: tuple[Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    db, last = built
    code, out, _ = dirk(capsys, "roadmap", "--db", str(db), "--json")
    assert code == ExitCode.OK
    document = json.loads(out)["roadmap"]

    async def replay() -> str:
        async with open_journal(db, readonly=True) as journal:
            return projection_hash(fold(await journal.read()).domain(Roadmap).state)

    assert document["run"]["projection_hash_sha256"] == anyio.run(replay)
    assert document["run"]["last_event_seq"] >= last
    assert [t["task_id"] for t in document["tasks"]] == ["T-1", "T-2", "T-3", "T-4", "T-1.fix1"]
    [t1] = [t for t in document["tasks"] if t["task_id"] == "T-1"]
    assert t1["acceptance_results"] == {"ok": True} and len(t1["commits"]) == 1
    assert t1["issues"][0]["title"] == f"<b>bad</b>{ESCAPE}"  # JSON stays exact
    assert document["counts"] == {"blocked": 1, "done": 1, "in_progress": 1, "ready": 2}


def test_dirk_roadmap_at_a_seq_before_the_opening_has_none(
    built: tuple[Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    db, _ = built
    code, out, _ = dirk(capsys, "roadmap", "--db", str(db), "--at", "3")
    assert code == ExitCode.OK and out.startswith("no roadmap")
    code, out, _ = dirk(capsys, "roadmap", "--db", str(db), "--at", "3", "--json")
    assert json.loads(out) == {"roadmap": None}
    code, _, err = dirk(capsys, "roadmap", "--db", str(db), "--at", "99999")
    assert code == ExitCode.FAILED and "UNKNOWN_SEQ" in err


@pytest.fixture
def console(built: tuple[Path, int], tmp_path: Path) -> Iterator[object]:
    console_extra()
    from starlette.testclient import TestClient

    from kernel.console._app import Settings, create_app
    from kernel.console._auth import Gate

    db = tmp_path / "j.db"
    shutil.copy(built[0], db)
    gate = Gate(None)
    with TestClient(create_app(Settings(db=str(db)), gate), follow_redirects=False) as client:
        client.get("/login")
        nonce = client.cookies.get("dirk_console_login")
        client.post("/login", data={"nonce": nonce, "name": "ana", "secret": gate.token})
        yield client


def test_the_console_shows_the_roadmap_escaped(console: object) -> None:
    response = console.get("/roadmap")  # type: ignore[attr-defined]
    assert response.status_code == 200
    page = response.text
    assert re.search(r'<tr class="task-done" id="task-T-1">', page)
    assert '<tr class="task-ready" id="task-T-1.fix1">' in page
    assert "&lt;b&gt;bad&lt;/b&gt;" in page and "<b>bad</b>" not in page
    assert "→ hotfix T-1.fix1" in page
    assert 'href="/roadmap"' in page  # in the navigation


def test_the_roadmap_page_needs_a_sign_in(built: tuple[Path, int]) -> None:
    console_extra()
    from starlette.testclient import TestClient

    from kernel.console._app import Settings, create_app
    from kernel.console._auth import Gate

    app = create_app(Settings(db=str(built[0])), Gate(None))
    with TestClient(app, follow_redirects=False) as client:
        assert client.get("/roadmap").status_code == 303
