"""``dirk serve``: a kernel on an existing journal, its console, and the journal's own clock.

The trading example leaves escalations waiting (``--operator none``); ``dirk serve
--example trading`` runs a kernel on that journal with the example's packs and
simulated systems, and its console. An operator signs in with the printed link,
approves, and the kernel applies the decision: the order executes on the served
broker and the flow ends CLOSED, not EXPIRED, although the journal's day is in 2024.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
from hypothesis import HealthCheck, example, given, settings

from kernel.cli import main
from kernel.cli._serve import ContinuedClock
from kernel.core import events as ev
from kernel.core.flow import FlowStatus
from kernel.core.reasons import ExitCode, ReasonCode, StopReason
from kernel.core.text import id_problem
from kernel.journal.opening import open_journal
from tests.support.browser import ROOT, console_extra
from tests.support.hostile import hostile_text, is_utf8
from tests.support.serving import (
    approvable,
    copied,
    env_without_keys,
    folded,
    running_serve,
    trading_journal,
)
from tests.support.sigterm import exits_on_sigterm


@pytest.fixture(scope="module")
def desk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trading example's journal with its escalations left waiting (made once)."""
    console_extra()
    return trading_journal(tmp_path_factory.mktemp("desk"))


@pytest.fixture
def journal(desk: Path, tmp_path: Path) -> Path:
    return copied(desk, tmp_path)


def signed_in(client: httpx2.Client, login: str, name: str) -> str:
    """Sign ``name`` in with the printed link; return the session's CSRF token."""
    token = login.split("token=", 1)[1]
    client.get("/login")
    nonce = client.cookies["dirk_console_login"]
    answer = client.post("/login", data={"nonce": nonce, "name": name, "secret": token})
    assert answer.status_code == 303, answer.text[:300]
    page = client.get("/").text
    return page.split('name="csrf" value="', 1)[1].split('"', 1)[0]


def wait_status(client: httpx2.Client, dfid: str, wanted: str) -> str:
    """Follow the console's change stream until the flow's panel shows ``wanted``."""
    with client.stream("GET", "/events?v=0") as stream:
        for line in stream.iter_lines():
            if not line.startswith("event: changed"):
                continue
            panel = client.get(f"/flows/{dfid}/panel").text
            status = re.search(r'class="st-(\w+)"', panel)
            if status is not None and status.group(1) == wanted:
                return panel
    raise AssertionError("the stream ended first")


def stopped(journal: Path) -> list[ev.KernelStopped]:
    async def read() -> list[ev.KernelStopped]:
        async with open_journal(journal, readonly=True) as opened:
            found = await opened.read(types=["KernelStopped"])
        return [e.payload for e in found if isinstance(e.payload, ev.KernelStopped)]

    return anyio.run(read)


