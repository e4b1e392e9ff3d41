"""dirk's reading commands as a person (and a script) uses them: finding a flow by any id it
goes by, filtering flows, JSON everywhere, $DIRK_DB, --version and help on every argument."""

from __future__ import annotations

import argparse
import json
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel import HumanDecision
from kernel.cli._main import _parser, main
from kernel.cli._read import age, flows_matching
from kernel.telemetry import trace_id_for
from kernel.testing import ManualClock
from tests.support.helpers import ScriptedAgent, kernel_for, transfer

T0_NS = 1_710_500_000 * 10**9  # 2024-03-15T10:53:20Z: a simulated day, far from the wall clock
MIN = 60.0


@dataclass(frozen=True)
class Journal:
    path: Path
    closed: list[str]  # clerk's transfers, one a minute from T0
    aborted: str  # auditor's, escalated and rejected by a human, at T0 + 30 min


async def record(path: Path) -> Journal:
    clock = ManualClock(T0_NS)
    async with kernel_for(path, clock=clock, inbox_poll_s=None) as kernel:
        await kernel.register(ScriptedAgent("clerk", [transfer(250)], subscriptions=["bank"]))
        await kernel.register(
            ScriptedAgent("auditor", [transfer(9_000, confidence=0.2)], subscriptions=["audit"])
        )
        closed = []
        for _ in range(20):
            [dfid] = await kernel.trigger("bank.invoice")
            await kernel.wait_flow(dfid)
            closed.append(dfid)
            clock.advance(MIN)
        clock.advance(10 * MIN)
        [aborted] = await kernel.trigger("audit.check")
        await kernel.wait_flow(aborted)
        clock.advance(5 * MIN)
        await kernel.decide(aborted, HumanDecision.ABORT, operator="ana", reason="no")
        await kernel.wait_flow(aborted)
    return Journal(path, closed, aborted)


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Journal:
    return anyio.run(record, tmp_path_factory.mktemp("cli") / "j.db")


