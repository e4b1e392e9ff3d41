"""One word per idea: every code the kernel records or ``dirk`` prints comes from a closed enum."""

from __future__ import annotations

import ast
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import kernel
from kernel import KernelShutdown, StopReason
from kernel.audit import open_journal
from kernel.audit.reverify import PackPathError
from kernel.cli import EPILOG, main
from kernel.core.events import KernelStopped
from kernel.core.reasons import RESERVED_REASONS, CliError, ExitCode, ReasonCode
from kernel.journal.store import JournalError
from tests.cli.test_cli import ERROR_LINE, Recorded, record
from tests.support import GOLDEN, ROOT
from tests.support.helpers import ScriptedAgent, kernel_for, transfer
from tests.support.operators import Keys

CLI_MODULES = tuple(sorted(p.name for p in (ROOT / "kernel" / "cli").glob("_*.py")))
# Words of ``dirk show``'s narrative that read like codes: "approval EXPIRED" says what happened.
NARRATIVE = {"EXPIRED"}
CODE_WORD = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b|\b[A-Z]{4,}\b")


def sources(*trees: str) -> Iterator[Path]:
    for tree in trees:
        yield from sorted((ROOT / tree).rglob("*.py"))


# --- the enums themselves -----------------------------------------------------------


def test_each_code_is_spelled_as_its_name_and_no_two_sets_share_a_spelling() -> None:
    sets: list[list[str]] = [
        [str(m) for m in ReasonCode],
        [str(m) for m in StopReason],
        [str(m) for m in CliError],
    ]
    for enum in (ReasonCode, StopReason, CliError):
        assert all(member.value == member.name for member in enum)
    every = [code for codes in sets for code in codes]
    assert len(every) == len(set(every))
    assert sorted(int(code) for code in ExitCode) == [0, 1, 2, 130, 141]


def test_every_reason_code_is_used_by_the_kernel_or_documented_as_reserved() -> None:
    text = "\n".join(
        path.read_text(encoding="utf-8")
        for path in sources("kernel", "policies", "agents_sdk")
        if path.name != "reasons.py"
    )
    used = {m for m in ReasonCode if re.search(rf"\bReasonCode\.{m.name}\b", text)}
    assert set(ReasonCode) - used == RESERVED_REASONS
    # Each says where it declared whom it is for (a pack) or that it is reserved.
    declared = (ROOT / "kernel" / "core" / "reasons.py").read_text(encoding="utf-8")
    for member in RESERVED_REASONS:
        pattern = rf'{member.name} = "{member.value}"\n    """(Reserved|For packs)'
        assert re.search(pattern, declared), member


def test_every_error_that_carries_its_code_to_the_cli_names_a_cli_error() -> None:
    def family(cls: type[JournalError]) -> Iterator[type[JournalError]]:
        yield cls
        for sub in cls.__subclasses__():
            yield from family(sub)

    carried = {cls.code for cls in family(JournalError)} | {PackPathError.code}
    assert carried <= set(CliError)


def test_every_cli_error_is_used_by_dirk() -> None:
    text = "\n".join(
        path.read_text(encoding="utf-8") for path in sources("kernel") if path.name != "reasons.py"
    )
    carried = {m for m in CliError if f'code = "{m.value}"' in text}
    used = {m for m in CliError if re.search(rf"\bCliError\.{m.name}\b", text)}
    assert used | carried == set(CliError)


def test_the_help_documents_every_exit_status_and_every_cli_error() -> None:
    for code in ExitCode:
        assert re.search(rf"^  {int(code)} +\S", EPILOG, re.MULTILINE), code
    listed = set(re.findall(r"[A-Z_]{3,}", EPILOG.split("dirk's own:")[1]))
    assert listed == set(CliError)


# --- stop reasons ---------------------------------------------------------------------


