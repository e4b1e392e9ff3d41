"""Replay and what-if over quorums, grants and ceilings: the verdicts a change would flip.

The record says what was approved, granted and spent; ``verify --verdicts`` judges it
all again (the approvals judged again before they executed included) and finds no
difference; ``whatif`` with a stricter quorum, without a grant, or with a lower ceiling
lists exactly the verdicts that would change.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import anyio
import pytest

from kernel.audit import open_journal
from kernel.audit.reverify import rejudge
from kernel.cli import main
from kernel.core.events import GrantIssued
from kernel.testing import action_of
from tests.support.approvals_domain import (
    PAY,
    PAY_FOUR_EYES,
    pay_kernel,
    sender,
)


async def history(path: Path) -> dict[str, object]:
    """A grant used twice, a send approved by one operator, small sends within the day."""
    async with pay_kernel(path, [PAY]) as kernel:
        await kernel.register(sender())
        issued = await kernel.grant(
            "pay.send",
            bounds={"amount_cents": {"max": "300000"}},
            uses=2,
            valid_for_s=3600,
            operator="ana",
            reason="month end",
        )
        granted = []
        for _ in range(2):
            [dfid] = await kernel.trigger("pay.250000")
            granted.append(dfid)
            await kernel.wait_flow(dfid)
        [approved] = await kernel.trigger("pay.200000")
        await kernel.wait_flow(approved)
        await kernel.decide(
            approved,
            "approve",
            operator="ana",
            reason="ok",
            action_hash=action_of(kernel, approved),
        )
        await kernel.wait_flow(approved, until={kernel.flow(approved).status.CLOSED})  # type: ignore[union-attr]
        small = []
        for _ in range(2):
            [dfid] = await kernel.trigger("pay.90000")
            small.append(dfid)
            await kernel.wait_flow(dfid)
        grant = issued.seq
    return {"grant_seq": grant, "granted": granted, "approved": approved, "small": small}


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    path = tmp_path / "pay.db"
    return path, anyio.run(history, path)


async def test_replay_judges_grants_quorums_and_rechecks_as_recorded(
    recorded: tuple[Path, dict[str, object]],
) -> None:
    path, _ = recorded
    async with open_journal(path, readonly=True) as journal:
        result = await rejudge(journal, [PAY])
    assert result.changes == [] and result.mismatches == []
    assert result.judged == 6  # five proposals and the approval judged again


def test_verify_verdicts_agrees(
    recorded: tuple[Path, dict[str, object]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = recorded
    pack = "tests.support.approvals_domain:PAY"
    assert main(["verify", "--db", str(path), "--verdicts", "--pack", pack]) == 0
    assert "0 differ" in capsys.readouterr().out


async def test_without_the_grant_its_proposals_would_have_waited_for_a_human(
    recorded: tuple[Path, dict[str, object]],
) -> None:
    path, seen = recorded
    async with open_journal(path, readonly=True) as journal:
        [issued] = await journal.read(types=["GrantIssued"])
        assert isinstance(issued.payload, GrantIssued)
        result = await rejudge(journal, [PAY], check_hash=False, exclude=[issued.seq])
    assert {c.dfid for c in result.changes} == set(cast("list[str]", seen["granted"]))
    assert all(
        c.then.startswith(f"accepted under grant {issued.payload.grant}") for c in result.changes
    )
    assert all(c.now == "would have been escalated" for c in result.changes)


async def test_a_stricter_quorum_shows_the_escalations_and_approvals_it_changes(
    recorded: tuple[Path, dict[str, object]],
) -> None:
    path, seen = recorded
    async with open_journal(path, readonly=True) as journal:
        result = await rejudge(journal, [PAY_FOUR_EYES], check_hash=False)
    by_flow: dict[str, list[str]] = {}
    for change in result.changes:
        by_flow.setdefault(change.dfid, []).append(f"{change.then} -> {change.now}")
    approved = str(seen["approved"])
    assert by_flow.pop(approved) == [
        "escalated (APPROVAL_REQUIRED) -> would have been escalated (needing 2 operators)",
        "approved by ana -> would still wait: 1 of 2, waiting for 1 more operator",
        "approval accepted when judged again -> would have been superseded",
    ]
    # One operator's grant covers no escalation that needs two.
    assert set(by_flow) == set(cast("list[str]", seen["granted"]))


def test_dirk_whatif_with_a_lower_ceiling_lists_the_sends_it_refuses(
    recorded: tuple[Path, dict[str, object]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, seen = recorded
    pack = "tests.support.approvals_domain:PAY_TIGHT"
    assert main(["whatif", "--db", str(path), "--pack", pack]) == 0
    lines = capsys.readouterr().out.splitlines()
    refused = [line for line in lines if "BUDGET_EXHAUSTED" in line]
    assert len(refused) == 5  # every send after the first, and the approval judged again
    assert all(
        "would have been rejected" in x or "would have been superseded" in x for x in refused
    )
    assert lines[-1].startswith("whatif: 6 recorded verdicts judged again")
    # --exclude goes with --pack: the grant never issued.
    with_grant = "tests.support.approvals_domain:PAY"
    assert (
        main(
            ["whatif", "--db", str(path), "--pack", with_grant, "--exclude", str(seen["grant_seq"])]
        )
        == 0
    )
    assert "would have been escalated" in capsys.readouterr().out