def test_an_approval_in_the_served_console_executes_and_the_flow_closes(journal: Path) -> None:
    before = folded(journal)
    last_ts = max(flow.updated_ts for flow in before.flows.values())
    waiting = sorted(before.waiting)
    assert len(waiting) == 3
    dfid, short = approvable(journal)
    with running_serve(journal, "--example", "trading") as served:
        assert any("3 flows wait for a human" in line for line in served.lines)
        with httpx2.Client(base_url=served.url, follow_redirects=False, timeout=60) as client:
            # The attacker first: no session, no decision, nothing queued.
            refused = client.post(f"/flows/{dfid}/decide", data={"decision": "reject"})
            assert refused.status_code == 401
            csrf = signed_in(client, served.login, "ana")
            queue = client.get("/").text
            # Ages on the journal's clock: minutes of the simulated day, not years.
            escalated = before.approvals[dfid].escalated_ts
            minutes = (last_ts - escalated) // 60_000_000_000
            card = queue.split(f'id="esc-{dfid}"', 1)[1].split("</article>", 1)[0]
            assert f"<dd>{minutes}m</dd>" in card, card
            assert not re.search(r"<dd>\d+d</dd>", queue)
            assert "overdue" not in queue
            decided = client.post(
                f"/flows/{dfid}/decide",
                data={"decision": "approve", "confirm": short, "reason": "sized", "csrf": csrf},
            )
            assert decided.status_code == 303, decided.text[:500]
            panel = wait_status(client, dfid, "CLOSED")
            assert "approve" in panel and "ana" in panel
        assert served.proc.poll() is None
    after = folded(journal)
    assert after.flows[dfid].status is FlowStatus.CLOSED
    # The others still wait: the wall clock's two years did not expire them.
    for other in waiting:
        if other != dfid:
            assert after.flows[other].status is FlowStatus.ESCALATED, other
    # Stopped by SIGTERM: the kernel recorded a clean stop.
    assert stopped(journal)[-1].reason == StopReason.KERNEL_CLOSED
    verified = subprocess.run(
        [sys.executable, "-m", "kernel", "verify", "--db", str(journal)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env_without_keys(),
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_the_decision_is_recorded_as_the_operators_signed_by_the_runs_console(
    journal: Path,
) -> None:
    dfid, short = approvable(journal)
    with running_serve(journal, "--example", "trading") as served:
        with httpx2.Client(base_url=served.url, follow_redirects=False, timeout=60) as client:
            csrf = signed_in(client, served.login, "bo")
            client.post(
                f"/flows/{dfid}/decide",
                data={"decision": "approve", "confirm": short, "reason": "ok", "csrf": csrf},
            )
            wait_status(client, dfid, "CLOSED")

    async def read() -> list[ev.Event]:
        async with open_journal(journal, readonly=True) as opened:
            return await opened.read(dfid=dfid)

    events = anyio.run(read)
    [decided] = [e.payload for e in events if isinstance(e.payload, ev.HumanDecided)]
    assert decided.operator == "bo" and decided.decision == "approve"
    assert any(isinstance(e.payload, ev.ExecutionSucceeded) for e in events)


def test_on_the_wall_clock_the_old_escalations_expire_at_once(journal: Path) -> None:
    """What ``--clock journal`` spares the newcomer: ``--clock wall`` is two years later."""
    dfid, _ = approvable(journal)
    with running_serve(journal, "--example", "trading", "--clock", "wall") as served:
        with httpx2.Client(base_url=served.url, follow_redirects=False, timeout=60) as client:
            signed_in(client, served.login, "ana")
            wait_status(client, dfid, "ABORTED")
    flow = folded(journal).flows[dfid]
    assert flow.status is FlowStatus.ABORTED and flow.reason_code == ReasonCode.EXPIRED


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--pack", "no/such/pack.py"], "BAD_PACK_PATH"),
        (["--files", "x"], "BAD_ARGUMENT"),
        (["--mcp", "nonsense"], "BAD_ARGUMENT"),
        (["--mcp", "0.0.0.0:9"], "BAD_ARGUMENT"),
        (["--mcp-operator", "ana"], "BAD_ARGUMENT"),
        (["--mcp-currency", "EUR"], "BAD_ARGUMENT"),
        *(
            (
                ["--mcp", "127.0.0.1:0", "--mcp-operator", "ana", "--mcp-currency", text],
                "BAD_ARGUMENT",
            )
            # A word, a lone surrogate (an argument byte that is not UTF-8), a terminal escape.
            for text in ("euros", "\udcffUS", "\x1b[2J", "")
        ),
        (["--inbox-poll", "0"], "BAD_ARGUMENT"),
        (["--port", "70000"], "BAD_ARGUMENT"),
        (["--host", "0.0.0.0"], "BAD_ARGUMENT"),
    ],
)
def test_bad_arguments_are_one_line_with_a_code(journal: Path, args: list[str], code: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kernel", "serve", "--db", str(journal), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env_without_keys(),
        timeout=120,
    )
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"error: {code}: "), done.stderr
    assert "Traceback" not in done.stderr
    assert "\x1b" not in done.stderr  # what an argument holds is shown escaped, never raw


def test_an_mcp_port_in_use_is_one_line_and_the_journal_is_left_as_it_was(journal: Path) -> None:
    """Another process holds the --mcp port: refused before the kernel opens, nothing recorded."""
    head = folded(journal).last_seq
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        mcp = ["--mcp", f"127.0.0.1:{port}", "--mcp-operator", "rui"]
        done = subprocess.run(
            [sys.executable, "-m", "kernel", "serve", "--db", str(journal), "--port", "0", *mcp],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=env_without_keys(),
            timeout=120,
        )
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"error: BAD_ARGUMENT: --mcp 127.0.0.1:{port}")
    assert "Traceback" not in done.stderr
    assert folded(journal).last_seq == head


