"""``dirk agents`` says why an agent is PASSIVE; ``dirk init`` creates the journal others open."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import anyio
import pytest

from kernel.cli._main import main
from kernel.journal.opening import open_journal
from kernel.policy import EscalationBudget
from policies.booking import BOOKING
from tests.frameworks.support import REVISED, TOOL, Hotel, booking_kernel

ONE_AN_HOUR = dataclasses.replace(BOOKING, escalation_budget=EscalationBudget(capacity=1))


def demoted_journal(path: Path) -> None:
    """A journal whose booker escalated twice with a budget of one: the kernel demoted it."""

    async def run() -> None:
        async with booking_kernel(path, Hotel(), pack=ONE_AN_HOUR) as gate:
            await gate.call(TOOL, REVISED, conversation="a", tool_call_id="t")
            asked = await gate.call(TOOL, REVISED, conversation="b", tool_call_id="t")
            await gate.kernel.await_decision(asked.dfid)

    anyio.run(run)


def test_agents_names_the_demotion_and_how_to_restore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    demoted_journal(db)
    assert main(["agents", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "booker 1.0.0: PASSIVE  (demoted by the kernel: ESCALATION_BUDGET_EXHAUSTED" in out
    assert "restore: dirk agent booker --set ACTIVE" in out
    assert main(["agents", "--db", str(db), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["status"] == "PASSIVE" and row["demoted"] is True and row["escalations"] == 2


def test_init_creates_a_journal_that_opens_and_leaves_one_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "new.db"
    assert main(["agents", "--db", str(db)]) != 0  # no journal: refused, not created
    assert not db.exists()
    assert main(["init", "--db", str(db)]) == 0
    assert "created the journal" in capsys.readouterr().out
    assert main(["agents", "--db", str(db)]) == 0
    assert "no agent ever registered" in capsys.readouterr().out
    assert main(["init", "--db", str(db)]) == 0
    assert "a journal already (without events): unchanged" in capsys.readouterr().out

    async def count() -> int:
        async with open_journal(db, readonly=True) as journal:
            return len(await journal.read())

    assert anyio.run(count) == 0
