"""``dirk`` run as a real subprocess against a journal a real kernel wrote."""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import closing, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kernel import HumanDecision, ReasonCode
from kernel.audit import open_journal
from kernel.core.events import Draft, FlowAborted, FlowCreated
from kernel.core.reasons import CliError, ExitCode
from kernel.journal.codec import unpack
from kernel.telemetry import export_flows, span_id_for
from kernel.testing import action_of
from tests.support import SUPPORT
from tests.support.helpers import ScriptedAgent, Transfer, kernel_for, transfer
from tests.support.ports import free_port

RECEIVER = SUPPORT / "otlp_receiver.py"
AGENTS = ("clerk", "other", "auditor", "reviewer")
# A command that cannot hang should still not hang the suite if it regresses.
COMMAND_TIMEOUT_S = 60
ERROR_LINE = re.compile(r"^error: ([A-Z_]+): .+$")


@dataclass(frozen=True)
class Recorded:
    """A journal a real kernel wrote, and the DFIDs of its flows."""

    path: Path
    closed: str  # accepted on the first attempt, executed, closed
    child: str  # a child flow of ``closed``
    retried: str  # rejected once, accepted on attempt two
    aborted: str  # escalated, then aborted by a human
    overridden: str  # rejected, escalated, overridden by a human, executed

    def events(self) -> int:
        with closing(sqlite3.connect(self.path)) as db:
            ((count,),) = db.execute("SELECT count(*) FROM events")
        return int(count)


def schema_invalid(ctx: Any) -> Any:
    return ctx.propose({"kind": "test.transfer", "account": "a", "amount_cents": "ten"})


def vendor_invoice(ctx: Any) -> Any:
    return ctx.propose(
        Transfer(account="acc-7", amount_cents=4_200),
        explain="ACME invoice 42 is due today",
        confidence=0.3,
    )


async def record(path: Path) -> Recorded:
    async with kernel_for(path, allow=AGENTS) as kernel:
        await kernel.register(ScriptedAgent("clerk", [transfer(250)], subscriptions=["bank"]))
        await kernel.register(
            ScriptedAgent("other", [schema_invalid, transfer(10)], subscriptions=["retry"])
        )
        await kernel.register(
            ScriptedAgent("auditor", [transfer(9_000, confidence=0.2)], subscriptions=["audit"])
        )
        await kernel.register(
            ScriptedAgent("reviewer", [schema_invalid, vendor_invoice], subscriptions=["review"])
        )
        [closed] = await kernel.trigger("bank.invoice", {"bank.invoice.amount": 250})
        [retried] = await kernel.trigger("retry.invoice")
        [aborted] = await kernel.trigger("audit.check")
        [overridden] = await kernel.trigger("review.invoice", {"review.invoice.vendor": "ACME"})
        await kernel.wait_quiet()
        [child] = await kernel.trigger("bank.refund", parent=closed)
        await kernel.decide(aborted, HumanDecision.ABORT, operator="ana", reason="looks wrong")
        await kernel.decide(
            overridden,
            HumanDecision.OVERRIDE,
            operator="bob",
            reason="vendor confirmed by phone",
            action_hash=action_of(kernel, overridden),
        )
        await kernel.wait_quiet()
    return Recorded(path, closed, child, retried, aborted, overridden)


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return anyio.run(record, tmp_path_factory.mktemp("journal") / "j.db")


def copy_of(journal: Recorded, dest: Path) -> Path:
    """Copy the journal (with whatever its WAL holds) to a standalone file."""
    with closing(sqlite3.connect(journal.path)) as src, closing(sqlite3.connect(dest)) as dst:
        src.backup(dst)
    return dest


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return env | extra


