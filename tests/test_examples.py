"""The example simulations, run for real and checked from their journals.

Runs go in-process through each example's ``main`` (a fresh journal in
tmp_path, the scripted model); ``dirk verify`` runs as a subprocess. What the
tests assert is read back from the journal, never from printed text.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import anyio
import msgspec
import pytest

from examples import booking, coding, trading
from examples.clock import MARKET_OPEN_NS
from examples.desk import DESK, REFUSALS
from examples.desk_model import playbooks
from examples.market import plan_day
from examples.summary import read_events
from kernel.audit import Event, Projections, fold, open_journal, payload_of, payloads, whatif
from kernel.audit.counterfactual import WhatIf
from kernel.cli import main as cli_main
from kernel.core.events import (
    AgentStatusChanged,
    ArtifactStored,
    CitationsChecked,
    CompensationSucceeded,
    ConstraintAdded,
    DriftBreached,
    DuplicateSuppressed,
    ExecutionSucceeded,
    FlowAborted,
    FlowCompensated,
    FlowCreated,
    FlowDirty,
    FlowEscalated,
    FlowFlagged,
    GrantIssued,
    GrantUsed,
    HumanDecided,
    MemoryQueried,
    Payload,
    ProposalRejected,
    ProposalSubmitted,
    ResourceReleased,
    RuleDecided,
    digest,
)
from kernel.policy import parse_money
from kernel.state.drift import OPERATOR, evaluate, monitors_of, reevaluate, unproven
from kernel.telemetry import spans_for_events, trace_id_for
from policies.trading import TRADING
from tests.support import SUPPORT
from tests.support.extras import require

MINUTES = "40"
TRADING_PACK_CODES = {
    # The DIM's layers over trading.place_order, as the scenario reaches them.
    "SCHEMA_INVALID",
    "UNAUTHORIZED",
    "EXPIRED",
    "STALE_CONTEXT",
    "INSUFFICIENT_RESOURCES",
    "RESOURCE_CONTENTION",
    "RISK_LIMIT_EXCEEDED",
    "LOW_CONFIDENCE",
    "APPROVAL_REQUIRED",
    "GUARD_EMERGENCY",
    # A human's answer, and what execution can say.
    "HUMAN_REJECTED",
    "EXECUTION_CONSTRAINT_VIOLATED",
    "EXECUTION_FAILED",
    "COMPENSATED",
}


P = TypeVar("P", bound=Payload)


class Example(Protocol):
    """An example module: ``main`` takes its command line and returns its exit status."""

    def main(self, argv: list[str] | None = None) -> int: ...


@dataclass(frozen=True)
class Recorded(Generic[P]):
    """A recorded event whose payload is known to be a ``P`` (its fields read with their types)."""

    event: Event
    payload: P

    @property
    def seq(self) -> int:
        return self.event.seq

    @property
    def dfid(self) -> str:
        """The flow the event belongs to: every event these tests read by type is a flow's."""
        assert self.event.dfid is not None, f"event {self.seq} ({self.event.type}) has no flow"
        return self.event.dfid


def read_events_of(db: Path) -> list[Event]:
    return anyio.run(read_events, db)


def run_example(
    module: Example, db: Path, *args: str, capsys: pytest.CaptureFixture[str]
) -> dict[str, Any]:
    code = module.main(["--db", str(db), "--json", *args])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0, out
    return dict(json.loads(out[-1]))


def codes_in(events: list[Event]) -> Counter[str]:
    """Reason codes recorded by rejections, escalations and endings (read from the journal)."""
    codes: Counter[str] = Counter()
    for e in events:
        p = e.payload
        if isinstance(p, ProposalRejected):
            codes[str(p.feedback.reason_code)] += 1
        elif isinstance(p, FlowEscalated | FlowAborted):
            codes[str(p.reason_code)] += 1
        elif isinstance(p, FlowCompensated):
            codes["COMPENSATED"] += 1
    return codes


def of_type(events: list[Event], kind: type[P]) -> list[Recorded[P]]:
    return [Recorded(e, e.payload) for e in events if isinstance(e.payload, kind)]


def without_paths(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k not in ("inspect", "verify")}


