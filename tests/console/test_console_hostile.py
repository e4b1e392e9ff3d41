"""Hostile forms against the console, in process and over HTTP to a real ``dirk console``.

A signed-in session may send anything: control characters in any field, and, in a
multipart form whose sender names the charset (``unicode_escape``), any Python
string at all, lone surrogates included. Before the edge checked them, such a
reason became an inbox row that stopped the kernel taking it (and every kernel
after it). What must hold for every form: no 5xx; every refusal shown with a
reason code; a field that breaks the text rule is refused with SCHEMA_INVALID and
queues nothing; no inbox row ever holds a string that is not UTF-8; the console
and the kernel keep running.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.core.reasons import CliError, ReasonCode
from kernel.inbox.requests import decode_row
from kernel.journal.inbox_store import open_inbox
from tests.support.browser import Console, Kernel, console_extra, running_console, running_kernel
from tests.support.hostile import hostile_text, is_utf8

console_extra()

import httpx2  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from kernel.console._app import Settings, create_app  # noqa: E402
from kernel.console._auth import Gate  # noqa: E402
from tests.console.test_console import NOW, _build  # noqa: E402

CODES = {str(c) for c in ReasonCode} | {str(c) for c in CliError}
FREE_TEXT = {"reason", "title", "content", "params"}
SECRETS = {"csrf", "nonce", "secret"}
ANY_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
TEXT_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
FIELDS = {
    "decide": ["decision", "reason", "confirm", "params", "outcome", "external_id"],
    "agent": ["status", "reason"],
    "rule": ["decision", "reason"],
    "change": ["rule", "title", "content", "labels", "reason"],
}
PLAUSIBLE = {
    "decision": ["approve", "reject", "modify", "override", "skip"],
    "status": ["ACTIVE", "SUSPENDED", "PASSIVE"],
    "params": ['{"amount_cents": 5}', '{"a": "\\ud800"}', '{"\\udcff": 1}'],
    "rule": ["access", "r1"],
    "reason": ["checked", "a reason\nover two lines"],
}


def breaks_the_rule(name: str, value: str) -> bool:
    """Whether a field's value breaks the text rule the console checks it by."""
    if not is_utf8(name) or not is_utf8(value):
        return True
    if name in SECRETS:
        return False
    return bool((TEXT_CONTROL if name in FREE_TEXT else ANY_CONTROL).search(value))


def multipart(fields: dict[str, str]) -> tuple[bytes, str]:
    """A multipart body the server decodes with the charset it names: any string arrives."""
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in fields.items():
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="'.encode()
        parts.append(head + _escaped(name) + b'"\r\n\r\n' + _escaped(value) + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}; charset=unicode_escape"


def _escaped(text: str) -> bytes:
    # unicode_escape writes every character, a lone surrogate too, as ASCII it reads back;
    # a quote would end the field's name in its header, so it is escaped as well.
    return text.encode("unicode_escape").replace(b'"', b"\\x22")


def send(client: httpx2.Client, path: str, fields: dict[str, str], as_multipart: bool) -> Any:
    if not as_multipart and all(is_utf8(k) and is_utf8(v) for k, v in fields.items()):
        return client.post(path, data=fields)
    body, content_type = multipart(fields)
    return client.post(path, content=body, headers={"content-type": content_type})


def inbox_count(db: Path) -> int:
    with open_inbox(str(db), readonly=True) as store:
        return len(store.rows(pending=False))


def inbox_strings(db: Path) -> Iterator[str]:
    """Every string in every inbox request, read as a kernel reads them."""
    with open_inbox(str(db), readonly=True) as store:
        rows = store.rows(pending=False)
    for row in rows:
        stack: list[Any] = [msgspec.to_builtins(decode_row(row.body))]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                yield item
            elif isinstance(item, dict):
                stack += [*item.keys(), *item.values()]
            elif isinstance(item, list):
                stack += item