def dirk(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernel", *map(str, args)],
        capture_output=True,
        text=True,
        env=env if env is not None else clean_env(),
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """Return the code of the single ``error: CODE: ...`` line on stderr."""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    match = ERROR_LINE.match(lines[0])
    assert match, lines[0]
    return match.group(1)


# --- verify ----------------------------------------------------------------------


def test_verify_accepts_the_journal_and_reports_its_length_and_head(journal: Recorded) -> None:
    result = dirk("verify", "--db", journal.path)

    assert result.returncode == 0, result.stderr
    last = result.stdout.splitlines()[-1]
    match = re.fullmatch(r"verify: ok events=(\d+) head=([0-9a-f]{64})", last)
    assert match, last
    assert int(match.group(1)) == journal.events()
    with closing(sqlite3.connect(journal.path)) as db:
        ((head,),) = db.execute("SELECT hash FROM events ORDER BY seq DESC LIMIT 1")
    assert match.group(2) == head.hex()


def edit_body(path: Path, where: str, params: tuple[Any, ...], old: bytes, new: bytes) -> int:
    """Replace ``old`` by ``new`` in the body of the row ``where`` selects; return its seq."""
    with closing(sqlite3.connect(path)) as db, db:
        seq, body = db.execute(f"SELECT seq, body FROM events WHERE {where}", params).fetchone()
        # Written back as plain JSON, which a journal of compressed bodies reads too.
        body = unpack(body)
        edited = body.replace(old, new, 1)
        assert edited != body
        json.loads(edited)  # still valid JSON: only the hash chain can tell
        db.execute("UPDATE events SET body = ? WHERE seq = ?", (edited, seq))
    return int(seq)


@pytest.mark.parametrize("row", ["an amount in the middle", "the time of the last event"])
def test_verify_names_the_row_edited_behind_the_kernels_back(
    journal: Recorded, tmp_path: Path, row: str
) -> None:
    path = copy_of(journal, tmp_path / "edited.db")
    if row == "an amount in the middle":
        where = "dfid = ? AND type = 'ProposalSubmitted'"
        seq = edit_body(
            path, where, (journal.closed,), b'"amount_cents":250', b'"amount_cents":251'
        )
    else:
        where = "seq = (SELECT max(seq) FROM events)"
        seq = edit_body(path, where, (), b'"ts":1', b'"ts":2')

    result = dirk("verify", "--db", path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"seq {seq}:" in result.stdout
    assert "Traceback" not in result.stderr


def test_verify_names_a_deleted_row(journal: Recorded, tmp_path: Path) -> None:
    path = copy_of(journal, tmp_path / "deleted.db")
    with closing(sqlite3.connect(path)) as db, db:
        ((seq,),) = db.execute(
            "SELECT seq FROM events WHERE dfid = ? AND type = 'ProposalRejected'",
            (journal.retried,),
        )
        db.execute("DELETE FROM events WHERE seq = ?", (seq,))

    result = dirk("verify", "--db", path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"seq {seq}:" in result.stdout
    assert "missing" in result.stdout


# --- flows and show ---------------------------------------------------------------


def test_flows_lists_every_flow_with_its_status(journal: Recorded) -> None:
    result = dirk("flows", "--db", journal.path, "--json")

    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    by_dfid = {row["dfid"]: row for row in rows}
    assert len(rows) == len(by_dfid) == 5
    assert {dfid: row["status"] for dfid, row in by_dfid.items()} == {
        journal.closed: "CLOSED",
        journal.child: "CLOSED",
        journal.retried: "CLOSED",
        journal.aborted: "ABORTED",
        journal.overridden: "CLOSED",
    }
    assert by_dfid[journal.retried]["attempts"] == 2
    assert by_dfid[journal.aborted]["reason_code"] == "HUMAN_REJECTED"
    assert by_dfid[journal.aborted]["agent_id"] == "auditor"
    assert by_dfid[journal.child]["parent_dfid"] == journal.closed
    assert by_dfid[journal.closed]["policy_kind"] == "test.transfer"


@pytest.mark.parametrize("status", ["ABORTED", "aborted"])
def test_flows_filters_by_status(journal: Recorded, status: str) -> None:
    result = dirk("flows", "--db", journal.path, "--json", "--status", status)

    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(row["dfid"], row["status"]) for row in rows] == [(journal.aborted, "ABORTED")]


def test_flows_table_counts_the_flows(journal: Recorded) -> None:
    result = dirk("flows", "--db", journal.path, "--status", "CLOSED")

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "4 flows"
    assert journal.aborted not in result.stdout


def test_flows_refuses_an_unknown_status(journal: Recorded) -> None:
    result = dirk("flows", "--db", journal.path, "--status", "FINISHED")

    assert result.returncode == 2
    assert "invalid choice" in result.stderr
    assert "Traceback" not in result.stderr


def in_order(text: str, *parts: str) -> None:
    """Assert every part occurs in ``text``, each after the one before."""
    at = 0
    for part in parts:
        found = text.find(part, at)
        assert found >= 0, f"{part!r} not found after position {at} in:\n{text}"
        at = found + len(part)


def test_show_tells_the_story_of_a_flow(journal: Recorded) -> None:
    result = dirk("show", journal.overridden, "--db", journal.path)

    assert result.returncode == 0, result.stderr
    in_order(
        result.stdout,
        f"DecisionFlow {journal.overridden}",
        "agent reviewer",
        "FlowCreated",
        "trigger 'review.invoice'",
        "ContextCompiled",
        "attempt 1, context",
        "review.invoice.vendor=ACME",
        "ProposalSubmitted",
        "attempt 1: test.transfer",
        '"amount_cents": "ten"',
        "ProposalRejected",
        "REJECTED SCHEMA_INVALID (schema at params.amount_cents)",
        "ContextCompiled",
        "attempt 2",
        "feedback SCHEMA_INVALID",
        "ProposalSubmitted",
        'attempt 2: test.transfer {"account": "acc-7", "amount_cents": 4200} confidence 0.3',
        "explain: 'ACME invoice 42 is due today'",
        "FlowEscalated",
        "ESCALATED LOW_CONFIDENCE",
        "HumanDecided",
        "override by bob: 'vendor confirmed by phone'",
        "ProposalAccepted",
        "ACCEPTED by a human",
        "ExecutionStarted",
        "intent test.transfer via bank",
        "ExecutionSucceeded",
        "external id tx-",
        "FlowClosed",
        "CLOSED",
        "final status CLOSED after 2 attempts, external id tx-",
    )


def test_show_tells_of_a_human_abort(journal: Recorded) -> None:
    result = dirk("show", journal.aborted, "--db", journal.path)

    assert result.returncode == 0, result.stderr
    in_order(
        result.stdout,
        "trigger 'audit.check'",
        "confidence 0.2",
        "explain: 'pay the invoice'",
        "ESCALATED LOW_CONFIDENCE",
        "abort by ana: 'looks wrong'",
        "ABORTED HUMAN_REJECTED",
        "final status ABORTED after 1 attempt, reason HUMAN_REJECTED",
    )
    assert "ExecutionStarted" not in result.stdout


def test_show_names_the_parent_of_a_child_flow(journal: Recorded) -> None:
    result = dirk("show", journal.child, "--db", journal.path)

    assert result.returncode == 0, result.stderr
    assert f"parent {journal.closed}" in result.stdout


def test_show_of_an_unknown_flow_says_so(journal: Recorded) -> None:
    unknown = str(uuid.UUID(int=1))

    result = dirk("show", unknown, "--db", journal.path)

    assert result.returncode == 1
    assert result.stdout == ""
    assert one_error_line(result) == "UNKNOWN_FLOW"
    assert unknown in result.stderr


# --- files that are not journals -------------------------------------------------


def bad_file(kind: str, journal: Recorded, tmp_path: Path) -> Path:
    path = tmp_path / f"{kind}.db"
    match kind:
        case "random bytes":
            path.write_bytes(bytes(range(256)) * 64)
        case "truncated":
            whole = copy_of(journal, tmp_path / "whole.db").read_bytes()
            path.write_bytes(whole[: len(whole) // 2])
        case "foreign":
            with closing(sqlite3.connect(path)) as db, db:
                db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, amount INTEGER)")
                db.execute("INSERT INTO invoices (amount) VALUES (250)")
        case "empty":
            path.write_bytes(b"")
        case "missing":
            pass
        case "a directory":
            path.mkdir()
    return path


BAD_FILES = {
    "random bytes": "JOURNAL_CORRUPT",
    "truncated": "JOURNAL_CORRUPT",
    "foreign": "JOURNAL_FOREIGN",
    "empty": "JOURNAL_FOREIGN",
    "missing": "JOURNAL_ERROR",
    "a directory": "JOURNAL_ERROR",
}
COMMANDS = {
    "verify": ["verify"],
    "anchor": ["anchor"],
    "flows": ["flows", "--json"],
    "show": ["show", str(uuid.UUID(int=1))],
    "traces export": ["traces", "export"],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("kind", BAD_FILES)
def test_a_file_that_is_not_a_journal_is_one_error_line(
    journal: Recorded, tmp_path: Path, kind: str, command: str
) -> None:
    path = bad_file(kind, journal, tmp_path)
    # With an exporter configured, only the file can be what is wrong.
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")

    result = dirk(*COMMANDS[command], "--db", path, env=env)

    if command in ("verify", "anchor") and kind not in ("missing", "a directory"):
        # A file that is there but is no good journal is what verify exists to find.
        assert result.returncode == 1, result.stdout + result.stderr
        assert result.stderr == ""
        [line] = result.stdout.splitlines()
        assert line.startswith(f"{command}: FAILED: {BAD_FILES[kind]}: journal {path}: ")
        return
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert one_error_line(result) == BAD_FILES[kind]
    assert str(path) in result.stderr
    if kind == "missing":
        assert not path.exists()  # reading never creates a journal


# --- traces export ---------------------------------------------------------------


async def read_line(stdout: BufferedByteReceiveStream) -> str:
    return (await stdout.receive_until(b"\n", 1 << 20)).decode()


async def expected_spans(journal: Recorded, dfid: str) -> dict[str, Any]:
    """The spans ``traces export --dfid`` should send, by span id in hex."""
    async with open_journal(journal.path, readonly=True) as j:
        events = [event async for batch in j.scan() for event in batch]
    exporter = InMemorySpanExporter()
    export_flows(events, SimpleSpanProcessor(exporter), dfid=dfid)
    return {f"{s.context.span_id:016x}": s for s in exporter.get_finished_spans() if s.context}


async def export_to_receiver(*args: str) -> tuple[subprocess.CompletedProcess[bytes], list[Any]]:
    """Run ``dirk traces export`` against a real OTLP receiver; return it and what arrived."""
    received: list[Any] = []

    async def collect(stdout: BufferedByteReceiveStream) -> None:
        # Read as the spans arrive: a receiver blocked on a full pipe would stall the export.
        while True:
            try:
                received.append(json.loads(await read_line(stdout)))
            except (anyio.EndOfStream, anyio.IncompleteRead):
                return

    with anyio.fail_after(COMMAND_TIMEOUT_S):
        async with await anyio.open_process([sys.executable, str(RECEIVER)]) as receiver:
            try:
                assert receiver.stdin is not None and receiver.stdout is not None
                stdout = BufferedByteReceiveStream(receiver.stdout)
                port = int((await read_line(stdout)).removeprefix("PORT "))
                env = clean_env(
                    OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                    OTEL_SERVICE_NAME="dirk-test",
                )
                async with anyio.create_task_group() as tg:
                    tg.start_soon(collect, stdout)
                    result = await anyio.run_process(
                        [sys.executable, "-m", "kernel", "traces", "export", *args],
                        env=env,
                        check=False,
                    )
                    # dirk returned after the receiver answered every export, so every
                    # span is printed already: end the receiver, and with it its output.
                    await receiver.stdin.aclose()
                await receiver.wait()
            except BaseException:
                with suppress(ProcessLookupError):
                    receiver.terminate()
                raise
    return result, received


@pytest.mark.parametrize("flow", ["closed", "overridden"])
async def test_traces_export_sends_one_flow_tree_to_a_real_receiver(
    journal: Recorded, flow: str
) -> None:
    dfid = getattr(journal, flow)
    expected = await expected_spans(journal, dfid)

    result, received = await export_to_receiver("--db", str(journal.path), "--dfid", dfid)

    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == f"traces: exported {len(expected)} spans\n"
    # One trace per flow: its child (if any) is a trace of its own.
    flows_sent = {dfid, journal.child} if flow == "closed" else {dfid}
    assert {span["trace_id"] for span in received} == {
        f"{uuid.UUID(d).int:032x}" for d in flows_sent
    }
    by_id = {span["span_id"]: span for span in received}
    assert len(by_id) == len(received)
    assert by_id.keys() == expected.keys()
    for sid, span in by_id.items():
        want = expected[sid]
        assert span["name"] == want.name
        assert span["parent_span_id"] == (f"{want.parent.span_id:016x}" if want.parent else "")
        assert span["service_name"] == "dirk-test"
    root = by_id[f"{span_id_for(dfid, 'flow', 0):016x}"]
    assert root["attributes"]["dir.dfid"] == dfid
    assert root["parent_span_id"] == ""
    flows = {
        span["attributes"]["dir.dfid"] for span in received if "dir.dfid" in span["attributes"]
    }
    assert flows == ({dfid, journal.child} if flow == "closed" else {dfid})
    names = sorted(span["name"] for span in received)
    if flow == "overridden":
        judged = [name for name in names if name.startswith("apply_guardrail ")]
        assert len(judged) == 2
        assert any(name.startswith("escalation ") for name in names)
        assert any(name.startswith("execute_tool ") for name in names)


async def write_bulk_journal(path: Path, flows: int) -> None:
    """Write a journal of ``flows`` flows, each declined at once: one span apiece."""
    drafts = []
    for n in range(1, flows + 1):
        dfid = str(uuid.UUID(int=n, version=4))
        drafts += [
            Draft(payload=FlowCreated(root_dfid=dfid, topic="bulk"), dfid=dfid),
            Draft(payload=FlowAborted(reason_code=ReasonCode.AGENT_DECLINED), dfid=dfid),
        ]
    async with open_journal(path) as journal:
        await journal.append(drafts)


async def test_traces_export_sends_more_spans_than_the_default_export_queue_holds(
    tmp_path: Path,
) -> None:
    path = tmp_path / "bulk.db"
    flows = 9_000  # the kernel's default export queue holds 8192 spans
    await write_bulk_journal(path, flows)

    result, received = await export_to_receiver("--db", str(path))

    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == f"traces: exported {flows} spans\n"
    assert len({span["span_id"] for span in received}) == len(received) == flows


def test_traces_export_of_an_unknown_flow_says_so(journal: Recorded) -> None:
    unknown = str(uuid.UUID(int=1))
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")

    result = dirk("traces", "export", "--db", journal.path, "--dfid", unknown, env=env)

    assert result.returncode == 1
    assert one_error_line(result) == "UNKNOWN_FLOW"
    assert unknown in result.stderr


def test_traces_export_without_an_exporter_says_how_to_configure_one(journal: Recorded) -> None:
    result = dirk("traces", "export", "--db", journal.path, env=clean_env())

    assert result.returncode == 2
    assert one_error_line(result) == "NO_EXPORTER"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in result.stderr


def closed_port() -> int:
    """A port nothing listens on (nor will: no other worker is handed it)."""
    return free_port()


def test_traces_export_reports_a_collector_that_refuses(journal: Recorded) -> None:
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{closed_port()}")

    result = dirk("traces", "export", "--db", journal.path, env=env)

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: EXPORT_FAILED: ")
    assert "exported" not in result.stdout


@pytest.fixture
def silent_collector() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield int(sock.getsockname()[1])


def test_traces_export_gives_up_on_a_collector_that_never_answers(
    journal: Recorded, silent_collector: int
) -> None:
    # The exporter itself would wait ten minutes; the command's own bound must win.
    env = clean_env(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{silent_collector}",
        OTEL_EXPORTER_OTLP_TIMEOUT="600",
    )

    result = dirk("traces", "export", "--db", journal.path, "--timeout", "0.5", env=env)

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: EXPORT_TIMEOUT: ")
    assert result.stdout == ""


def test_help_lists_the_exit_statuses_and_the_codes_dirk_prints() -> None:
    result = dirk("--help")

    assert result.returncode == 0, result.stderr
    statuses = re.findall(r"^  (\d+) +\S", result.stdout.split("exit status:")[1], re.MULTILINE)
    assert sorted(map(int, statuses)) == sorted(ExitCode)
    own = set(re.findall(r"\b[A-Z][A-Z_]+\b", result.stdout.split("dirk's own:")[1]))
    assert own == {str(code) for code in CliError}
