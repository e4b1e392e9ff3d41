"""``dirk`` for people: 80-column tables with short ids that every command takes back,
shell completion, a pager on a terminal (never on a pipe), and ``verify --json``.

The journal is the trading example's, run with no operator (``--operator none``), so
flows wait in the queue as a newcomer's do.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import shutil
import sqlite3
import struct
import subprocess
import sys
import termios
from contextlib import closing
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel.cli._read import SHORT_ID, flows_matching, short_ids
from tests.support import ROOT
from tests.support.operators import suite_keys

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def desk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trading journal with escalations waiting for a human (the suite's keys trusted)."""
    db = tmp_path_factory.mktemp("desk") / "desk.db"
    env = os.environ | suite_keys().env()
    command = [sys.executable, "-m", "examples.trading", "--seed", "1", "--db", str(db)]
    command += ["--minutes", "40", "--operator", "none"]
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    return db


def dirk(
    *args: str | Path, env: dict[str, str] | None = None, columns: int | None = 80
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m kernel ARGS`` as a person's shell would, ``COLUMNS`` wide."""
    environ = os.environ | suite_keys().env() | (env or {})
    if columns is not None:
        environ["COLUMNS"] = str(columns)
    return subprocess.run(
        [sys.executable, "-m", "kernel", *map(str, args)],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def waiting(db: Path) -> list[str]:
    out = dirk("escalations", "--db", db, "--json").stdout
    return [json.loads(line)["dfid"] for line in out.splitlines()]


# --- tables at 80 columns, short ids ------------------------------------------------


@pytest.mark.parametrize("command", ["flows", "escalations"])
def test_tables_fit_80_columns_with_short_ids(desk: Path, command: str) -> None:
    shown = dirk(command, "--db", desk)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert len(lines) > 3
    assert max(len(line) for line in lines) <= 80, shown.stdout
    rows = [line for line in lines[2:-1] if line[:1].strip()]
    ids = [row.split()[0] for row in rows]
    assert ids and all(len(i) >= SHORT_ID and "…" not in i for i in ids)
    # Every short id names exactly one flow of the journal: it can be pasted back.
    every = [
        json.loads(line)["dfid"]
        for line in dirk("flows", "--db", desk, "--json").stdout.split("\n")
        if line
    ]
    for short in ids:
        assert len(flows_matching(every, short)) == 1, short


@given(st.lists(st.uuids().map(str), min_size=1, max_size=50, unique=True), st.data())
def test_a_short_id_is_the_shortest_unique_prefix_of_at_least_8(
    dfids: list[str], data: st.DataObject
) -> None:
    # Some ids that share long prefixes, as a journal's may.
    twin = data.draw(st.sampled_from(dfids))
    cut = data.draw(st.integers(min_value=8, max_value=30))
    dfids = [*dfids, twin[:cut] + ("0" if twin[cut] != "0" else "1") + twin[cut + 1 :]]
    dfids = list(dict.fromkeys(dfids))
    short = short_ids(dfids)
    for dfid, prefix in short.items():
        assert dfid.startswith(prefix) and len(prefix) >= SHORT_ID
        assert [d for d in dfids if d.startswith(prefix)] == [dfid]
        if len(prefix) > SHORT_ID:  # one character fewer would be shared
            assert len([d for d in dfids if d.startswith(prefix[:-1])]) > 1


# --- prefixes everywhere ---------------------------------------------------------------


def test_review_and_decide_take_the_prefix_escalations_prints(desk: Path, tmp_path: Path) -> None:
    db = tmp_path / "desk.db"
    with closing(sqlite3.connect(desk)) as src, closing(sqlite3.connect(db)) as dst:
        src.backup(dst)
    dfid = waiting(db)[0]
    short = dirk("escalations", "--db", db).stdout.splitlines()[2].split()[0]
    assert dfid.startswith(short) and len(short) < len(dfid)
    review = dirk("review", short, "--db", db, columns=None)
    assert review.returncode == 0, review.stderr
    assert review.stdout.startswith(f"DecisionFlow {dfid}:")
    decided = dirk(
        "decide", short, "--reject", "--operator", "rui", "--reason", "too big", "--db", db
    )
    assert decided.returncode == 0, decided.stderr
    assert "queued as inbox row" in decided.stdout
    # The request names the whole DFID, and the queue shows it as decided.
    queued = [
        json.loads(line)
        for line in dirk("escalations", "--db", db, "--json").stdout.split("\n")
        if line
    ]
    assert [row["queued"] for row in queued if row["dfid"] == dfid] == [True]


@pytest.mark.parametrize("command", ["review", "decide", "show"])
def test_an_ambiguous_or_unknown_prefix_is_refused_with_its_code(desk: Path, command: str) -> None:
    every = [
        json.loads(line)["dfid"]
        for line in dirk("flows", "--db", desk, "--json").stdout.split("\n")
        if line
    ]
    # The hex digit most DFIDs start with: a prefix that fits several flows.
    first = max("0123456789abcdef", key=lambda c: len(flows_matching(every, c)))
    assert len(flows_matching(every, first)) > 1
    extra = ["--reject", "--operator", "rui", "--reason", "r"] if command == "decide" else []
    for wanted, code in ((first, "AMBIGUOUS_FLOW"), ("ffffffffff", "UNKNOWN_FLOW")):
        refused = dirk(command, wanted, "--db", desk, *extra)
        assert refused.returncode == 1
        assert refused.stderr.startswith(f"error: {code}: "), refused.stderr
        assert "Traceback" not in refused.stderr


# --- verify --json ---------------------------------------------------------------------


def test_verify_json_is_structured(desk: Path, tmp_path: Path) -> None:
    good = json.loads(dirk("verify", "--db", desk, "--json").stdout)
    assert good["ok"] is True and good["events"] > 0 and len(good["head"]) == 64
    assert good["chain"]["ok"] is True and good["chain"]["first_bad_seq"] is None
    assert good["projections"]["ok"] is True and len(good["projections"]["digest"]) == 64
    assert good["anchor"] is None and good["verdicts"] is None and good["failure"] is None
    # A deleted row: the chain says where, the projections were not reached.
    db = tmp_path / "edited.db"
    with closing(sqlite3.connect(desk)) as src, closing(sqlite3.connect(db)) as dst:
        src.backup(dst)
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("DELETE FROM events WHERE seq = 5")
    done = dirk("verify", "--db", db, "--json")
    bad = json.loads(done.stdout)
    assert done.returncode == 1 and bad["ok"] is False
    assert bad["chain"]["ok"] is False and bad["chain"]["first_bad_seq"] is not None
    assert bad["chain"]["problem"]
    # Not a journal at all: a failure with its code.
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database" * 100)
    failed = json.loads(dirk("verify", "--db", junk, "--json").stdout)
    assert failed["ok"] is False and failed["failure"]["problem"]


# --- completion ------------------------------------------------------------------------


def test_bash_completion_loads_and_completes_commands_and_flags(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash on this machine")
    script = dirk("completion", "bash")
    assert script.returncode == 0, script.stderr
    (tmp_path / "dirk.bash").write_text(script.stdout)
    # Bash itself sources it and asks it what `dirk de<TAB>` and `dirk decide --op<TAB>` give.
    probe = f"""
        source {tmp_path / "dirk.bash"}
        complete -p dirk >/dev/null || exit 3
        fn=$(complete -p dirk | sed -E 's/.*-F ([^ ]+).*/\\1/')
        COMP_WORDS=(dirk de); COMP_CWORD=1; COMP_LINE="dirk de"; COMP_POINT=${{#COMP_LINE}}
        $fn dirk de dirk; echo "${{COMPREPLY[@]}}"
        COMP_WORDS=(dirk decide --op); COMP_CWORD=2; COMP_LINE="dirk decide --op"
        COMP_POINT=${{#COMP_LINE}}
        $fn dirk --op decide; echo "${{COMPREPLY[@]}}"
    """
    done = subprocess.run(
        [bash, "--norc", "-c", probe], capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()[:2]
    assert "decide" in first.split()
    assert "--operator" in second.split()
    zsh = dirk("completion", "zsh")
    assert zsh.returncode == 0 and "#compdef dirk" in zsh.stdout
    assert dirk("completion", "fish").returncode == 2


# --- the pager -------------------------------------------------------------------------


def on_a_terminal(
    args: list[str], rows: int, marker: Path, env: dict[str, str] | None = None
) -> str:
    """Run dirk with stdout on a pseudo-terminal ``rows`` high; return what it wrote there.

    The pager is a small program that copies what it is given into ``marker``.
    """
    pager = f"{sys.executable} -c \"import sys; open(sys.argv[1], 'w').write(sys.stdin.read())\""
    environ = os.environ | suite_keys().env() | {"PAGER": f"{pager} {marker}"} | (env or {})
    environ.pop("COLUMNS", None)
    environ.pop("DIRK_PAGER", None)
    main, other = pty.openpty()
    fcntl.ioctl(other, termios.TIOCSWINSZ, struct.pack("HHHH", rows, 80, 0, 0))
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernel", *args],
            cwd=ROOT,
            env=environ,
            stdout=other,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        os.close(other)
        seen = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal closed: the program ended
                break
            if not chunk:
                break
            seen += chunk
        _, err = proc.communicate(timeout=TIMEOUT_S)
        assert proc.returncode == 0, err
    finally:
        os.close(main)
    return seen.decode(errors="replace")


def test_long_output_on_a_terminal_goes_to_the_pager(desk: Path, tmp_path: Path) -> None:
    marker = tmp_path / "paged.txt"
    seen = on_a_terminal(["flows", "--db", str(desk)], rows=10, marker=marker)
    paged = marker.read_text()
    assert "DFID" in paged and "flows" in paged.splitlines()[-1]
    assert "DFID" not in seen  # the terminal got nothing but what the pager showed
    # Each line fits the terminal's 80 columns (colours aside).
    plain = [line for line in paged.splitlines() if "\x1b" not in line]
    assert plain and max(len(line) for line in plain) <= 80


def test_output_that_fits_the_terminal_is_not_paged(desk: Path, tmp_path: Path) -> None:
    marker = tmp_path / "paged.txt"
    seen = on_a_terminal(["escalations", "--db", str(desk)], rows=200, marker=marker)
    assert not marker.exists()
    assert "pending escalations" in seen


def test_no_pager_when_asked_or_when_piped(desk: Path, tmp_path: Path) -> None:
    marker = tmp_path / "paged.txt"
    seen = on_a_terminal(["--no-pager", "flows", "--db", str(desk)], rows=10, marker=marker)
    assert not marker.exists() and "DFID" in seen
    seen = on_a_terminal(["flows", "--db", str(desk)], rows=10, marker=marker, env={"PAGER": ""})
    assert not marker.exists() and "DFID" in seen
    # Piped (stdout a pipe, not a terminal): the whole text, never a pager, however long.
    piped = dirk("flows", "--db", desk, env={"PAGER": f"touch {marker}"}, columns=None)
    assert piped.returncode == 0 and not marker.exists()
    assert piped.stdout.splitlines()[-1].endswith("flows")