@st.composite
def forms(draw: st.DrawFn) -> tuple[str, str, dict[str, str], bool]:
    """A route kind, its target, its fields (hostile mostly), and whether to send multipart."""
    kind = draw(st.sampled_from(sorted(FIELDS)))
    target = {
        "decide": st.sampled_from(["high", "low", "markup"]),
        "agent": st.sampled_from(["clerk", "scribe", "nobody"]),
        "rule": st.sampled_from(["1", "7"]),
        "change": st.sampled_from(["add", "edit", "retract"]),
    }[kind]
    fields = {}
    for name in FIELDS[kind]:
        if draw(st.booleans()):
            fields[name] = draw(
                st.one_of(hostile_text(max_size=24), st.sampled_from(PLAUSIBLE.get(name, ["x"])))
            )
    if draw(st.integers(0, 9)) == 0:
        fields[draw(hostile_text(min_size=1, max_size=8))] = draw(hostile_text(max_size=8))
    return kind, draw(target), fields, draw(st.booleans())


def path_of(kind: str, target: str, flows: dict[str, str]) -> str:
    return {
        "decide": f"/flows/{flows.get(target, target)}/decide",
        "agent": f"/agents/{target}/status",
        "rule": f"/rules/{target}",
        "change": f"/rules/change/{target}",
    }[kind]


def check(response: Any, fields: dict[str, str], before: int, after: int) -> None:
    """What every answer to a form must be."""
    assert response.status_code < 500, response.text[:500]
    assert response.status_code in (303, 400, 409), response.text[:500]
    if response.status_code in (400, 409):
        found = re.search(r'data-code="([A-Z_]+)"', response.text)
        assert found is not None and found.group(1) in CODES, response.text[:500]
    if any(breaks_the_rule(k, v) for k, v in fields.items()):
        assert response.status_code == 400, (fields, response.status_code)
        assert 'data-code="SCHEMA_INVALID"' in response.text
        assert after == before  # nothing queued
    # A refusal never echoes the text refused (a lone surrogate could not even be sent).
    assert is_utf8(response.text)


# --- in process ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    db = tmp_path_factory.mktemp("console-hostile") / "j.db"
    return db, anyio.run(_build, db)


@pytest.fixture(scope="module")
def app_client(template: tuple[Path, dict[str, str]]) -> Iterator[tuple[TestClient, str]]:
    gate = Gate(None)
    app = create_app(Settings(db=str(template[0])), gate, now_ns=lambda: NOW)
    with TestClient(app, follow_redirects=False) as client:
        client.get("/login")
        nonce = client.cookies["dirk_console_login"]
        signed = client.post("/login", data={"nonce": nonce, "name": "ana", "secret": gate.token})
        assert signed.status_code == 303
        token = next(iter(gate.sessions.values())).csrf
        yield client, token


@settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(form=forms())
def test_any_form_in_process_is_refused_with_a_code_or_queued_as_utf8(
    app_client: tuple[TestClient, str],
    template: tuple[Path, dict[str, str]],
    form: tuple[str, str, dict[str, str], bool],
) -> None:
    client, token = app_client
    db, flows = template
    kind, target, fields, as_multipart = form
    before = inbox_count(db)
    response = send(client, path_of(kind, target, flows), fields | {"csrf": token}, as_multipart)
    check(response, fields, before, inbox_count(db))
    assert all(is_utf8(s) for s in inbox_strings(db))
    assert client.get("/").status_code == 200


@settings(max_examples=60, derandomize=True, deadline=None)
@given(name=hostile_text(max_size=20), secret=hostile_text(max_size=20), as_multipart=st.booleans())
def test_any_sign_in_is_refused_with_a_code_or_signs_in_a_name_without_controls(
    template: tuple[Path, dict[str, str]], name: str, secret: str, as_multipart: bool
) -> None:
    gate = Gate(None)
    app = create_app(Settings(db=str(template[0])), gate, now_ns=lambda: NOW)
    with TestClient(app, follow_redirects=False) as client:
        client.get("/login")
        nonce = client.cookies["dirk_console_login"]
        fields = {"nonce": nonce, "name": name, "secret": gate.token if len(secret) % 2 else secret}
        response = send(client, "/login", fields, as_multipart)
    assert response.status_code in (303, 400, 401), response.text[:300]
    if breaks_the_rule("name", name) or breaks_the_rule("secret", fields["secret"]):
        assert response.status_code == 400 and 'data-code="SCHEMA_INVALID"' in response.text
    for session in gate.sessions.values():
        assert not ANY_CONTROL.search(session.operator) and is_utf8(session.operator)


HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=24)


@settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    header=st.sampled_from(["origin", "referer"]),
    value=st.one_of(
        st.sampled_from(["http://[", "http://[::1", "null", "http://testserver:99999999"]),
        st.tuples(st.sampled_from(["http://", "https://", ""]), HEADER_TEXT).map("".join),
    ),
)
def test_any_origin_header_is_refused_or_checked_never_a_fault(
    app_client: tuple[TestClient, str],
    template: tuple[Path, dict[str, str]],
    header: str,
    value: str,
) -> None:
    client, token = app_client
    db, flows = template
    before = inbox_count(db)
    path = f"/flows/{flows['low']}/decide"
    form = {"csrf": token, "decision": "frobnicate", "reason": "r"}
    response = client.post(path, data=form, headers={header.encode(): value.encode("latin-1")})
    # "http://[" is no URL at all: refused as a foreign origin, never a 500.
    assert response.status_code in (403, 409), (value, response.status_code)
    assert inbox_count(db) == before


# --- over HTTP, against a kernel -------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Kernel, Console, Path]]:
    db = tmp_path_factory.mktemp("console-hostile-http") / "j.db"
    with running_kernel(db) as kernel, running_console(db, "--poll", "0.05") as console:
        yield kernel, console, db
        assert console.proc.poll() is None and kernel.proc.poll() is None


@pytest.fixture(scope="module")
def session(served: tuple[Kernel, Console, Path]) -> Iterator[tuple[httpx2.Client, str]]:
    _, console, _ = served
    token = console.login.split("token=", 1)[1]
    with httpx2.Client(base_url=console.url, follow_redirects=False, timeout=30) as client:
        client.get("/login")
        nonce = client.cookies["dirk_console_login"]
        signed = client.post("/login", data={"nonce": nonce, "name": "mallory", "secret": token})
        assert signed.status_code == 303
        page = client.get("/").text
        yield client, page.split('name="csrf" value="', 1)[1].split('"', 1)[0]


def test_a_lone_surrogate_in_a_reason_is_refused_and_the_kernel_runs_on(
    served: tuple[Kernel, Console, Path], session: tuple[httpx2.Client, str]
) -> None:
    """The attack: a signed-in client names the charset and sends a reason no journal holds."""
    kernel, _, db = served
    client, token = session
    dfid = kernel.open("memo")
    for fields in (
        {"decision": "reject", "reason": "\ud800"},
        {"decision": "reject", "reason": "ok", "\udcff": "x"},
        {"decision": "modify", "reason": "ok", "params": '{"memo": "\\ud800"}'},
        {"decision": "reject", "reason": "\x1b]0;pwned\x07"},
    ):
        before = inbox_count(db)
        response = send(client, f"/flows/{dfid}/decide", fields | {"csrf": token}, True)
        # 400 for a field; 409, on the review page, for the parameters its JSON decodes to.
        assert response.status_code in (400, 409), response.text[:300]
        assert 'data-code="SCHEMA_INVALID"' in response.text
        assert inbox_count(db) == before
    # The kernel still runs: it opens another flow, and applies a proper decision.
    other = kernel.open("memo")
    answer = client.post(
        f"/flows/{dfid}/decide", data={"csrf": token, "decision": "reject", "reason": "no"}
    )
    assert answer.status_code == 303
    assert other != dfid and kernel.proc.poll() is None
    assert all(is_utf8(s) for s in inbox_strings(db))


_LIVE: dict[int, dict[str, str]] = {}


def live_flows(kernel: Kernel) -> dict[str, str]:
    """Flows this kernel opened for the property (escalated at first; decided as it goes)."""
    if kernel.proc.pid not in _LIVE:
        _LIVE[kernel.proc.pid] = {
            name: kernel.open(what)
            for name, what in (("high", "invoice"), ("low", "memo"), ("markup", "markup"))
        }
    return _LIVE[kernel.proc.pid]


@settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(form=forms())
def test_any_form_over_http_is_refused_with_a_code_or_queued_as_utf8(
    served: tuple[Kernel, Console, Path],
    session: tuple[httpx2.Client, str],
    form: tuple[str, str, dict[str, str], bool],
) -> None:
    kernel, console, db = served
    client, token = session
    kind, target, fields, as_multipart = form
    before = inbox_count(db)
    response = send(
        client, path_of(kind, target, live_flows(kernel)), fields | {"csrf": token}, as_multipart
    )
    check(response, fields, before, inbox_count(db))
    assert all(is_utf8(s) for s in inbox_strings(db))
    assert console.proc.poll() is None and kernel.proc.poll() is None