async def test_a_closed_kernel_records_and_raises_a_stop_reason(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with kernel_for(db) as k:
        await k.register(ScriptedAgent(steps=[transfer(100)]))
    assert k.stopped is not None and k.stopped.reason is StopReason.KERNEL_CLOSED
    with pytest.raises(KernelShutdown) as stopped:
        await k.trigger("bank.invoice")
    assert stopped.value.reason is StopReason.KERNEL_CLOSED
    async with open_journal(db, readonly=True) as journal:
        [event] = await journal.read(types=["KernelStopped"])
    assert isinstance(event.payload, KernelStopped)
    # Recorded with the spelling every earlier kernel used.
    assert event.payload.reason == "KERNEL_CLOSED" == StopReason.KERNEL_CLOSED


@pytest.mark.parametrize("name", ["booking.db", "trading.db"])
async def test_journals_of_the_previous_kernel_hold_only_stop_reasons(
    name: str, tmp_path: Path
) -> None:
    db = shutil.copy(GOLDEN / name, tmp_path / name)
    async with open_journal(db, readonly=True) as journal:
        stops = await journal.read(types=["KernelStopped"])
    assert stops
    for event in stops:
        assert isinstance(event.payload, KernelStopped)
        assert event.payload.reason in set(StopReason)


def test_stop_reason_is_public() -> None:
    assert kernel.StopReason is StopReason


# --- what dirk prints -----------------------------------------------------------------


def literals(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Yield the string constants of ``tree`` that are not docstrings."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                yield node.lineno, node.value


@pytest.mark.parametrize("module", CLI_MODULES)
def test_the_cli_spells_out_no_code(module: str) -> None:
    codes = {str(m) for enum in (ReasonCode, StopReason, CliError) for m in enum}
    path = ROOT / "kernel" / "cli" / module
    spelled = [
        (line, word)
        for line, text in literals(ast.parse(path.read_text(encoding="utf-8")))
        for word in CODE_WORD.findall(text)
        if (word in codes and word not in NARRATIVE) or text.startswith("error: ")
    ]
    assert spelled == []


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return anyio.run(record, tmp_path_factory.mktemp("journal") / "j.db")


async def escalated(db: Path) -> str:
    async with kernel_for(db) as k:
        await k.register(ScriptedAgent("auditor", [transfer(9_000, confidence=0.2)]))
        [dfid] = await k.trigger("bank.invoice")
        await k.wait_quiet()
    return str(dfid)


WHO = ("--operator", "ana", "--reason", "checked")
# (arguments, the code, the exit status); {db}, {closed}, {aborted} filled in from the journal.
ERRORS: list[tuple[tuple[str, ...], str, int]] = [
    (("show", "nope", "--db", "{db}"), "UNKNOWN_FLOW", ExitCode.FAILED),
    (("review", "nope", "--db", "{db}"), "UNKNOWN_FLOW", ExitCode.FAILED),
    (("decide", "nope", "--reject", *WHO, "--db", "{db}"), "UNKNOWN_FLOW", ExitCode.FAILED),
    (("decide", "{aborted}", "--reject", *WHO, "--db", "{db}"), "FLOW_NOT_ACTIVE", 1),
    (
        ("decide", "{aborted}", "--reject", "--operator", " ", "--reason", "r", "--db", "{db}"),
        "SCHEMA_INVALID",
        ExitCode.USAGE,
    ),
    (("traces", "export", "--dfid", "nope", "--db", "{db}"), "UNKNOWN_FLOW", ExitCode.FAILED),
    (("traces", "export", "--db", "{db}"), "NO_EXPORTER", ExitCode.USAGE),
    (("state", "--at", "999999", "--db", "{db}"), "UNKNOWN_SEQ", ExitCode.FAILED),
    (("why", "nothing", "--db", "{db}"), "UNKNOWN_RULE", ExitCode.FAILED),
    (("whatif", "--db", "{db}"), "BAD_ARGUMENT", ExitCode.USAGE),
    (("whatif", "--exclude", "x", "--db", "{db}"), "BAD_ARGUMENT", ExitCode.USAGE),
    (("whatif", "--pack", "p.py", "--inject-constraint", "x", "--db", "{db}"), "BAD_ARGUMENT", 2),
    (("whatif", "--pack", "no/such.py", "--db", "{db}"), "BAD_PACK_PATH", ExitCode.USAGE),
    (("verify", "--verdicts", "--db", "{db}"), "BAD_ARGUMENT", ExitCode.USAGE),
    (("verify", "--anchor", "dirk-anchor x", "--db", "{db}"), "BAD_ARGUMENT", ExitCode.USAGE),
    (("verify", "--verdicts", "--pack", "no/such.py", "--db", "{db}"), "BAD_PACK_PATH", 2),
    (("flows", "--db", "{db}.missing"), "JOURNAL_ERROR", ExitCode.USAGE),
    (("agent", "nobody", "--db", "{db}"), "UNKNOWN_AGENT", ExitCode.FAILED),
    (("agent", "clerk", "--set", "PASSIVE", "--db", "{db}"), "SCHEMA_INVALID", ExitCode.USAGE),
    (("rules", "--skip", "1", "--db", "{db}"), "SCHEMA_INVALID", ExitCode.USAGE),
    (("rules", "--skip", "999999", *WHO, "--db", "{db}"), "RULE_NOT_PENDING", ExitCode.FAILED),
    (
        ("amend", "--agent", "nobody", "--limit", "l", "--value", "1", "--ttl", "1", *WHO),
        "UNKNOWN_AGENT",
        ExitCode.FAILED,
    ),
    (
        ("amend", "--agent", "clerk", "--limit", "l", "--value", "x", "--ttl", "1", *WHO),
        "SCHEMA_INVALID",
        ExitCode.USAGE,
    ),
    (
        ("amend", "--agent", "clerk", "--limit", "l", "--value", "1", "--ttl", "0", *WHO),
        "SCHEMA_INVALID",
        ExitCode.USAGE,
    ),
]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run ``dirk`` in this process; return its exit status and the code it printed."""
    status = main(argv)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    match = ERROR_LINE.match(lines[0])
    assert match, lines[0]
    return status, match.group(1)


@pytest.mark.parametrize(("argv", "code", "status"), ERRORS, ids=lambda x: str(x)[:48])
def test_each_error_path_prints_one_enum_code_and_its_exit_status(
    argv: tuple[str, ...],
    code: str,
    status: int,
    journal: Recorded,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    names = {"db": str(journal.path), "closed": journal.closed, "aborted": journal.aborted}
    args = [arg.format(**names) for arg in argv]
    if args[0] == "amend":
        args += ["--db", str(journal.path)]
    printed, shown = run(args, capsys)
    assert (printed, shown) == (status, code)
    assert shown in set(ReasonCode) | set(CliError)
    assert printed in set(ExitCode)


def test_decisions_the_cli_refuses_print_enum_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], operator_keys: Keys
) -> None:
    db = tmp_path / "j.db"
    dfid = anyio.run(escalated, db)
    base = ["decide", dfid, *WHO, "--db", str(db)]
    assert run([*base, "--approve", "--confirm", "0000000000"], capsys) in {
        (ExitCode.FAILED, "ACTION_MISMATCH"),
        (ExitCode.FAILED, "CONFIRMATION_REQUIRED"),
    }
    assert run([*base, "--retry"], capsys) == (ExitCode.FAILED, "SCHEMA_INVALID")
    assert run([*base, "--modify", "[1]"], capsys) == (ExitCode.USAGE, "SCHEMA_INVALID")
    # No kernel runs: the decision is queued and not taken.
    assert run([*base, "--reject", "--wait", "0.01"], capsys) == (ExitCode.FAILED, "NOT_TAKEN")
    assert run([*base, "--reject"], capsys) == (ExitCode.FAILED, "DECISION_QUEUED")