def dirk(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


# --- finding a flow ----------------------------------------------------------------


def test_show_finds_a_flow_by_dfid_prefix_trace_id_and_trace_id_prefix(
    journal: Journal, capsys: pytest.CaptureFixture[str]
) -> None:
    dfid = journal.aborted
    trace = f"{uuid.UUID(dfid).int:032x}"
    others = [d for d in journal.closed if d != dfid]
    # The shortest prefix no other flow shares.
    n = next(n for n in range(1, 36) if not any(o.startswith(dfid[:n]) for o in others))
    for given_as in (dfid, dfid[:n], trace, trace.upper(), trace[:n]):
        status, out, err = dirk(capsys, "show", given_as, "--db", str(journal.path))
        assert status == 0, err
        assert out.splitlines()[:2] == [f"DecisionFlow {dfid}", f"  trace {trace}"]


def test_a_prefix_that_fits_several_flows_is_refused_by_name(
    journal: Journal, capsys: pytest.CaptureFixture[str]
) -> None:
    # 21 flows over 16 hex digits: two share a first digit.
    firsts = [d[0] for d in [*journal.closed, journal.aborted]]
    shared = next(c for c in firsts if firsts.count(c) > 1)

    status, out, err = dirk(capsys, "show", shared, "--db", str(journal.path))

    assert status == 1 and out == ""
    assert err.startswith("error: AMBIGUOUS_FLOW: ")
    status, _, err = dirk(capsys, "show", "zz", "--db", str(journal.path))
    assert status == 1 and err.startswith("error: UNKNOWN_FLOW: ")


def test_show_json_carries_the_trace_id_and_every_event(
    journal: Journal, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = dirk(capsys, "show", journal.aborted[:12], "--db", str(journal.path), "--json")

    assert status == 0
    (line,) = out.splitlines()
    shown = json.loads(line)
    assert shown["dfid"] == journal.aborted
    assert shown["trace_id"] == f"{trace_id_for(journal.aborted):032x}"
    assert shown["status"] == "ABORTED" and shown["reason_code"] == "HUMAN_REJECTED"
    types = [e["payload"]["type"] for e in shown["events"]]
    assert (types[0], types[-1]) == ("FlowCreated", "FlowAborted")


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    ids=st.lists(st.uuids(version=4).map(str), min_size=1, max_size=12, unique=True),
    pick=st.integers(min_value=0),
    length=st.integers(min_value=1, max_value=36),
    as_trace=st.booleans(),
)
def test_flows_matching_is_exactly_the_flows_a_prefix_fits(
    ids: list[str], pick: int, length: int, as_trace: bool
) -> None:
    chosen = ids[pick % len(ids)]
    text = f"{trace_id_for(chosen):032x}"[:length] if as_trace else chosen[:length]

    found = flows_matching(ids, text)

    assert chosen in found
    bare = text.replace("-", "")
    assert found == [d for d in ids if d.replace("-", "").startswith(bare)]
    assert flows_matching(ids, text.upper()) == found


# --- flows -------------------------------------------------------------------------


def rows(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()]


def test_flows_filter_by_agent_kind_reason_time_and_limit(
    journal: Journal, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ("--db", str(journal.path))

    def dfids(*args: str) -> list[object]:
        status, out, err = dirk(capsys, "flows", *db, "--json", *args)
        assert status == 0, err
        return [row["dfid"] for row in rows(out)]

    assert dfids("--agent", "auditor") == [journal.aborted]
    assert dfids("--reason", "human_rejected") == [journal.aborted]
    assert dfids("--kind", "test.transfer", "--agent", "clerk") == journal.closed
    assert dfids("--kind", "no.such.kind") == []
    assert dfids("--limit", "3") == [*journal.closed[-2:], journal.aborted]
    # Times are the journal's (simulated) clock: minute 5 up to minute 8.
    assert (
        dfids("--since", "2024-03-15T10:58:20", "--until", "2024-03-15T11:01:20Z")
        == (journal.closed[5:8])
    )
    assert dfids("--since", "2024-03-15T11:58:20+01:00", "--limit", "1") == [journal.aborted]


def test_flows_table_shows_ages_on_the_journals_clock(
    journal: Journal, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = dirk(capsys, "flows", "--db", str(journal.path), "--agent", "clerk")

    assert status == 0
    lines = out.splitlines()
    assert lines[-1] == "20 flows"
    header = lines[0].split()
    assert header == ["DFID", "STATUS", "AGENT", "KIND", "TRIES", "AGE", "REASON"]
    # Each DFID by its short id: a prefix `show`, `review` and `decide` take back.
    first = next(line for line in lines if line.split()[0] == journal.closed[0][:8])
    # Created at T0; the journal's last event is at T0 + 35 min: not the wall clock's years.
    assert re.search(r"\b35m\b", first), first
    assert "CLOSED" in first and "clerk" in first


@pytest.mark.parametrize(
    ("ns", "said"),
    [(0, "0s"), (59 * 10**9, "59s"), (61 * 10**9, "1m 1s"), (3_600 * 10**9, "1h"),
     (90_061 * 10**9, "1d 1h"), (-5, "0s")],
)  # fmt: skip
def test_age_reads_as_a_person_says_it(ns: int, said: str) -> None:
    assert age(ns) == said


@settings(max_examples=100, derandomize=True, deadline=None)
@given(st.integers(min_value=-(10**12), max_value=10**20))
def test_age_is_always_a_short_duration(ns: int) -> None:
    assert re.fullmatch(r"\d+[smhd]( \d+[smh])?", age(ns))


def test_bad_filter_values_are_usage_errors(
    journal: Journal, capsys: pytest.CaptureFixture[str]
) -> None:
    for args in (["--since", "yesterday"], ["--limit", "0"], ["--limit", "x"]):
        with pytest.raises(SystemExit) as stopped:
            main(["flows", "--db", str(journal.path), *args])
        assert stopped.value.code == 2
        assert "Traceback" not in capsys.readouterr().err


# --- the environment, version, JSON and help -----------------------------------------


def test_dirk_db_is_the_default_journal(
    journal: Journal, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DIRK_DB", str(journal.path))

    status, out, _ = dirk(capsys, "flows", "--json", "--agent", "auditor")
    assert status == 0 and [row["dfid"] for row in rows(out)] == [journal.aborted]
    # A --db given wins over it.
    status, _, err = dirk(capsys, "flows", "--db", str(journal.path) + ".missing")
    assert status == 2 and "JOURNAL_ERROR" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    assert re.fullmatch(r"dirk \d+\.\d+\.\d+\S*\n", capsys.readouterr().out)


def test_verify_and_anchor_speak_json(journal: Journal, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = dirk(capsys, "verify", "--db", str(journal.path), "--json")
    assert status == 0
    verified = json.loads(out)
    assert verified["ok"] is True and verified["lines"][-1].startswith("verify: ok events=")

    status, out, _ = dirk(capsys, "anchor", "--db", str(journal.path), "--json")
    assert status == 0
    anchor = json.loads(out)
    assert anchor["anchor"].startswith("dirk-anchor ") and anchor["seq"] > 0


def reading_commands() -> dict[str, argparse.ArgumentParser]:
    commands = {}
    for action in _parser()._subparsers._group_actions:  # type: ignore[union-attr]
        for name, sub in action.choices.items():  # type: ignore[union-attr]
            commands[name] = sub
    traces = commands["traces"]
    for action in traces._subparsers._group_actions:
        commands["traces export"] = action.choices["export"]
    return {n: commands[n] for n in ("verify", "anchor", "flows", "show", "traces export")}


@pytest.mark.parametrize("command", ["verify", "anchor", "flows", "show", "traces export"])
def test_every_argument_of_a_reading_command_has_help_and_json(command: str) -> None:
    parser = reading_commands()[command]
    options = {o for action in parser._actions for o in action.option_strings}
    assert "--json" in options
    for action in parser._actions:
        assert action.help, f"{command}: {action.dest} has no help"
