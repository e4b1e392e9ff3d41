"""Every command of dirk that reads speaks JSON: one document per command (JSON Lines for
the two listings, flows and escalations), fixed keys, ages on the journal's clock; and every
argument of every subcommand has help."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import booking
from kernel.audit import open_journal
from kernel.cli._main import _parser, main
from kernel.testing import ManualClock
from tests.support.helpers import ScriptedAgent, kernel_for, transfer

T0_NS = 1_710_500_000 * 10**9  # 2024-03-15: a simulated day, far from the wall clock
MIN = 60.0


def dirk(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    assert status == 0 or err, "a failure says why"
    return status, out


def rechecks(path: Path) -> int:
    """How many approved actions the journal at ``path`` judged again before they executed."""

    async def count() -> int:
        async with open_journal(path, readonly=True) as journal:
            accepted = await journal.read(types=["ProposalAccepted"])
        return sum(1 for e in accepted if getattr(e.payload, "rechecked", False))

    return anyio.run(count)


def dirk_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    status, out = dirk(capsys, *args, "--json")
    assert status == 0, out
    assert len(out.splitlines()) == 1, "one document on one line"
    return json.loads(out)


# --- the operator's commands on a journal left waiting -----------------------------


@dataclass(frozen=True)
class Waiting:
    path: Path
    pending: str  # escalated 20 simulated minutes before the journal's last event


async def record_waiting(path: Path) -> Waiting:
    clock = ManualClock(T0_NS)
    async with kernel_for(path, clock=clock, inbox_poll_s=None) as kernel:
        await kernel.register(ScriptedAgent("clerk", [transfer(250)], subscriptions=["bank"]))
        await kernel.register(
            ScriptedAgent("auditor", [transfer(9_000, confidence=0.2)], subscriptions=["audit"])
        )
        [pending] = await kernel.trigger("audit.check")
        await kernel.wait_flow(pending)
        for _ in range(20):
            clock.advance(MIN)
            [dfid] = await kernel.trigger("bank.invoice")
            await kernel.wait_flow(dfid)
    return Waiting(path, pending)


@pytest.fixture(scope="module")
def waiting(tmp_path_factory: pytest.TempPathFactory) -> Waiting:
    return anyio.run(record_waiting, tmp_path_factory.mktemp("json") / "w.db")


def test_escalations_age_on_the_journals_clock(
    waiting: Waiting, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out = dirk(capsys, "escalations", "--db", str(waiting.path), "--json")
    assert status == 0
    [row] = [json.loads(line) for line in out.splitlines()]
    assert row["dfid"] == waiting.pending
    # Escalated at T0; the journal's last event is 20 simulated minutes later (the wall
    # clock would say months).
    assert row["waited_s"] == 20 * 60 and row["age"] == "20m"
    assert row["escalated"] == "2024-03-15T10:53:20.000+00:00"
    assert set(row) == {
        "dfid", "impact", "reason_code", "detail", "age", "escalated", "waited_s",
        "agent_id", "action", "hash", "queued", "quorum",
    }  # fmt: skip
    status, text = dirk(capsys, "escalations", "--db", str(waiting.path))
    assert status == 0 and " 20m " in text and "1 pending escalations" in text


def test_review_json_holds_what_a_decision_needs(
    waiting: Waiting, capsys: pytest.CaptureFixture[str]
) -> None:
    review = dirk_json(capsys, "review", waiting.pending, "--db", str(waiting.path))
    assert review["dfid"] == waiting.pending and review["status"] == "ESCALATED"
    approval = review["approval"]
    assert approval["status"] == "PENDING" and approval["waited_s"] == 20 * 60
    assert approval["short_hash"] == approval["action_hash"][: len(approval["short_hash"])]
    assert review["proposal"]["kind"] == "test.transfer"
    assert review["proposal"]["params"]["amount_cents"] == 9000
    assert review["agent"]["agent_id"] == "auditor"
    assert review["context"]["attempt"] == 1
    # The text says the same age.
    status, text = dirk(capsys, "review", waiting.pending, "--db", str(waiting.path))
    assert status == 0 and "escalated 20m ago" in text

    # A flow that never escalated has no approval.
    escalations = dirk(capsys, "flows", "--db", str(waiting.path), "--json", "--agent", "clerk")
    closed = json.loads(escalations[1].splitlines()[0])["dfid"]
    review = dirk_json(capsys, "review", closed, "--db", str(waiting.path))
    assert review["approval"] is None and review["status"] == "CLOSED"


def test_agent_json_and_its_refusal_with_a_change(
    waiting: Waiting, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = dirk_json(capsys, "agent", "clerk", "--db", str(waiting.path))
    assert agent["agent_id"] == "clerk" and agent["status"] == "ACTIVE"
    assert agent["subscriptions"] == ["bank"]
    status, _ = dirk(
        capsys, "agent", "clerk", "--set", "PASSIVE", "--json", "--db", str(waiting.path)
    )
    assert status == 2


@settings(max_examples=8, derandomize=True, deadline=None)
@given(at=st.integers(min_value=0, max_value=10_000))
def test_state_json_is_the_text_state_on_one_line(waiting: Waiting, at: int) -> None:
    import contextlib
    import io

    def run(*extra: str) -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            status = main(["state", "--db", str(waiting.path), "--at", str(at), *extra])
        return status, out.getvalue()

    text_status, text = run()
    json_status, compact = run("--json")
    assert text_status == json_status
    if json_status == 0:
        assert len(compact.splitlines()) == 1
        assert json.loads(compact) == json.loads(text)
    else:
        assert compact == text == ""


# --- rules, why, whatif and verify --verdicts on the booking story -----------------


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("booking") / "b.db"
    assert booking.main(["--db", str(db), "--seed", "1", "--json"]) == 0
    return db


def test_rules_and_why_json(story: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules = dirk_json(capsys, "rules", "--db", str(story))
    [access] = rules["rules"]
    assert access["rule"] == "access" and access["current"]["version"] == 1
    assert rules["deferred"] == []
    why = dirk_json(capsys, "why", "access", "--db", str(story))
    assert why["current"] == access["current"]
    assert len(why["versions"]) == access["versions"] == 1
    [decision] = why["decisions"]
    assert decision["decision"] == "promote" and decision["version"] == 1
    assert why["versions"][0]["source"]["repo"] == "travel-desk/handbook"
    status, _ = dirk(capsys, "rules", "--skip", "1", "--json", "--db", str(story))
    assert status == 2


def test_whatif_json_names_the_changed_verdict(
    story: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = dirk_json(
        capsys,
        "whatif",
        "--db",
        str(story),
        "--inject-constraint",
        booking.LESSON,
        "--priority",
        "learned",
    )
    assert result["judged"] > 0
    [change] = [c for c in result["changes"] if c["reason_code"] == "VERIFICATION_REQUIRED"]
    assert change["then"] == "accepted" and change["dfid"]
    # The text names the same changes, one line each.
    status, text = dirk(
        capsys, "whatif", "--db", str(story), "--inject-constraint", booking.LESSON,
        "--priority", "learned",
    )  # fmt: skip
    assert status == 0 and len(text.splitlines()) == len(result["changes"]) + 1
    rejudged = dirk_json(capsys, "whatif", "--db", str(story), "--pack", "policies.booking")
    # Re-judging with the pack also judges the approved stay again before it executed; the
    # memory what-if judges each agent proposal once.
    assert rejudged["changes"] == [] and rejudged["judged"] == result["judged"] + rechecks(story)


def test_verify_verdicts_json(story: Path, capsys: pytest.CaptureFixture[str]) -> None:
    verified = dirk_json(
        capsys, "verify", "--db", str(story), "--verdicts", "--pack", "policies.booking"
    )
    assert verified["ok"] is True
    verdicts = verified["verdicts"]
    assert verdicts["ok"] is True and verdicts["judged"] > 0 and verdicts["changes"] == []
    # Without the pack the lesson came from, the verdicts are not all comparable, and
    # the document says which failed rather than only "lines".
    status, out = dirk(
        capsys, "verify", "--db", str(story), "--verdicts", "--pack", "policies.trading", "--json"
    )
    document = json.loads(out)
    assert document["ok"] is (status == 0)
    assert document["verdicts"]["judged"] + document["verdicts"]["not_compared"] >= 0
    assert document["verdicts"]["ok"] is (status == 0)


# --- help everywhere ---------------------------------------------------------------


def every_parser(
    parser: argparse.ArgumentParser, path: str = "dirk"
) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += every_parser(sub, f"{path} {name}")
    return found


def test_every_argument_of_every_subcommand_has_help() -> None:
    parsers = every_parser(_parser())
    assert len(parsers) > 15
    missing = [
        f"{path}: {action.dest}"
        for path, parser in parsers
        for action in parser._actions
        if not action.help and not isinstance(action, argparse._SubParsersAction)
    ]
    assert missing == []


READING = ["escalations", "review", "state", "why", "whatif", "rules", "agent", "verify"]


@pytest.mark.parametrize("command", READING)
def test_every_reading_command_takes_json(command: str) -> None:
    parsers = dict(every_parser(_parser()))
    options = {o for a in parsers[f"dirk {command}"]._actions for o in a.option_strings}
    assert "--json" in options