def digest_of(projections: Projections) -> str:
    try:
        return projections.digest()
    except TypeError:  # memory keyed by seq, before the issue-6 fix
        return digest(msgspec.to_builtins(projections.snapshot(), str_keys=True))


def test_the_same_trading_seed_gives_the_same_summary_and_projection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = run_example(
        trading, tmp_path / "a.db", "--seed", "3", "--minutes", MINUTES, capsys=capsys
    )
    second = run_example(
        trading, tmp_path / "b.db", "--seed", "3", "--minutes", MINUTES, capsys=capsys
    )
    assert without_paths(first) == without_paths(second)
    events = read_events_of(tmp_path / "b.db")
    assert first["projection_hash"] == digest_of(fold(events))
    other = run_example(
        trading, tmp_path / "c.db", "--seed", "4", "--minutes", MINUTES, capsys=capsys
    )
    assert other["projection_hash"] != first["projection_hash"]


@pytest.mark.parametrize("seed", [1, 2])
def test_a_trading_day_shows_every_part_of_the_kernel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seed: int
) -> None:
    db = tmp_path / "desk.db"
    summary = run_example(trading, db, "--seed", str(seed), "--minutes", MINUTES, capsys=capsys)
    events = read_events_of(db)
    codes = codes_in(events)
    assert TRADING_PACK_CODES <= set(codes), TRADING_PACK_CODES - set(codes)
    assert summary["reason_codes"] == dict(sorted(codes.items()))

    # Duplicates: a resent submission answered from the record, and deliveries the
    # broker absorbed (its receipts say so, and the journal keeps the receipts).
    assert of_type(events, DuplicateSuppressed)
    absorbed = [e for e in of_type(events, ExecutionSucceeded) if e.payload.detail]
    assert absorbed and summary["duplicates_prevented"] >= 1 + len(absorbed)

    # The rotation saga: the sell took effect, the halted buy failed, the sell was undone.
    [dirty] = of_type(events, FlowDirty)
    assert dirty.payload.step == 2
    undone = [e for e in of_type(events, CompensationSucceeded) if e.dfid == dirty.dfid]
    assert [e.payload.step for e in undone] == [1]
    assert fold(events).flows[dirty.dfid].status == "COMPENSATED"

    # Escalations answered by the scripted operator: at least one each way.
    decisions = Counter(e.payload.decision for e in of_type(events, HumanDecided))
    assert decisions["approve"] >= 1 and decisions["reject"] >= 1
    # An approved order went on to execute; no flow is left waiting.
    approved = {e.dfid for e in of_type(events, HumanDecided) if e.payload.decision == "approve"}
    executed = {e.dfid for e in of_type(events, ExecutionSucceeded)}
    assert approved & executed
    assert "ESCALATED" not in summary["flows"]

    # The soft guard: an order whose explanation argues for the other side is flagged
    # after its verdict and still executes; one that argues hard is blocked and revised.
    flagged = {e.dfid for e in of_type(events, FlowFlagged)}
    assert flagged and summary["needs_review"] == len(flagged)
    assert flagged & executed
    blocked = [
        e.dfid
        for e in of_type(events, ProposalRejected)
        if e.payload.feedback.reason_code == "GUARD_EMERGENCY"
    ]
    assert blocked and all(fold(events).flows[d].status == "CLOSED" for d in blocked)

    # Money: every executed order spent its notional in the desk's rolling day.
    [(budget, used)] = summary["budget_used"].items()
    assert budget == "daily-notional (desk)" and used.endswith(" USD")
    spent = sum(
        e.payload.amount
        for e in of_type(events, ResourceReleased)
        if e.payload.pool.startswith("money:") and e.payload.reason == "CLOSED"
    )
    assert parse_money(used) == (spent, "USD")

    # Child flows of the mandate; the broker's effects happened once per key.
    flows = fold(events).flows
    mandate = next(f for f in flows.values() if f.proposal and f.proposal.kind.endswith("mandate"))
    assert sum(f.parent_dfid == mandate.dfid for f in flows.values()) >= int(MINUTES) - 1
    keys = [k for k, *_ in trading_ledger(tmp_path / "desk.broker.db")]
    assert len(keys) == len(set(keys))


