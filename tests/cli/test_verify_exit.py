"""``dirk verify`` exits as docs/integrity.md says: 1 when the answer is no, 2 when it cannot run.

Before, a key shorter than 16 bytes or a ``--key-file`` that cannot be read exited 1
(read as "the journal failed"), and ``--pack`` without ``--verdicts`` was ignored, so a
run that re-judged nothing looked like one that did (trust-and-edges.md, D10).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kernel.core.reasons import ExitCode
from kernel.journal.head import CHAIN_KEY_ENV
from tests.cli.test_cli import clean_env, dirk, one_error_line
from tests.support import GOLDEN


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    return Path(shutil.copy(GOLDEN / "trading.db", tmp_path / "j.db"))


def test_verify_refuses_a_key_it_cannot_use_with_usage(journal: Path, tmp_path: Path) -> None:
    short = tmp_path / "short.key"
    short.write_text("short\n")
    cases = [
        (["--key-file", str(short)], clean_env()),
        (["--key-file", str(tmp_path / "missing.key")], clean_env()),
        ([], clean_env(**{CHAIN_KEY_ENV: "short"})),
    ]
    for command in ("verify", "anchor"):
        for flags, env in cases:
            result = dirk(command, "--db", journal, *flags, env=env)
            assert result.returncode == ExitCode.USAGE, result
            assert one_error_line(result) == "JOURNAL_KEY"
            assert result.stdout == ""


def test_a_wrong_key_is_a_failed_verification_not_a_usage_error(journal: Path) -> None:
    result = dirk("verify", "--db", journal, env=clean_env(**{CHAIN_KEY_ENV: "k" * 32}))
    assert result.returncode == ExitCode.FAILED
    assert result.stdout.startswith("verify: FAILED")


def test_pack_without_verdicts_is_refused_never_ignored(journal: Path) -> None:
    result = dirk("verify", "--db", journal, "--pack", "policies.trading")
    assert result.returncode == ExitCode.USAGE
    assert one_error_line(result) == "BAD_ARGUMENT"
    both = dirk("verify", "--db", journal, "--verdicts", "--pack", "policies.trading")
    # With --verdicts the packs are used (this golden journal was judged by older ones).
    assert both.returncode != ExitCode.USAGE, both.stderr
    assert "verify: verdicts" in both.stdout
