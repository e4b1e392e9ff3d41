"""Beliefs are projections: time travel, snapshots, verify and the CLI all see the same graph."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from kernel.audit import fold, open_journal
from kernel.cli import main
from kernel.state.snapshots import checkpoints, state_at, verify_projections
from kernel.testing import ScriptedTests
from tests.support.beliefs_domain import belief_desk


async def story(path: Path) -> None:
    """Promotion, contest, a failed test and decay, with snapshots every 10 events."""
    tests = ScriptedTests({"t1": "failed"})
    async with belief_desk(path, tests, checkpoint_every=10) as desk:
        await desk.observe("o1", "wire")
        await desk.observe("o2", "registry")
        await desk.observe("o3", "blog", reliability="0.5")
        await desk.call(
            "propose_proposition", proposition="p", text="Acme is in Lyon", derived_from=["o1"]
        )
        await desk.call("attach_support", proposition="p", observation="o2")
        await desk.call(
            "propose_proposition", proposition="q", text="Acme is in Paris", derived_from=["o3"]
        )
        # Novel, high impact, 0.64 on one group: a test is worth running.
        tested = await desk.call(
            "propose_test",
            test="t1",
            proposition="q",
            competing=["p"],
            action_impact="high",
        )
        assert tested.status == "CLOSED", await desk.why(tested)
        await desk.call("execute_test_result_ingest", test="t1")
        await desk.call("attach_contradiction", proposition="q", observation="o1")
        desk.advance_hours(300)
        await desk.observe("o4", "clock")
        await desk.call("archive_episode", episode="e1", summary="where Acme is")


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("beliefs") / "j.db"
    anyio.run(story, path)
    return path


async def test_state_at_any_seq_is_the_fold_of_the_prefix(journal: Path) -> None:
    async with open_journal(journal, readonly=True) as opened:
        events = await opened.read()
        assert len(await checkpoints(opened)) >= 3  # snapshots are in play
        for seq in range(5, opened.head_seq + 1, 5):
            at = await state_at(opened, seq)
            prefix = [e for e in events if e.seq <= seq]  # a seq may hold two events
            assert at.beliefs == fold(prefix).beliefs
            assert at.digest() == fold(prefix).digest()
        report = await verify_projections(opened)
    assert report.ok, report.problems
    final = fold(events).beliefs
    assert {n: p.state for n, p in final.propositions.items()} == {
        "p": "deprecated",
        "q": "rejected",
    }
    assert final.episodes["e1"].propositions == {"p": "deprecated", "q": "rejected"}
    assert {p.layer for p in final.propositions.values()} == {"archived"}


ERRORS: list[str] = []


def dirk(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    ERRORS.append(err)
    return status, out


def test_dirk_beliefs_lists_states_now_and_then(
    journal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out = dirk(capsys, "beliefs", "--db", str(journal), "--json")
    assert status == 0
    rows = {r["proposition"]: r for r in json.loads(out)["propositions"]}
    assert rows["p"]["state"] == "deprecated" and rows["q"]["state"] == "rejected"
    assert [e["stance"] for e in rows["q"]["evidence"]] == [
        "supports",
        "contradicts",
        "contradicts",
    ]
    accepted = next(
        t["seq"]
        for t in json.loads(dirk(capsys, "why", "p", "--db", str(journal), "--json")[1])[
            "transitions"
        ]
        if t["to"] == "accepted"
    )
    status, out = dirk(capsys, "beliefs", "--db", str(journal), "--at", str(accepted), "--json")
    then = {r["proposition"]: r for r in json.loads(out)["propositions"]}
    assert then["p"]["state"] == "accepted" and then["p"]["confidence"] == "0.950000"
    status, out = dirk(capsys, "beliefs", "--db", str(journal))
    assert status == 0 and "p: deprecated confidence" in out


def test_dirk_why_names_the_evidence_of_each_transition(
    journal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out = dirk(capsys, "why", "q", "--db", str(journal), "--json")
    assert status == 0
    steps = [(t["to"], t["cause"], t["evidence"]) for t in json.loads(out)["transitions"]]
    assert steps == [("provisional", "supports", "o3>q"), ("rejected", "test", "test:t1")]
    status, out = dirk(capsys, "why", "q", "--db", str(journal))
    assert status == 0 and "-> rejected by test test:t1" in out
    status, _ = dirk(capsys, "why", "nothing", "--db", str(journal))
    assert status == 1 and "UNKNOWN_RULE: no rule or proposition 'nothing'" in ERRORS[-1]


def test_dirk_verify_re_judges_the_governance_verdicts(
    journal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out = dirk(
        capsys,
        "verify",
        "--db",
        str(journal),
        "--verdicts",
        "--pack",
        "kernel.beliefs:GOVERNANCE_PACK",
        "--json",
    )
    document = json.loads(out)
    assert status == 0 and document["ok"], document
    assert document["verdicts"]["judged"] >= 10