def test_a_drifting_hedger_is_demoted_by_the_desks_monitor_then_restored_by_an_operator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "desk.db"
    code = trading.main(["--db", str(db), "--seed", "1", "--minutes", MINUTES])
    out = capsys.readouterr().out
    assert code == 0, out
    events = read_events_of(db)
    plan = plan_day(1, int(MINUTES))
    starts, degrades, rolled_back = plan.drift

    # The breach: the desk's refusal monitor, over the hedger's refused hedges.
    [breach] = of_type(events, DriftBreached)
    found = breach.payload
    assert (found.pack, found.monitor, found.subject) == (
        f"desk@{DESK.version}",
        "refusals",
        "hedger",
    )
    assert REFUSALS.bound is not None and found.value > REFUSALS.bound
    assert found.samples >= REFUSALS.min_samples and found.action == "demote"
    assert f"drift breach (seq {breach.seq}): monitor refusals of desk@0.3.0, agent hedger" in out

    # Its action, in the same append: PASSIVE by operator ``drift``; then Ed restores it.
    changes = [c for c in of_type(events, AgentStatusChanged) if c.event.agent_id == "hedger"]
    demoted, restored = changes
    assert demoted.seq == breach.seq + 1 and demoted.payload.operator == OPERATOR
    assert demoted.payload.status == "PASSIVE"
    assert (restored.payload.status, restored.payload.operator) == ("ACTIVE", "ed")
    assert minute_of(restored.event.ts) == rolled_back
    assert f"hedger ACTIVE at minute {rolled_back + 1} by ed" in out

    # Refused while degraded; no flow while PASSIVE; accepted again once restored.
    flows = fold(events).flows
    hedges = [f for f in of_type(events, FlowCreated) if f.event.agent_id == "hedger"]
    minutes = {minute_of(f.event.ts): flows[f.dfid] for f in hedges}
    demoted_at = minute_of(demoted.event.ts)
    assert min(minutes) == starts and degrades < demoted_at < rolled_back
    assert all(f.status == "CLOSED" for m, f in minutes.items() if m < degrades)
    refused = {
        minute_of(r.event.ts)
        for r in of_type(events, ProposalRejected)
        if flows[r.dfid].agent_id == "hedger"
    }
    assert refused == set(range(degrades, demoted_at + 1))
    assert not [m for m in minutes if demoted_at < m < rolled_back]
    assert [m for m, f in minutes.items() if m > rolled_back and f.status == "CLOSED"]

    # Replayed, the journal gives the same breach: its window read again, and monitor by
    # monitor from the start (what ``dirk verify --verdicts`` does).
    before = [e for e in events if e.seq < breach.seq]
    assert reevaluate(found, REFUSALS, before)
    again = evaluate(found.pack, REFUSALS, before, found.window_end_ns, as_of_seq=found.as_of_seq)
    assert again == [found]
    assert unproven(events, monitors_of([TRADING, DESK])) == []

    # And a span of its own, in no flow's trace: the window it spans, what crossed what.
    [span] = [s for s in spans_for_events(events) if s.name == "drift refusals"]
    assert span.parent is None and span.attributes is not None
    assert span.attributes["gen_ai.agent.id"] == "hedger"
    assert span.attributes["dir.drift.action"] == "demote"
    assert span.attributes["dir.seq"] == breach.seq
    assert span.start_time == found.window_start_ns and span.end_time == breach.event.ts
    flow_traces = {trace_id_for(d) for d in flows}
    assert span.context is not None and span.context.trace_id not in flow_traces


def minute_of(ts_ns: int) -> int:
    """The simulated day's minute an event was recorded in."""
    return (ts_ns - MARKET_OPEN_NS) // 60_000_000_000


def trading_ledger(path: Path) -> list[tuple[str, str, dict[str, Any]]]:
    from kernel.testing import SimulatedSystem

    system = SimulatedSystem(path)
    try:
        return system.ledger()
    finally:
        system.close()