def test_a_missing_journal_is_refused_and_none_is_made(tmp_path: Path) -> None:
    db = tmp_path / "nothing.db"
    done = subprocess.run(
        [sys.executable, "-m", "kernel", "serve", "--db", str(db), "--example", "trading"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env_without_keys(),
        timeout=120,
    )
    assert done.returncode == ExitCode.USAGE
    assert "no such file" in done.stderr and "Traceback" not in done.stderr
    assert not db.exists()


def test_the_continued_clock_starts_at_the_journal_and_keeps_the_machines_pace() -> None:
    ticks = iter([10, 10, 5_000_000_010, 5_000_000_010])
    clock = ContinuedClock(1_709_562_600_000_000_000, monotonic_ns=lambda: next(ticks))
    assert clock.now_ns() == 1_709_562_600_000_000_000
    assert clock.now_ns() == 1_709_562_605_000_000_000
    assert clock.now_ns() == 1_709_562_605_000_000_000  # never backwards, never jumps


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@example(agent_id="-:")
@given(agent_id=hostile_text(min_size=1))
def test_any_agent_id_is_refused_in_one_line_or_taken(
    journal: Path, capsys: pytest.CaptureFixture[str], agent_id: str
) -> None:
    """Whatever --allow holds: refused in one line for what no id may hold, else on to the next.

    (--port 70000 stops the run right after, so nothing is served.)
    """
    # --allow=ID: an id that starts with "-" is still the option's value.
    status = main(["serve", "--db", str(journal), f"--allow={agent_id}", "--port", "70000"])
    err = capsys.readouterr().err
    assert status == ExitCode.USAGE
    lines = err.strip().splitlines()
    assert lines and "Traceback" not in err
    # Not UTF-8 (a lone surrogate): dirk refuses it before any command runs.
    code = "SCHEMA_INVALID" if is_utf8(agent_id) and id_problem(agent_id) else "BAD_ARGUMENT"
    assert lines[-1].startswith(f"error: {code}: "), (agent_id, err)


def test_an_mcp_host_decides_on_the_served_kernel(journal: Path, tmp_path: Path) -> None:
    """``--mcp``: an operator's MCP call on the same kernel approves, and the order executes."""
    pytest.importorskip("mcp", reason="the MCP extra is not installed: pip install -e '.[mcp]'")
    dfid, short = approvable(journal)
    tokens = tmp_path / "tokens"
    tokens.write_text("operator:rui s3cret-operator-token\n")
    tokens.chmod(0o600)
    args = ["--example", "trading", "--mcp", "127.0.0.1:0", "--mcp-token-file", str(tokens)]
    # Taken as dirk mcp --currency takes it (the trading pack's reasons quote money already
    # written out, so its answers read the same; tests/mcp/test_mcp_units.py shows the units).
    args += ["--mcp-currency", "eur"]
    with running_serve(journal, *args) as served:
        assert served.proc.stderr is not None
        line = ""
        while "serving http://" not in line:
            line = served.proc.stderr.readline()
            assert line, "dirk serve ended before its MCP server listened"
        url = line.split()[-1]
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
        call["params"] = {
            "name": "decide",
            "arguments": {
                "dfid": dfid,
                "decision": "approve",
                "reason": "ok",
                "action_hash": short,
            },
        }
        headers = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
        }
        # The attacker first: no token, no decision.
        assert httpx2.post(url, json=call, headers=headers, timeout=60).status_code == 401
        headers["authorization"] = "Bearer s3cret-operator-token"
        answer = httpx2.post(url, json=call, headers=headers, timeout=60)
        assert answer.status_code == 200, answer.text
        with httpx2.Client(base_url=served.url, follow_redirects=False, timeout=60) as client:
            signed_in(client, served.login, "ana")
            wait_status(client, dfid, "CLOSED")
    assert folded(journal).flows[dfid].status is FlowStatus.CLOSED


def test_sigterm_stops_it_while_a_client_holds_its_connection(journal: Path) -> None:
    with running_serve(journal, "--example", "trading") as served:
        code = exits_on_sigterm(served.proc, served.url + "/login")
        assert code is not None, "still running"
    # Stopped as by any SIGTERM: the kernel recorded a clean stop.
    assert stopped(journal)[-1].reason == StopReason.KERNEL_CLOSED
