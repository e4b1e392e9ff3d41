"""The operator console in process (Starlette's TestClient): sign-in, CSRF, escaping, decisions.

The browser tests (tests/test_console_browser.py) drive the same pages in
chromium against a separately running kernel; these check what a browser
cannot easily show: every refusal, every header, and properties over any input.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel import AgentStatus, EscalationBudget, EscalationPolicy, open_kernel
from kernel.adapters import ExecutionIntent, Receipt
from kernel.config import KernelConfig, Ports, Supervision
from kernel.core import events as ev
from kernel.core.flow import FlowStatus
from kernel.core.hosts import is_loopback
from kernel.core.reasons import CliError, ExitCode, ReasonCode
from kernel.inbox import DecideRequest
from kernel.inbox.requests import decode_row, encode, normalized
from kernel.journal.inbox_store import open_inbox
from kernel.runtime.messages import Decision
from kernel.state.projections import Projections
from kernel.testing import ManualClock
from tests.support.browser import ROOT, console_extra
from tests.support.console_kernel import shady
from tests.support.helpers import PACK, Bank, ScriptedAgent, transfer
from tests.support.operator_kernel import OPS, memo
from tests.support.operators import Keys, post

console_extra()

from starlette.testclient import TestClient  # noqa: E402

from kernel.cli import main  # noqa: E402
from kernel.console import _command  # noqa: E402
from kernel.console._app import Settings, create_app  # noqa: E402
from kernel.console._auth import (  # noqa: E402
    SESSION_COOKIE,
    Gate,
    OperatorsFileError,
    add_operator,
    check_password,
    hash_password,
    read_operators,
)
from kernel.console._decide import Refused, decision_request  # noqa: E402
from kernel.console._follow import Follower  # noqa: E402
from kernel.console._manage import HISTORY_SHOWN, agents_view, rule_change, rule_row  # noqa: E402
from kernel.journal.opening import open_journal  # noqa: E402
from tests.support.principals import LOCAL  # noqa: E402

NOW = 1_700_000_000_000_000_000 + 90 * 10**9
"""The console's wall clock in these tests: 90 s after the kernel's ManualClock began."""
FAST = {"n": 2**10, "r": 8, "p": 1}
"""A cheap scrypt for tests that hash many passwords (the default costs ~0.5 s)."""


async def _build(db: Path, start_ns: int = 1_700_000_000_000_000_000) -> dict[str, str]:
    async with open_kernel(
        db,
        packs=[PACK, OPS],
        adapters={"bank": Bank()},
        allow=["clerk", "scribe", "mallory"],
        config=KernelConfig(
            principal=LOCAL,
            ports=Ports(clock=ManualClock(start_ns)),
            escalation=EscalationPolicy(budget=EscalationBudget(capacity=50)),
        ),
    ) as kernel:
        await kernel.register(ScriptedAgent("clerk", [transfer(250_000, confidence=0.2)]))
        await kernel.register(
            ScriptedAgent("scribe", [memo], capabilities=["ops.memo"], subscriptions=["ops"])
        )
        await kernel.register(ScriptedAgent("mallory", [shady], subscriptions=["shady"]))
        flows = {}
        for name, topic in (("high", "bank.invoice"), ("low", "ops.memo"), ("markup", "shady.x")):
            (flows[name],) = await kernel.trigger(topic)
            await kernel.wait_flow(flows[name])
        return flows


class BrokenBank(Bank):
    """A bank whose every call fails after it may have taken effect: the outcome is unknown."""

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        raise RuntimeError("connection reset after the request was sent")


async def _build_unknown(db: Path) -> str:
    async with open_kernel(
        db,
        packs=[PACK],
        adapters={"bank": BrokenBank()},
        allow=["clerk"],
        config=KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock())),
    ) as kernel:
        await kernel.register(ScriptedAgent("clerk", [transfer(500, confidence=0.2)]))
        (dfid,) = await kernel.trigger("bank.invoice")
        await kernel.wait_flow(dfid)
        action = kernel.projections.approvals[dfid].action_hash
        await kernel.decide(dfid, "approve", operator="dana", reason="ok", action_hash=action)
        await kernel.wait_quiet()
        return dfid


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    db = tmp_path_factory.mktemp("console-template") / "j.db"
    flows = anyio.run(_build, db)
    return db, flows


@pytest.fixture
def journal(template: tuple[Path, dict[str, str]], tmp_path: Path) -> tuple[Path, dict[str, str]]:
    db = tmp_path / "j.db"
    shutil.copy(template[0], db)
    return db, template[1]


@pytest.fixture
def gate() -> Gate:
    return Gate(None)


@pytest.fixture
def client(journal: tuple[Path, dict[str, str]], gate: Gate) -> Iterator[TestClient]:
    settings = Settings(db=str(journal[0]), trace_url="http://jaeger/trace/{trace_id}")
    app = create_app(settings, gate, now_ns=lambda: NOW)
    with TestClient(app, follow_redirects=False) as c:
        yield c


def sign_in(client: TestClient, name: str, secret: str) -> Any:
    client.get("/login")
    nonce = client.cookies.get("dirk_console_login")
    return client.post("/login", data={"nonce": nonce, "name": name, "secret": secret})


def csrf(client: TestClient, path: str = "/") -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', client.get(path).text)
    assert found is not None
    return found.group(1)


def rows(db: Path) -> list[tuple[str, dict[str, Any]]]:
    """The requests in the inbox, each as (the flow it decides, or "", its fields).

    Every one was signed by the console on behalf of the operator it names.
    """
    with open_inbox(str(db), readonly=True) as store:
        stored = store.rows(pending=False)
    found = []
    for row in stored:
        signed = decode_row(row.body)
        assert signed.signer == "console"
        request = signed.request
        dfid = request.dfid if isinstance(request, DecideRequest) else ""
        found.append((dfid, json.loads(encode(request))))
    return found


# --- signing in ------------------------------------------------------------------------


def test_every_page_and_stream_needs_a_sign_in(client: TestClient) -> None:
    assert client.get("/").status_code == 303
    assert client.get("/").headers["location"] == "/login"
    for path in ("/queue", "/events", "/flows/x/panel", "/agents/live"):
        assert client.get(path).status_code == 401, path
    assert client.post("/flows/x/decide", data={"decision": "reject"}).status_code == 401


def test_the_run_token_signs_in_a_named_operator(client: TestClient, gate: Gate) -> None:
    assert sign_in(client, "ana", "not the token").status_code == 401
    assert sign_in(client, "<ana>", gate.token).status_code == 401  # not a name to record
    response = sign_in(client, "ana", gate.token)
    assert response.status_code == 303
    cookie = response.headers["set-cookie"]
    assert SESSION_COOKIE in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    page = client.get("/")
    assert page.status_code == 200
    assert '<strong id="operator">ana</strong>' in page.text


def test_signing_in_needs_the_nonce_of_the_sign_in_page(client: TestClient, gate: Gate) -> None:
    response = client.post("/login", data={"name": "ana", "secret": gate.token})
    assert response.status_code == 403
    assert SESSION_COOKIE not in client.cookies


def test_signing_out_ends_the_session(client: TestClient, gate: Gate) -> None:
    sign_in(client, "ana", gate.token)
    assert client.post("/logout", data={"csrf": csrf(client)}).status_code == 303
    assert client.get("/queue").status_code == 401
    assert gate.sessions == {}


def test_every_form_needs_its_session_csrf_token_and_this_origin(
    client: TestClient, gate: Gate, journal: tuple[Path, dict[str, str]]
) -> None:
    db, flows = journal
    sign_in(client, "ana", gate.token)
    token = csrf(client)
    form = {"decision": "reject", "reason": "no"}
    path = f"/flows/{flows['high']}/decide"
    assert client.post(path, data=form).status_code == 403
    assert client.post(path, data=form | {"csrf": "x" + token}).status_code == 403
    evil = {"origin": "http://evil.example"}
    assert client.post(path, data=form | {"csrf": token}, headers=evil).status_code == 403
    assert rows(db) == []
    ours = {"origin": "http://testserver"}
    assert client.post(path, data=form | {"csrf": token}, headers=ours).status_code == 303
    assert [dfid for dfid, _ in rows(db)] == [flows["high"]]


def test_every_response_forbids_inline_script_and_framing(client: TestClient) -> None:
    headers = client.get("/login").headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"
    assert headers["x-content-type-options"] == "nosniff"


def test_the_static_files_are_served_from_the_package(client: TestClient) -> None:
    assert "htmx" in client.get("/static/htmx-2.0.11.min.js").text
    assert "0BSD" in client.get("/static/LICENSE-htmx.txt").text or "Zero" in (
        client.get("/static/LICENSE-htmx.txt").text
    )


# --- operators with passwords ------------------------------------------------------------


def test_an_operators_file_holds_scrypt_hashes_never_passwords(tmp_path: Path) -> None:
    path = tmp_path / "ops"
    add_operator(path, "ana", "correct horse")
    add_operator(path, "bo", "battery staple")
    text = path.read_text()
    assert "correct horse" not in text and "battery staple" not in text
    assert path.stat().st_mode & 0o077 == 0
    operators = read_operators(path)
    assert sorted(operators) == ["ana", "bo"]
    assert check_password("correct horse", operators["ana"])
    assert not check_password("correct horse", operators["bo"])
    assert not check_password("x", "scrypt$not$a$hash")
    gate = Gate(operators)
    assert gate.sign_in("ana", "battery staple") is None
    assert gate.sign_in("carol", "correct horse") is None
    sid = gate.sign_in("ana", "correct horse")
    assert sid is not None
    session = gate.session(sid)
    assert session is not None and session.operator == "ana"


def test_a_malformed_operators_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ops"
    path.write_text("ana:plaintext\n")
    with pytest.raises(OperatorsFileError):
        read_operators(path)
    with pytest.raises(OperatorsFileError):
        add_operator(path, "<b>", "pw")


@settings(max_examples=25, derandomize=True, deadline=None)
@given(password=st.text(min_size=1, max_size=40), other=st.text(max_size=40))
def test_a_password_checks_against_its_own_hash_only(password: str, other: str) -> None:
    stored = hash_password(password, **FAST)
    assert check_password(password, stored)
    assert check_password(other, stored) == (other == password)


def test_dirk_console_adds_an_operator_from_stdin(
    journal: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ops = tmp_path / "ops"
    monkeypatch.setattr("sys.stdin", io.StringIO("s3cret pass\n"))
    argv = ["console", "--db", str(journal[0]), "--operators", str(ops), "--add-operator", "ana"]
    assert main(argv) == ExitCode.OK
    assert check_password("s3cret pass", read_operators(ops)["ana"])


def test_a_named_operator_signs_in_with_a_password(
    journal: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    ops = tmp_path / "ops"
    add_operator(ops, "ana", "pw-ana")
    gate = Gate(read_operators(ops))
    with TestClient(create_app(Settings(db=str(journal[0])), gate), follow_redirects=False) as c:
        assert "Password" in c.get("/login").text
        assert sign_in(c, "ana", gate.token).status_code == 401  # no token in this mode
        assert sign_in(c, "ana", "pw-ana").status_code == 303
        assert '<strong id="operator">ana</strong>' in c.get("/").text


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "example.com"])
def test_dirk_console_refuses_another_address_without_operators(
    journal: tuple[Path, dict[str, str]], host: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["console", "--db", str(journal[0]), "--host", host]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"error: {CliError.BAD_ARGUMENT}: refusing to listen on {host}")


def test_loopback_is_only_this_machine() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1")
    assert is_loopback("localhost") and is_loopback("127.8.9.10")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.1")
    # A spelling the check cannot read as loopback counts as any other address (fail closed).
    assert not is_loopback("127.1") and not is_loopback("localhost.")


# --- the queue, the review, decisions ----------------------------------------------------


def test_the_queue_lists_high_impact_first_with_its_numbers(
    client: TestClient, gate: Gate, journal: tuple[Path, dict[str, str]]
) -> None:
    _, flows = journal
    sign_in(client, "ana", gate.token)
    page = client.get("/queue").text
    ids = re.findall(r'id="esc-([^"]+)"', page)
    assert set(ids) == set(flows.values())
    assert ids.index(flows["low"]) == 2  # both HIGH_IMPACT transfers before the memo
    assert f'class="esc HIGH_IMPACT" id="esc-{flows["high"]}"' in page
    assert "confidence 0.2 is below the threshold 0.5 of pack test" in page
    assert "<dt>waiting</dt><dd>90s</dd>" in page
    assert "<dt>expires</dt><dd>in 58m</dd>" in page


def test_an_explanation_is_shown_as_text(
    client: TestClient, gate: Gate, journal: tuple[Path, dict[str, str]]
) -> None:
    _, flows = journal
    sign_in(client, "ana", gate.token)
    page = client.get(f"/flows/{flows['markup']}").text
    assert "<script>document" not in page and "<img src=x" not in page
    assert "&lt;script&gt;document.title=&#34;pwned&#34;&lt;/script&gt;" in page
    assert "<b>bold</b>" not in page


def test_the_review_shows_what_the_agent_saw_and_a_trace_link(
    client: TestClient, gate: Gate, journal: tuple[Path, dict[str, str]]
) -> None:
    _, flows = journal
    sign_in(client, "ana", gate.token)
    page = client.get(f"/flows/{flows['high']}").text
    for part in (
        "Why it escalated",
        "LOW_CONFIDENCE",
        "The proposed action",
        "The working context the agent saw",
        "The limits in force",
        "pack test 1.0.0",
        "Type the action hash",
        "FlowEscalated",
    ):
        assert part in page, part
    assert re.search(r'href="http://jaeger/trace/[0-9a-f]{32}"', page)
    assert client.get("/flows/no-such-flow").status_code == 404


def test_a_high_impact_approval_takes_the_short_hash_typed_back(
    client: TestClient, gate: Gate, journal: tuple[Path, dict[str, str]]
) -> None:
    db, flows = journal
    sign_in(client, "ana", gate.token)
    dfid = flows["high"]
    token = csrf(client, f"/flows/{dfid}")
    path = f"/flows/{dfid}/decide"
    base = {"csrf": token, "decision": "approve", "reason": "checked"}
    refused = client.post(path, data=base)
    assert refused.status_code == 409
    assert 'data-code="CONFIRMATION_REQUIRED"' in refused.text
    refused = client.post(path, data=base | {"confirm": "0123456789"})
    assert 'data-code="ACTION_MISMATCH"' in refused.text
    assert rows(db) == []
    short = re.search(r'class="hash">([0-9a-f]{10})<', client.get(f"/flows/{dfid}").text)
    assert short is not None
    assert client.post(path, data=base | {"confirm": short.group(1)}).status_code == 303
    ((row_dfid, row),) = rows(db)
    assert row_dfid == dfid
    assert row == {
        "type": "decide",
        "dfid": dfid,
        "decision": "approve",
        "operator": "ana",
        "reason": "checked",
        "action_hash": short.group(1),
    }
    again = client.post(path, data=base | {"confirm": short.group(1)})
    assert 'data-code="DECISION_QUEUED"' in again.text
    assert "A decision waits in the inbox" in client.get(f"/flows/{dfid}").text
    assert "decision queued" in client.get("/queue").text


def test_a_low_impact_approval_needs_no_hash_and_every_decision_a_reason(
    client: TestClient, gate: Gate, journal: tuple[Path, dict[str, str]]
) -> None:
    db, flows = journal
    sign_in(client, "ana", gate.token)
    path = f"/flows/{flows['low']}/decide"
    token = csrf(client)
    no_reason = client.post(path, data={"csrf": token, "decision": "approve", "reason": " "})
    assert 'data-code="SCHEMA_INVALID"' in no_reason.text
    assert (
        client.post(path, data={"csrf": token, "decision": "approve", "reason": "ok"}).status_code
        == 303
    )
    assert rows(db)[0][1]["decision"] == "approve"


def test_a_modification_carries_the_whole_new_parameters(
    client: TestClient, gate: Gate, journal: tuple[Path, dict[str, str]]
) -> None:
    db, flows = journal
    sign_in(client, "ana", gate.token)
    path = f"/flows/{flows['high']}/decide"
    base = {"csrf": csrf(client), "decision": "modify", "reason": "smaller"}
    bad = client.post(path, data=base | {"params": "[1, 2]"})
    assert 'data-code="SCHEMA_INVALID"' in bad.text
    assert "[1, 2]" in bad.text  # what the operator typed is kept to correct
    params = {"account": "acc-1", "amount_cents": 900}
    assert client.post(path, data=base | {"params": json.dumps(params)}).status_code == 303
    assert rows(db)[0][1]["params"] == params


# --- properties over any input --------------------------------------------------------------

FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "decision": st.sampled_from(["approve", "reject", "modify", "reconcile", "retry", "x", ""]),
        "reason": st.text(max_size=30),
        "confirm": st.text(alphabet="0123456789abcdef", max_size=12),
        "params": st.one_of(st.text(max_size=30), st.just('{"amount_cents": 5}')),
        "outcome": st.sampled_from(["done", "not_done", "?"]),
        "external_id": st.text(max_size=10),
    },
)


@pytest.fixture(scope="module")
def folded(template: tuple[Path, dict[str, str]]) -> Projections:
    async def fold() -> Projections:
        projections = Projections()
        async with open_journal(template[0], readonly=True) as journal:
            async for batch in journal.scan():
                projections.apply(batch)
        return projections

    return anyio.run(fold)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(form=FIELDS, which=st.sampled_from(["high", "low", "markup", "nope"]))
def test_any_decision_form_is_refused_with_a_code_or_passes_the_kernels_wall(
    folded: Projections, template: tuple[Path, dict[str, str]], form: dict[str, str], which: str
) -> None:
    dfid = template[1].get(which, "nope")
    try:
        request = decision_request(folded, set(), dfid, form, "ana")
    except Refused as refused:
        assert refused.code in set(ReasonCode) | set(CliError)
        return
    # What the console would post is what the kernel's wall lets through, unchanged.
    assert normalized(request) == request
    assert request.operator == "ana" and request.reason.strip()
    if request.decision == "approve" and which != "low":
        assert form.get("confirm")  # HIGH_IMPACT: only with the hash typed back


@settings(
    max_examples=30,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(form=FIELDS, csrf_ok=st.booleans())
def test_no_form_makes_the_console_fail(
    client: TestClient,
    gate: Gate,
    journal: tuple[Path, dict[str, str]],
    form: dict[str, str],
    csrf_ok: bool,
) -> None:
    if not gate.sessions:
        sign_in(client, "ana", gate.token)
    token = next(iter(gate.sessions.values())).csrf if csrf_ok else "nope"
    response = client.post(f"/flows/{journal[1]['high']}/decide", data=form | {"csrf": token})
    # 400: a field holding a control character (kernel.console._fields).
    assert response.status_code in ((303, 400, 409) if csrf_ok else (403,))


@settings(
    max_examples=30,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    query=st.dictionaries(
        st.sampled_from(["status", "agent", "kind", "reason", "since_h"]), st.text(max_size=12)
    )
)
def test_any_flows_filter_renders(client: TestClient, gate: Gate, query: dict[str, str]) -> None:
    if not gate.sessions:
        sign_in(client, "ana", gate.token)
    assert client.get("/flows", params=query).status_code == 200


def test_the_flows_list_filters(
    client: TestClient, gate: Gate, journal: tuple[Path, dict[str, str]]
) -> None:
    _, flows = journal
    sign_in(client, "ana", gate.token)
    page = client.get("/flows", params={"status": "ESCALATED", "agent": "scribe"}).text
    assert flows["low"] in page and flows["high"] not in page
    page = client.get("/flows", params={"kind": "test.transfer"}).text
    assert flows["high"] in page and flows["low"] not in page
    assert flows["low"] not in client.get("/flows", params={"status": "CLOSED"}).text


# --- agents and rules ---------------------------------------------------------------------


def test_an_agent_is_suspended_with_a_reason_through_the_inbox(
    client: TestClient, gate: Gate, journal: tuple[Path, dict[str, str]]
) -> None:
    db, _ = journal
    sign_in(client, "ana", gate.token)
    assert 'id="agent-clerk"' in client.get("/agents").text
    token = csrf(client, "/agents")
    bad = client.post("/agents/clerk/status", data={"csrf": token, "status": "GONE", "reason": "x"})
    assert 'data-code="SCHEMA_INVALID"' in bad.text
    nobody = client.post(
        "/agents/nobody/status", data={"csrf": token, "status": "ACTIVE", "reason": "x"}
    )
    assert 'data-code="UNKNOWN_AGENT"' in nobody.text
    ok = client.post(
        "/agents/clerk/status", data={"csrf": token, "status": "SUSPENDED", "reason": "looping"}
    )
    assert ok.status_code == 303
    assert rows(db) == [
        (
            "",
            {
                "type": "agent_status",
                "agent_id": "clerk",
                "status": "SUSPENDED",
                "operator": "ana",
                "reason": "looping",
            },
        )
    ]


def test_only_a_deferred_rule_proposal_can_be_decided(
    client: TestClient, gate: Gate, folded: Projections
) -> None:
    sign_in(client, "ana", gate.token)
    assert "No proposal waits for an operator." in client.get("/rules").text
    with pytest.raises(Refused) as refused:
        rule_row(folded, "7", {"decision": "override", "reason": "x"}, "ana")
    assert refused.value.code is CliError.RULE_NOT_PENDING
    answer = client.post("/rules/7", data={"csrf": csrf(client), "decision": "skip", "reason": "x"})
    assert 'data-code="RULE_NOT_PENDING"' in answer.text


def test_the_rule_forms_post_the_rows_dirk_rules_posts(
    client: TestClient, gate: Gate, journal: tuple[Path, dict[str, str]]
) -> None:
    db, _ = journal
    sign_in(client, "ana", gate.token)
    token = csrf(client, "/rules")
    assert 'action="/rules/change/add"' in client.get("/rules").text
    new = {"rule": "access", "title": "Access", "content": "ask first", "labels": "a, b,"}
    assert client.post("/rules/change/add", data=new | {"reason": "x"}).status_code == 403
    bad = {"csrf": "x" + token, "reason": "house rule"}
    assert client.post("/rules/change/add", data=new | bad).status_code == 403
    blank = client.post("/rules/change/add", data=new | {"csrf": token, "reason": " "})
    assert blank.status_code == 409 and 'data-code="SCHEMA_INVALID"' in blank.text
    gone = client.post(
        "/rules/change/retract", data={"csrf": token, "rule": "access", "reason": "old"}
    )
    assert 'data-code="UNKNOWN_RULE"' in gone.text
    nothing = client.post("/rules/change/drop", data=new | {"csrf": token, "reason": "x"})
    assert 'data-code="BAD_ARGUMENT"' in nothing.text
    assert rows(db) == []
    ok = client.post("/rules/change/add", data=new | {"csrf": token, "reason": "house rule"})
    assert ok.status_code == 303
    assert rows(db) == [
        (
            "",
            {
                "type": "rule_change",
                "rule": "access",
                "operator": "ana",
                "reason": "house rule",
                "action": "add",
                "title": "Access",
                "content": "ask first",
                "labels": ["a", "b"],
            },
        )
    ]


def _with_rule(db: Path, content: str) -> None:
    async def build() -> None:
        await _build(db)
        async with open_kernel(
            db,
            packs=[PACK, OPS],
            adapters={"bank": Bank()},
            allow=["clerk", "scribe", "mallory"],
            config=KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(NOW))),
        ) as kernel:
            await kernel.propose_rule(
                "access",
                title="<b>Access</b>",
                content=content,
                labels=["x"],
                operator="bo",
                reason="first",
                override=True,
            )

    anyio.run(build)


def test_a_rule_in_force_is_edited_and_retracted_its_markup_shown_as_text(
    tmp_path: Path, gate: Gate
) -> None:
    db = tmp_path / "r.db"
    _with_rule(db, "<script>alert(1)</script>")
    with TestClient(create_app(Settings(db=str(db)), gate), follow_redirects=False) as client:
        sign_in(client, "ana", gate.token)
        page = client.get("/rules").text
        assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page
        assert "<b>Access" not in page and "&lt;b&gt;Access" in page
        token = csrf(client, "/rules")
        again = {"csrf": token, "rule": "access", "title": "T", "content": "c", "reason": "x"}
        assert 'data-code="BAD_ARGUMENT"' in client.post("/rules/change/add", data=again).text
        edit = again | {"content": "v2", "reason": "clearer"}
        assert client.post("/rules/change/edit", data=edit).status_code == 303
        retract = {"csrf": token, "rule": "access", "reason": "obsolete"}
        assert client.post("/rules/change/retract", data=retract).status_code == 303
    (_, edited), (_, retracted) = rows(db)
    assert edited["action"] == "edit" and edited["content"] == "v2"
    assert edited["base_version"] == 1 and edited["operator"] == "ana"
    assert retracted == {
        "type": "rule_change",
        "rule": "access",
        "operator": "ana",
        "reason": "obsolete",
        "action": "retract",
    }


@settings(max_examples=40, derandomize=True, deadline=None)
@given(
    action=st.sampled_from(["add", "edit", "retract", "", "x"]),
    form=st.dictionaries(
        st.sampled_from(["rule", "title", "content", "labels", "reason"]), st.text(max_size=40)
    ),
)
def test_any_rule_form_is_refused_with_a_code_or_is_a_row(
    folded: Projections, action: str, form: dict[str, str]
) -> None:
    try:
        request = rule_change(folded, action, form, "ana")
    except Refused as refused:
        assert refused.code in set(ReasonCode) | set(CliError)
    else:
        assert request.action == action and request.reason.strip()


def test_a_rule_created_in_the_console_is_in_force_once_the_kernel_runs(
    tmp_path: Path, gate: Gate
) -> None:
    db = tmp_path / "new.db"
    anyio.run(_build, db, time.time_ns())
    with TestClient(create_app(Settings(db=str(db)), gate), follow_redirects=False) as client:
        sign_in(client, "ana", gate.token)
        form = {
            "csrf": csrf(client, "/rules"),
            "rule": "access",
            "title": "Access",
            "content": "ask the owner first",
            "reason": "house rule",
        }
        assert client.post("/rules/change/add", data=form).status_code == 303
        done = subprocess.run(
            [sys.executable, "-m", "tests.support.operator_kernel", str(db), "--drain"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
    # A console opened afterwards reads the rulebook the kernel wrote.
    with TestClient(create_app(Settings(db=str(db)), gate), follow_redirects=False) as client:
        sign_in(client, "ana", gate.token)
        page = client.get("/rules").text
    assert "v1 “Access”" in page and "ask the owner first" in page
    assert "<td>ana</td><td>house rule</td>" in page


# --- following the journal ------------------------------------------------------------------


async def test_the_follower_sees_a_queued_decision_and_wakes_its_waiters(
    journal: tuple[Path, dict[str, str]], operator_keys: Keys
) -> None:
    db, flows = journal
    follower = Follower(str(db), poll_s=0.01)
    async with open_journal(db, readonly=True) as opened:
        assert await follower.catch_up(opened)
        seen = follower.version
        assert not await follower.catch_up(opened)
        assert follower.version == seen
        reject = DecideRequest(
            dfid=flows["high"], decision=Decision.REJECT, operator="a", reason="b"
        )
        post(operator_keys, db, reject, "a", 1)
        async with anyio.create_task_group() as tg:
            tg.start_soon(follower.run, opened)
            with anyio.fail_after(10):
                assert await follower.wait_changed(seen) > seen
            tg.cancel_scope.cancel()
    assert follower.queued == {flows["high"]}


# --- the extra ------------------------------------------------------------------------------


def test_neither_kernel_nor_dirk_imports_the_web_libraries() -> None:
    code = (
        "import sys, kernel, kernel.cli, kernel.console; "
        "loaded = {'starlette', 'uvicorn', 'jinja2', 'sse_starlette'} & set(sys.modules); "
        "print(sorted(loaded)); sys.exit(1 if loaded else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_without_the_extra_dirk_console_says_what_to_install(
    journal: tuple[Path, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # what an absent package looks like
    assert main(["console", "--db", str(journal[0])]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"error: {CliError.EXTRA_MISSING}: ")
    assert "dir-kernel[console]" in err


def test_a_file_that_is_no_journal_is_one_line_with_its_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database\n" * 100)
    assert main(["console", "--db", str(path)]) == ExitCode.USAGE
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {CliError.JOURNAL_CORRUPT}: ") or line.startswith(
        f"error: {CliError.JOURNAL_FOREIGN}: "
    )


def test_a_decision_made_while_the_kernel_is_down_is_applied_when_it_runs(
    tmp_path: Path, gate: Gate
) -> None:
    # Escalated just now, so the kernel's approval TTL (an hour, on its real clock) holds.
    db = tmp_path / "now.db"
    flows = anyio.run(_build, db, time.time_ns())
    with TestClient(create_app(Settings(db=str(db)), gate), follow_redirects=False) as client:
        decide_then_run_the_kernel(client, gate, db, flows)


def decide_then_run_the_kernel(
    client: TestClient, gate: Gate, db: Path, flows: dict[str, str]
) -> None:
    sign_in(client, "ana", gate.token)
    form = {"csrf": csrf(client), "decision": "reject", "reason": "not this week"}
    assert client.post(f"/flows/{flows['low']}/decide", data=form).status_code == 303
    # The kernel starts later, in its own process, drains the inbox and stops.
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.operator_kernel", str(db), "--drain"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    page = client.get(f"/flows/{flows['low']}")
    assert "reject by ana" in page.text or "data-decision=Decision.REJECT" in page.text
    assert "HUMAN_REJECTED" in page.text


def test_an_unknown_outcome_is_reconciled_or_retried_never_approved(
    tmp_path: Path, gate: Gate
) -> None:
    db = tmp_path / "unknown.db"
    dfid = anyio.run(_build_unknown, db)
    app = create_app(Settings(db=str(db)), gate, now_ns=lambda: NOW)
    with TestClient(app, follow_redirects=False) as client:
        sign_in(client, "ana", gate.token)
        assert "outcome unknown" in client.get("/queue").text
        page = client.get(f"/flows/{dfid}").text
        assert "The effect may have happened" in page and 'value="reconcile"' in page
        assert 'id="approve"' not in page
        path, token = f"/flows/{dfid}/decide", csrf(client)
        approve = client.post(path, data={"csrf": token, "decision": "approve", "reason": "x"})
        assert 'data-code="OUTCOME_UNKNOWN"' in approve.text
        vague = {"csrf": token, "decision": "reconcile", "outcome": "done", "reason": "x"}
        assert 'data-code="SCHEMA_INVALID"' in client.post(path, data=vague).text
        done = vague | {"external_id": "tx-77"}
        assert client.post(path, data=done).status_code == 303
    ((_, row),) = rows(db)
    assert row["decision"] == "reconcile"
    assert row["params"] == {"outcome": "done", "external_id": "tx-77"}


def test_a_session_unused_for_its_idle_time_ends() -> None:
    now = [0.0]
    gate = Gate(None, idle_s=60, clock=lambda: now[0])
    sid = gate.sign_in("ana", gate.token)
    now[0] = 59
    assert gate.session(sid) is not None  # used: its idle time starts again
    now[0] = 118
    assert gate.session(sid) is not None
    now[0] = 179
    assert gate.session(sid) is None
    assert gate.sessions == {}


def test_the_agents_page_shows_who_changed_a_status_and_why(tmp_path: Path, gate: Gate) -> None:
    async def build() -> None:
        await _build(tmp_path / "a.db")
        async with open_kernel(
            tmp_path / "a.db",
            packs=[PACK, OPS],
            adapters={"bank": Bank()},
            allow=["clerk", "scribe", "mallory"],
            config=KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(NOW))),
        ) as kernel:
            await kernel.set_agent_status("clerk", "SUSPENDED", operator="bo", reason="<loops>")

    anyio.run(build)
    app = create_app(Settings(db=str(tmp_path / "a.db")), gate)
    with TestClient(app, follow_redirects=False) as client:
        sign_in(client, "ana", gate.token)
        page = client.get("/agents").text
        live = client.get("/agents/live")
    assert "SUSPENDED by bo: &lt;loops&gt;" in page
    # What the page swaps in when the journal moves: the figures and the history, not the forms.
    assert live.status_code == 200 and "<form" not in live.text
    assert re.search(r'id="status-clerk"[^>]*hx-swap-oob="true">SUSPENDED<', live.text)
    assert re.search(
        r'id="change-clerk" hx-swap-oob="true">SUSPENDED by bo: &lt;loops&gt;', live.text
    )
    assert '<section id="histories" hx-swap-oob="true">' in live.text
    assert "<loops>" not in live.text


def test_a_budget_demotion_by_the_kernel_is_in_the_agents_history(folded: Projections) -> None:
    def change(seq: int, agent: str) -> ev.Event:
        return ev.Event(
            seq=seq,
            ts=NOW,
            agent_id=agent,
            payload=ev.AgentStatusChanged(
                status="PASSIVE", reason="ESCALATION_BUDGET_EXHAUSTED: 2 > 1", operator="kernel"
            ),
        )

    changes = [change(seq, "clerk") for seq in range(1, HISTORY_SHOWN + 3)]
    lines = {line.view.manifest.agent_id: line for line in agents_view(folded, changes)}
    clerk = lines["clerk"].history
    assert len(clerk) == HISTORY_SHOWN and clerk[0].seq == HISTORY_SHOWN + 2
    assert lines["clerk"].last_change == changes[-1].payload
    assert lines["scribe"].history == () and lines["scribe"].last_change is None
    # PASSIVE by the kernel's budget is shown as a demotion; by an operator it is not.
    passive = msgspec.structs.replace(lines["clerk"].view, status=AgentStatus.PASSIVE)
    assert dataclasses.replace(lines["clerk"], view=passive).demoted
    by_hand = msgspec.structs.replace(changes[-1].payload, operator="bo")
    assert not dataclasses.replace(lines["clerk"], view=passive, last_change=by_hand).demoted
    assert not lines["scribe"].demoted


def test_the_agents_page_lists_each_status_change_newest_first(tmp_path: Path, gate: Gate) -> None:
    db = tmp_path / "b.db"

    async def build() -> None:
        await _build(db)
        async with open_kernel(
            db,
            packs=[PACK, OPS],
            adapters={"bank": Bank()},
            allow=["clerk", "scribe", "mallory"],
            config=KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(NOW))),
        ) as kernel:
            await kernel.set_agent_status("clerk", "PASSIVE", operator="bo", reason="<noisy>")
            await kernel.set_agent_status("clerk", "ACTIVE", operator="cy", reason="refilled")

    anyio.run(build)
    with TestClient(create_app(Settings(db=str(db)), gate), follow_redirects=False) as client:
        sign_in(client, "ana", gate.token)
        page = client.get("/agents").text
    assert 'id="history-scribe"' not in page
    history = page[page.index('id="history-clerk"') :]
    restored = history.index("<td>ACTIVE</td><td>cy</td><td>refilled</td>")
    demoted = history.index("<td>PASSIVE</td><td>bo</td><td>&lt;noisy&gt;</td>")
    assert restored < demoted  # newest first
    assert "<td>2023-11-14 22:1" in history  # when, in UTC, from the kernel's clock


def test_a_console_on_loopback_answers_only_to_loopback_names(
    journal: tuple[Path, dict[str, str]], gate: Gate
) -> None:
    settings = Settings(db=str(journal[0]), allowed_hosts=_command.LOOPBACK_NAMES)
    with TestClient(create_app(settings, gate), base_url="http://127.0.0.1:8765") as client:
        assert client.get("/login").status_code == 200
    with TestClient(create_app(settings, gate), base_url="http://evil.example:8765") as client:
        assert client.get("/login").status_code == 400


# --- what the kernel answers ----------------------------------------------------------------


async def test_a_decision_the_kernel_refuses_at_once_is_shown_refused(
    tmp_path: Path, gate: Gate
) -> None:
    """The console signs as itself for the operator and waits for the kernel's answer."""
    from kernel import SystemClock

    db = tmp_path / "j.db"
    async with open_kernel(
        db,
        packs=[PACK, OPS],
        adapters={"bank": Bank()},
        allow=["clerk"],
        config=KernelConfig(principal=LOCAL, supervision=Supervision(inbox_poll_s=0.05)),
    ) as kernel:
        assert isinstance(kernel.clock, SystemClock)
        await kernel.register(ScriptedAgent("clerk", [transfer(250_000, confidence=0.2)]))
        (dfid,) = await kernel.trigger("bank.invoice")
        await kernel.wait_flow(dfid)
        approval = kernel.projections.approvals[dfid]
        settings = Settings(db=str(db), answer_s=30)
        with TestClient(create_app(settings, gate), follow_redirects=False) as client:

            def decide(operator: str) -> Any:
                client.cookies.clear()
                sign_in(client, operator, gate.token)
                form = {"decision": "approve", "reason": "ok", "confirm": approval.short_hash}
                form["csrf"] = csrf(client, f"/flows/{dfid}")
                return client.post(f"/flows/{dfid}/decide", data=form)

            # The console cannot know who proposed under which name; the kernel refuses.
            own = await anyio.to_thread.run_sync(decide, "clerk")
            assert own.status_code == 409
            assert 'data-code="SELF_APPROVAL_FORBIDDEN"' in own.text
            done = await anyio.to_thread.run_sync(decide, "ana")
            assert done.status_code == 303
        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
        [decided] = await kernel.journal.read(types=["HumanDecided"])
    assert isinstance(decided.payload, ev.HumanDecided)
    assert (decided.payload.operator, decided.payload.via, decided.payload.signer) == (
        "ana",
        "inbox",
        "console",
    )