def test_without_an_operator_escalations_stay_pending(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "desk.db"
    args = ("--seed", "1", "--minutes", MINUTES, "--operator", "none")
    summary = run_example(trading, db, *args, capsys=capsys)
    events = read_events_of(db)
    assert not of_type(events, HumanDecided)
    escalated = {e.dfid for e in of_type(events, FlowEscalated)}
    flows = fold(events).flows
    assert escalated and all(flows[d].status == "ESCALATED" for d in escalated)
    assert summary["escalation_endings"] == {"pending": len(escalated)}


def test_a_day_too_short_for_the_plan_is_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="at least"):
        plan_day(1, 10)
    assert trading.main(["--minutes", "10"]) == 2


def test_the_desks_model_stands_down_when_the_budget_is_spent() -> None:
    # Asking again with the same money cannot pass a spent budget: an agent that did would
    # fill the rest of the day with refusals (P6 measured 881 of them on a whole day).
    spent = {
        "reason_code": "BUDGET_EXHAUSTED",
        "detail": "budget daily-notional (desk, 86400 s window): 8,305.36 USD wanted",
        "field": None,
    }
    books = playbooks(plan_day(1, 390))
    trade = {"symbol": "ACME", "price": "296.03", "history": ["295.88", "296.03"], "minute": 200}
    risk = {"prices": {"ACME": "296.03"}, "positions": {"ACME": 400}}
    for name, task in (("trade", trade), ("risk", risk)):
        assert books[name](task, random.Random(1))["proposal"] is not None
        answer = books[name]({**task, "feedback": spent}, random.Random(1))
        assert answer["proposal"] is None and "budget is spent" in answer["explain"]


def test_openai_without_its_environment_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_MODEL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    for module in (trading, booking):
        db = tmp_path / f"{module.__name__}.db"
        assert module.main(["--llm", "openai", "--db", str(db)]) == 2
        err = capsys.readouterr().err
        assert "OPENAI_API_KEY" in err and "Traceback" not in err
        assert not db.exists()


