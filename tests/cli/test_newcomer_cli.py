"""What a newcomer meets first on the command line: keys that set themselves up, usage errors.

``dirk operator add`` makes the folders the README's ``DIRK_KEY=~/.dirk`` and
``DIRK_KEYRING`` name (the key's mode 700) or says why not, leaving nothing half made;
``--role`` takes a quorum's roles; argparse's own refusals are ``error: CODE: what`` lines
with the USAGE status; ``--db`` is optional where ``$DIRK_DB`` stands for it.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.cli._main import main
from kernel.cli._operator import counted
from kernel.cli._serve import _trusted
from kernel.inbox.keyring import keyring_problem, read_keyring
from tests.cli.test_cli import dirk, one_error_line
from tests.support.serving import env_without_keys

ERROR = re.compile(r"^error: [A-Z][A-Z_]+: \S")


def fresh(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A shell with no key, a home of its own, and ``extra`` set."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return env_without_keys({"HOME": str(home), **extra})


def test_a_fresh_dirk_key_folder_is_made_mode_700_and_the_key_goes_in_it(tmp_path: Path) -> None:
    keys = tmp_path / "home" / ".dirk"
    env = fresh(tmp_path, DIRK_KEY=str(keys), DIRK_KEYRING=str(keys / "keyring"))
    added = dirk("operator", "add", "ana", "--role", "risk", "--role", "desk-head", env=env)
    assert added.returncode == 0, added.stderr
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert stat.S_IMODE((keys / "ana.key").stat().st_mode) == 0o600
    ana = read_keyring(keys / "keyring")["ana"]
    assert (ana.role, ana.roles) == ("operator", ("risk", "desk-head"))
    assert "roles risk, desk-head" in added.stdout
    door = dirk("operator", "add", "console", "--role", "door", env=env)
    assert door.returncode == 0 and read_keyring(keys / "keyring")["console"].role == "door"
    listed = dirk("operator", "list", env=env)
    assert "ana  operator  risk,desk-head  " in listed.stdout
    assert "console  door  -  " in listed.stdout and "2 keys in" in listed.stdout
    assert not list(tmp_path.glob("*.key"))  # nothing in the current folder


@pytest.mark.parametrize(
    ("roles", "why"),
    [
        (["door", "risk"], "only an operator holds roles"),
        (["door", "agent"], "a key is one of"),
        (["-risk"], "a role is a letter or digit"),
        (["r" * 65], "a role is a letter or digit"),
    ],
)
def test_roles_a_key_cannot_hold_are_refused_and_nothing_is_made(
    tmp_path: Path, roles: list[str], why: str
) -> None:
    keys = tmp_path / "keys"
    env = fresh(tmp_path, DIRK_KEY=str(keys), DIRK_KEYRING=str(tmp_path / "ring" / "keyring"))
    refused = dirk("operator", "add", "x", *[f"--role={r}" for r in roles], env=env)
    assert (refused.returncode, one_error_line(refused)) == (2, "BAD_ARGUMENT")
    assert why in refused.stderr
    assert not keys.exists() and not (tmp_path / "ring").exists()


def test_a_keyring_where_no_folder_can_be_made_is_one_line_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    keys = tmp_path / "keys"
    env = fresh(tmp_path, DIRK_KEY=str(keys), DIRK_KEYRING=str(blocker / "dirk" / "keyring"))
    refused = dirk("operator", "add", "ana", env=env)
    assert (refused.returncode, one_error_line(refused)) == (2, "BAD_ARGUMENT")
    assert str(blocker) in refused.stderr
    assert not keys.exists()  # the key's folder, made first, is taken back with its key


def test_dirk_key_naming_a_file_says_to_name_the_key_file(tmp_path: Path) -> None:
    taken = tmp_path / "ana.key"
    taken.write_text("someone's key")
    env = fresh(tmp_path, DIRK_KEY=str(taken), DIRK_KEYRING=str(tmp_path / "keyring"))
    refused = dirk("operator", "add", "bo", env=env)
    assert (refused.returncode, one_error_line(refused)) == (2, "BAD_ARGUMENT")
    assert "--key-out" in refused.stderr and not (tmp_path / "keyring").exists()


def test_a_missing_keyring_stops_the_example_before_it_makes_a_file(tmp_path: Path) -> None:
    env = fresh(tmp_path, DIRK_KEYRING=str(tmp_path / "nowhere" / "keyring"))
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    run = subprocess.run(
        [sys.executable, "-m", "examples.trading", "--db", "desk.db"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert ERROR.match(run.stderr.splitlines()[-1]) and "no such file" in run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]  # no desk.broker.db


def test_the_keyring_problem_names_the_command_that_makes_it(tmp_path: Path) -> None:
    problem = keyring_problem(tmp_path / "keyring")
    assert problem is not None and "dirk operator add NAME" in problem
    assert keyring_problem(None) is None or "DIRK_KEYRING" in os.environ


def test_serve_says_whom_it_trusts_and_wants_its_console_door(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ring = tmp_path / "keyring"
    env = fresh(tmp_path, DIRK_KEY=str(tmp_path / "keys"), DIRK_KEYRING=str(ring))
    assert dirk("operator", "add", "ana", "--role", "risk", env=env).returncode == 0
    assert _trusted(str(ring), "console") == 2
    assert "names no door 'console'" in capsys.readouterr().err
    assert _trusted(str(ring), None) is None
    assert "trusting 1 key of " in capsys.readouterr().out
    assert dirk("operator", "add", "console", "--role", "door", env=env).returncode == 0
    assert _trusted(str(ring), "console") is None
    assert "ana (operator: risk), console (door)" in capsys.readouterr().out
    assert _trusted(str(tmp_path / "missing"), None) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert ERROR.match(line) and "no such file" in line


def test_plurals() -> None:
    assert [counted(n, "flow") for n in (0, 1, 2)] == ["0 flows", "1 flow", "2 flows"]
    assert counted(1, "key") == "1 key"


def test_db_is_shown_optional_with_its_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["decide", "--help"])
    usage = capsys.readouterr().out.split("\n\n", 1)[0]
    assert "[--db $DIRK_DB]" in usage


def test_a_command_with_no_journal_says_how_to_name_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DIRK_DB", raising=False)
    assert main(["flows"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == "error: BAD_ARGUMENT: name the journal: --db FILE or URL, or set $DIRK_DB"


WORDS = st.sampled_from(
    ["decide", "flows", "operator", "add", "serve", "--db", "--role", "--wait", "x", "-1",
     "--approve", "--bogus", "nope", "show", "--limit", "0", "traces", "export", "=", ""]
)  # fmt: skip


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(argv=st.lists(WORDS, min_size=1, max_size=5))
def test_every_usage_error_is_one_coded_line_with_the_usage_status(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DIRK_DB", raising=False)
    # Only what argparse refuses, or the journal check after it: nothing runs a command.
    argv = [*argv, "--db", "/nonexistent/j.db"] if "--db" not in argv else argv
    try:
        status = main(argv)
    except SystemExit as stopped:
        status = int(stopped.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if status == 0:
        return
    assert status == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and ERROR.match(errors[0]), err
