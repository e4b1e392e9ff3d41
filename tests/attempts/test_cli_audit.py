"""``dirk audit``: a tenant's attempts as a table, JSON Lines on stdout, or an export file."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.cli import main
from tests.attempts.journal import Written, write
from tests.attempts.test_attempts import CALLS


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    path = tmp_path_factory.mktemp("audit") / "j.db"
    return anyio.run(write, path, CALLS)


def dirk(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["--no-pager", *args])
    return status, out.getvalue(), err.getvalue()


def expected(written: Written, tenant: str, user: str | None) -> list[tuple[str, ...]]:
    return [e for e in written.expected if e[0] == tenant and (user is None or e[1] == user)]


def keys(document: dict[str, Any]) -> tuple[str, ...]:
    return (document["tenant"], document["user"], document["decision"], document["trace_id"])


@settings(max_examples=30, derandomize=True, deadline=None)
@given(
    tenant=st.sampled_from(["t-a", "t-b", "t-none", ""]),
    user=st.one_of(st.none(), st.sampled_from(["alice", "bob", "carol", "", "nobody"])),
    how=st.sampled_from(["json", "jsonl", "table"]),
)
def test_every_combination_of_flags_shows_exactly_the_tenants_attempts(
    written: Written, tenant: str, user: str | None, how: str
) -> None:
    args = ["audit", "--db", str(written.path), "--tenant", tenant]
    if user is not None:
        args += ["--user", user]
    export = written.path.parent / "export.jsonl"
    if how == "json":
        args.append("--json")
    elif how == "jsonl":
        args += ["--jsonl", str(export)]

    status, out, err = dirk(*args)

    assert status == 0, err
    wanted = expected(written, tenant, user)
    if how == "table":
        assert out.splitlines()[-1].startswith(f"{len(wanted)} attempts in tenant {tenant!r}")
        for _, _, _, trace in wanted:
            assert trace in out
        others = {e[3] for e in written.expected} - {e[3] for e in wanted}
        assert not any(trace in out for trace in others)
        return
    text = export.read_text(encoding="utf-8") if how == "jsonl" else out
    documents = [json.loads(line) for line in text.splitlines()]
    assert [keys(d) for d in documents] == wanted
    assert all(d["tenant"] == tenant for d in documents)
    if how == "jsonl":
        assert out == f"{len(wanted)} attempts written to {export}\n"


def test_a_row_names_its_chain_tier_layer_and_whether_it_was_decided_without_the_journal(
    written: Written,
) -> None:
    status, out, _ = dirk("audit", "--db", str(written.path), "--tenant", "t-a", "--json")

    assert status == 0
    documents = [json.loads(line) for line in out.splitlines()]
    worker = [d for d in documents if d["agent"] == "worker"]
    assert [(d["chain"], d["tier"], d["decision"], d["layer"]) for d in worker] == [
        (["orchestrator", "worker"], "subagent", "deny", "principal"),
        (["orchestrator", "worker"], "subagent", "allow", ""),
    ]
    assert {d["email"] for d in documents} == {"alice@example.com", "carol@example.com"}
    spooled = [d for d in documents if d["without_journal"]]
    assert [(d["decision"], d["reason_code"]) for d in spooled] == [
        ("deny", "GOVERNANCE_UNAVAILABLE")
    ]
    assert all(d["time"].endswith("+00:00") and d["ts_ns"] > 0 for d in documents)


def test_the_table_says_when_a_flow_recorded_no_principal(written: Written) -> None:
    status, out, _ = dirk("audit", "--db", str(written.path), "--tenant", "")

    assert status == 0
    assert out.count("(no principal recorded)") == 2
    assert out.splitlines()[-1] == "2 attempts in tenant ''"


def test_an_export_that_cannot_be_written_is_one_line_and_a_usage_error(
    written: Written, tmp_path: Path
) -> None:
    target = tmp_path / "no-such-dir" / "out.jsonl"

    status, out, err = dirk(
        "audit", "--db", str(written.path), "--tenant", "t-a", "--jsonl", str(target)
    )

    assert status == 2
    assert err.startswith("error: BAD_ARGUMENT: jsonl: cannot write") and err.count("\n") == 1
    assert out == ""


def test_a_missing_journal_and_a_missing_tenant_are_usage_errors(tmp_path: Path) -> None:
    status, _, err = dirk("audit", "--db", str(tmp_path / "none.db"), "--tenant", "t-a")
    assert status == 2 and err.startswith("error: JOURNAL_ERROR:")

    with pytest.raises(SystemExit) as exited:
        dirk("audit", "--db", str(tmp_path / "none.db"))
    assert exited.value.code == 2