def test_the_booking_story_is_in_the_journal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "travel.db"
    summary = run_example(booking, db, "--seed", "1", capsys=capsys)
    events = read_events_of(db)

    # The mistake: a non-accessible room for ana, accepted and booked.
    [lesson] = of_type(events, ConstraintAdded)
    assert lesson.payload.text == booking.LESSON and lesson.payload.priority == "learned"
    # The row of that seq (an acceptance carried by its submission shares its seq).
    mistake = next(e for e in events if e.seq == (lesson.payload.triggered_by or 0))
    assert type(mistake.payload).__name__ == "ProposalSubmitted"
    params = payload_of(mistake, ProposalSubmitted).proposal.params
    assert params["traveller"] == "ana" and params["room_type"] != "accessible"
    assert fold([e for e in events if e.seq < lesson.seq]).flows[mistake.dfid or ""].status == (
        "CLOSED"
    )

    # After the lesson: refused until the agent queried accessibility, then booked.
    after = [e for e in events if e.seq > lesson.seq]
    refused = [
        e
        for e in of_type(after, ProposalRejected)
        if e.payload.feedback.reason_code == "VERIFICATION_REQUIRED"
    ]
    [query] = of_type(after, MemoryQueried)
    assert refused and refused[0].seq < query.seq and "accessibility" in query.payload.topic
    rebooked = [
        e
        for e in of_type(after, ProposalSubmitted)
        if e.seq > query.seq and e.payload.proposal.params.get("traveller") == "ana"
    ]
    flows = fold(events).flows
    assert rebooked[0].payload.proposal.params["room_type"] == "accessible"
    assert flows[rebooked[0].dfid].status == "CLOSED"

    # A budget refusal and an approved expensive booking.
    codes = codes_in(events)
    assert codes["RISK_LIMIT_EXCEEDED"] >= 1 and codes["APPROVAL_REQUIRED"] >= 1
    assert [e.payload.decision for e in of_type(events, HumanDecided)] == ["approve"]

    # dee's week was granted in advance: her suite, above the threshold, asked no human.
    [issued] = of_type(events, GrantIssued)
    [used] = of_type(events, GrantUsed)
    assert used.payload.grant == issued.payload.grant and used.payload.uses == 1
    assert used.payload.escalation == "APPROVAL_REQUIRED"
    assert (used.payload.amount, used.payload.currency) == (300_000, "EUR")
    dee = fold(events).flows[used.dfid]
    assert dee.proposal is not None and dee.proposal.params["traveller"] == "dee"
    assert dee.status == "CLOSED"
    assert summary["grant_uses"] == {issued.payload.grant: "1 of 3 (LIVE)"}

    # The counterfactual: had the lesson been in force from the start, the first
    # booking would have been refused; and replaying it wrote nothing.
    replay = anyio.run(counterfactual, db)
    [change] = [c for c in replay.changes if c.dfid == mistake.dfid]
    assert change.then == "accepted" and change.reason_code == "VERIFICATION_REQUIRED"
    assert len(read_events_of(db)) == len(events)
    assert summary["story.counterfactual"] == [c.line() for c in replay.changes]

    # The lesson is also a house rule with its provenance, and the agent cites it after.
    [decided] = of_type(events, RuleDecided)
    assert decided.payload.rule == "access" and decided.payload.decision == "promote"
    cited = [e for e in of_type(events, CitationsChecked) if e.seq > decided.seq]
    assert cited and all(e.payload.correct == ["access@v1"] for e in cited)
    why = subprocess.run(
        [sys.executable, "-m", "kernel", "why", "access", "--db", str(db)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "rule access: current v1" in why and "travel-desk/handbook" in why


async def counterfactual(db: Path) -> WhatIf:
    async with open_journal(db, readonly=True) as journal:
        head = journal.head_seq
        replay = await whatif(journal, constraint=booking.LESSON, at=1, priority="learned")
        assert journal.head_seq == head
    return replay


def test_the_booking_agent_reads_the_hotels_statement_from_the_artifact_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "travel.db"
    run_example(booking, db, "--seed", "1", capsys=capsys)
    events = read_events_of(db)
    [stored] = payloads(events, ArtifactStored)
    assert stored.size == len(booking.STATEMENT.encode()) > 2048
    # The agent fetched it (only a context naming it lets it) and booked the room it names.
    explains = [p.proposal.explain for p in payloads(events, ProposalSubmitted)]
    assert any("Room 12 (accessible category): step-free" in x for x in explains)
    # The journal holds the reference, never the bytes.
    raw = sqlite3.connect(db).execute("SELECT body FROM events").fetchall()
    assert not any(b"roll-in shower" in bytes(body) for (body,) in raw)


def test_the_same_booking_seed_gives_the_same_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = run_example(booking, tmp_path / "a.db", "--seed", "5", capsys=capsys)
    second = run_example(booking, tmp_path / "b.db", "--seed", "5", capsys=capsys)
    assert without_paths(first) == without_paths(second)


def needs_git() -> None:
    """The coding example works a real git repository: skip without git (fail under CI)."""
    if shutil.which("git") is None:
        if os.environ.get("CI"):
            pytest.fail("git is not installed (CI=true: every example must run)")
        pytest.skip("git is not installed: the coding example works a real repository")


def test_the_coding_story_is_in_the_journal_and_the_repository(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    needs_git()
    db = tmp_path / "coding.db"
    summary = run_example(coding, db, capsys=capsys)
    events = read_events_of(db)
    # Every refusal the story is made of, each recorded with its reason code.
    assert {
        "CONSTRAINT_VIOLATION",  # a claim before its dependency; a done task patched
        "RESOURCE_CONTENTION",  # a claimed task claimed again; a file of an open task
        "UNAUTHORIZED",  # a path outside the agent's contract
        "STALE_CONTEXT",  # a diff made against an older version of the file
        "VERIFICATION_REQUIRED",  # completed before its tests passed
    } <= {str(e.payload.feedback.reason_code) for e in of_type(events, ProposalRejected)}
    runs = [
        e.payload.detail["passed"]
        for e in of_type(events, ExecutionSucceeded)
        if "passed" in e.payload.detail
    ]
    assert False in runs and runs[-1] is True  # a test run failed, and was fixed
    roadmap = fold(events).snapshot()["roadmap"]
    assert {t: task["state"] for t, task in roadmap["tasks"].items()} == dict.fromkeys(
        ["T-1", "T-2", "T-3", "T-4", "T-1.fix1"], "done"
    )
    assert roadmap["tasks"]["T-1"]["issues"][0]["hotfix"] == "T-1.fix1"
    assert summary["roadmap_hash"] == digest(roadmap) and summary["verified"] is True
    # One commit per recorded patch, named by its key; the repository is clean.
    repo = tmp_path / "coding.repo"
    log = subprocess.run(
        ["git", "log", "--format=%H %(trailers:key=Dirk-Key,valueonly,separator=)"],
        cwd=repo, capture_output=True, text=True, check=True,
    ).stdout.split("\n")  # fmt: skip
    committed = dict(line.split(" ", 1)[::-1] for line in log if line.strip(" ").count(" "))
    patched = {
        e.payload.key: e.payload.external_id
        for e in of_type(events, ExecutionSucceeded)
        if "files" in e.payload.detail
    }
    assert committed == patched and len(patched) == 5


def test_the_same_coding_seed_gives_the_same_journal_roadmap_and_commits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The commits are built with the clock's time: the same seed, the very same history."""
    needs_git()
    first = run_example(coding, tmp_path / "a.db", capsys=capsys)
    second = run_example(coding, tmp_path / "b.db", capsys=capsys)
    assert without_paths(first) == without_paths(second)
    heads = [
        subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=tmp_path / f"{name}.repo",
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for name in ("a", "b")
    ]
    assert heads[0] == heads[1] and len(heads[0].strip()) == 40


@pytest.mark.parametrize("example", ["trading", "booking", "coding"])
def test_dirk_verify_passes_on_the_example_journals(tmp_path: Path, example: str) -> None:
    if example == "coding":
        needs_git()
    db = tmp_path / f"{example}.db"
    args = ["--minutes", MINUTES] if example == "trading" else []
    run = [sys.executable, "-m", f"examples.{example}", "--seed", "1", "--db", str(db), *args]
    subprocess.run(run, check=True, capture_output=True, timeout=120)
    # The chain, the projections, and every verdict judged again by the example's packs.
    packs = {
        "trading": ["policies.trading", "examples.desk"],
        "booking": ["policies.booking"],
        "coding": ["policies.esaa"],
    }
    verdicts = [arg for pack in packs[example] for arg in ("--pack", pack)]
    verify = subprocess.run(
        [sys.executable, "-m", "kernel", "verify", "--db", str(db), "--verdicts", *verdicts],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "0 differ, 0 not compared" in verify.stdout
    if example == "trading":  # the hedger's breach, re-derived from the journal
        assert "verify: drift breaches ok: 1 of 1 re-derived" in verify.stdout


RECEIVER = SUPPORT / "otlp_receiver.py"


def test_the_trading_desk_sends_every_flow_to_an_otlp_receiver(tmp_path: Path) -> None:
    """With the standard variable set, every span the journal implies reaches a real receiver."""
    db = tmp_path / "desk.db"
    receiver = subprocess.Popen(
        [sys.executable, str(RECEIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert receiver.stdout is not None
        port = int(receiver.stdout.readline().removeprefix("PORT "))
        env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_SERVICE_NAME": "trading-desk",
        }
        # Read as it prints, as a collector would: a receiver stalled on a full pipe answers
        # late, and the kernel's exporter re-sends a batch it got no answer for.
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(receiver.stdout or ()))
        reader.start()
        run = [sys.executable, "-m", "examples.trading", "--seed", "1", "--db", str(db)]
        subprocess.run([*run, "--minutes", MINUTES], env=env, check=True, capture_output=True)
        # The example has exited, so its exporter has flushed; closing the receiver's stdin
        # ends it, and everything it received is on its stdout.
        assert receiver.stdin is not None
        receiver.stdin.close()
        receiver.wait(60)
        reader.join(60)
    finally:
        receiver.kill()
        receiver.wait()
        if receiver.stdout is not None:
            receiver.stdout.close()
    # Span lines only: the receiver prints the kernel's metric points too.
    received: list[dict[str, Any]] = [
        span for line in lines if "span_id" in (span := json.loads(line))
    ]

    expected = spans_for_events(read_events_of(db))
    assert len(expected) > 100
    assert sorted((s["trace_id"], s["span_id"]) for s in received) == sorted(
        (f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}") for s in expected
    )
    assert {s["service_name"] for s in received} == {"trading-desk"}
    # A drift breach is a trace of its own, no flow's (kernel.telemetry._drift).
    breaches = [s for s in received if s["name"].startswith("drift ")]
    assert all(not s["parent_span_id"] and "dir.dfid" not in s["attributes"] for s in breaches)
    roots = [s for s in received if not s["parent_span_id"] and s not in breaches]
    mandate = [s for s in roots if s["attributes"]["dir.agent_id"] == "strategist"]
    assert mandate, "the strategist's mandate is a root flow"
    # Every flow is its own trace, whose id is its DFID, linked to its parent flow's root.
    assert {s["trace_id"] for s in received if s not in breaches} == {s["trace_id"] for s in roots}
    by_dfid = {s["attributes"]["dir.dfid"]: s for s in roots}
    for root in roots:
        assert root["trace_id"] == uuid.UUID(root["attributes"]["dir.dfid"]).hex
        parent = root["attributes"].get("dir.parent_dfid")
        if parent:
            assert root["links"] == [[by_dfid[parent]["trace_id"], by_dfid[parent]["span_id"]]]
    children = [r for r in roots if r["attributes"].get("dir.parent_dfid")]
    assert children and all(r["links"] for r in children)
    assert not any(r["links"] for r in roots if r not in children)
    [saga] = [s for s in received if s["attributes"].get("dir.status") == "COMPENSATED"]
    assert saga["attributes"]["dir.reason_code"] == "COMPENSATED"
    undone = [s for s in received if s["name"].startswith("compensate ")]
    assert undone and {s["parent_span_id"] for s in undone} == {saga["span_id"]}


@pytest.mark.parametrize("framework", ["openai_agents", "pydantic_ai", "langgraph"])
def test_each_framework_example_books_its_rooms_under_the_kernel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], framework: str
) -> None:
    """Four rooms through a framework: what the journal holds, and the pause's one approval."""
    import importlib

    module_name, extra = {
        "openai_agents": ("agents", "openai-agents"),
        "pydantic_ai": ("pydantic_ai", "pydantic-ai"),
        "langgraph": ("langgraph", "langgraph"),
    }[framework]
    require(module_name, extra)  # skips outside CI, fails under it
    module: Example = importlib.import_module(f"examples.frameworks.{framework}")
    db = tmp_path / "trip.db"
    code = module.main(["--db", str(db), "--json"])
    assert code == 0
    events = read_events_of(db)
    assert len(of_type(events, ExecutionSucceeded)) == 2  # the cheap room, the approved one
    assert len(of_type(events, HumanDecided)) == 1
    codes = codes_in(events)
    # Each refusal is counted twice: the proposal's rejection and its flow's end.
    assert codes["RISK_LIMIT_EXCEEDED"] == 2 and codes["CONSTRAINT_VIOLATION"] == 2
    assert codes["APPROVAL_REQUIRED"] == 1
    [created] = [e for e in of_type(events, FlowCreated) if e.payload.tool_call_id == "call_3"]
    assert created.payload.conversation_id == "trip-42"


@pytest.mark.parametrize("example", ["trading", "booking"])
def test_the_examples_sign_their_journal_and_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], example: str
) -> None:
    module: Example = {"trading": trading, "booking": booking}[example]
    args = ("--seed", "2", "--minutes", MINUTES) if example == "trading" else ("--seed", "2")
    db = tmp_path / f"{example}.db"
    summary = run_example(module, db, *args, capsys=capsys)
    assert summary["checkpoints"] == f"signed; the latest covers all {summary['events']} events"
    public = tmp_path / f"{example}.checkpoint.pub"
    assert f"--public-key {public}" in summary["verify"]
    assert oct((tmp_path / f"{example}.checkpoint.pem").stat().st_mode)[-3:] == "600"
    assert cli_main(["verify", "--db", str(db), "--public-key", str(public)]) == 0