def test_the_rules_page_shows_one_tenants_namespace_at_a_time(tmp_path: Path, gate: Gate) -> None:
    db = tmp_path / "ns.db"

    async def build() -> None:
        await _build(db)
        async with open_kernel(
            db,
            packs=[PACK, OPS],
            adapters={"bank": Bank()},
            allow=["clerk", "scribe", "mallory"],
            config=KernelConfig(principal=LOCAL, ports=Ports(clock=ManualClock(NOW))),
        ) as kernel:
            for ns, content in (("acme", "acme-only text"), ("globex", "globex-only text")):
                await kernel.propose_rule(
                    "refunds",
                    title="Refunds",
                    content=content,
                    operator="bo",
                    reason="tenant",
                    override=True,
                    ns=ns,
                )

    anyio.run(build)
    with TestClient(create_app(Settings(db=str(db)), gate), follow_redirects=False) as client:
        sign_in(client, "ana", gate.token)
        acme = client.get("/rules", params={"ns": "acme"}).text
        globex = client.get("/rules", params={"ns": "globex"}).text
        default = client.get("/rules").text
        token = csrf(client, "/rules?ns=acme")
        edit = {"csrf": token, "rule": "refunds", "title": "R", "content": "v2", "reason": "x"}
        assert client.post("/rules/change/edit", data=edit | {"ns": "acme"}).status_code == 303
    assert "acme-only text" in acme and "globex-only text" not in acme
    assert "globex-only text" in globex and "acme-only text" not in globex
    assert "acme-only text" not in default and "globex-only text" not in default
    assert '<option value="globex"' in default
    [(_, edited)] = rows(db)
    assert edited["ns"] == "acme" and edited["content"] == "v2"
