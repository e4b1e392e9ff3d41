"""``dirk operator`` and the keys the operator's commands sign with; what the CLI refuses locally.

The CLI checks a request as the kernel will (kernel.inbox.prepare and the request's own
struct): a value the kernel would refuse is refused here, with its code, before anything
is queued; so is a request the CLI cannot sign with a key the kernel's keyring trusts.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import anyio
import pytest

from kernel.core.keys import load_private_key, public_text
from kernel.inbox.keyring import read_keyring
from kernel.journal.inbox_store import open_inbox
from tests.cli.test_cli import dirk, one_error_line
from tests.core.test_codes import escalated
from tests.support.hostile import deeply_nested_json
from tests.support.operators import Keys


def queued(db: Path) -> int:
    with open_inbox(str(db), readonly=True) as store:
        return len(store.rows(pending=False))


def test_operator_add_list_and_revoke(tmp_path: Path) -> None:
    ring, key = tmp_path / "keyring", tmp_path / "dana.key"
    added = dirk("operator", "add", "dana", "--keyring", ring, "--key-out", key)
    assert added.returncode == 0, added.stderr
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    [dana] = [p for p in read_keyring(ring).values() if p.name == "dana"]
    assert dana.role == "operator" and dana.key == public_text(load_private_key(key))
    assert dana.fingerprint in added.stdout
    door = dirk("operator", "add", "desk", "--role", "door", "--keyring", ring, "--key-out",
                tmp_path / "desk.key")  # fmt: skip
    assert door.returncode == 0 and read_keyring(ring)["desk"].role == "door"
    again = dirk("operator", "add", "dana", "--keyring", ring, "--key-out", tmp_path / "2.key")
    assert (again.returncode, one_error_line(again)) == (1, "BAD_ARGUMENT")
    assert not (tmp_path / "2.key").exists()
    listed = dirk("operator", "list", "--keyring", ring)
    assert "dana  operator" in listed.stdout and "2 keys" in listed.stdout
    revoked = dirk("operator", "revoke", "dana", "--keyring", ring)
    assert revoked.returncode == 0 and "dana" not in read_keyring(ring)
    for bad in ("", "two words", "#x", "a\x1b[2J"):
        refused = dirk("operator", "add", bad, "--keyring", ring, "--key-out", tmp_path / "x.key")
        assert refused.returncode == 2, bad
    nowhere = dirk("operator", "add", "eve", "--key-out", tmp_path / "eve.key",
                   env={k: v for k, v in os.environ.items() if k != "DIRK_KEYRING"})  # fmt: skip
    assert (nowhere.returncode, one_error_line(nowhere)) == (1, "BAD_ARGUMENT")


@pytest.fixture
def flow(tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "j.db"
    return db, anyio.run(escalated, db)


def test_a_decision_is_signed_or_not_queued(flow: tuple[Path, str], operator_keys: Keys) -> None:
    db, dfid = flow
    who = ("--operator", "ana", "--reason", "r", "--db", db)
    env = {k: v for k, v in os.environ.items() if k != "DIRK_KEY"}
    keyless = dirk("decide", dfid, "--reject", *who, env=env)
    assert (keyless.returncode, one_error_line(keyless)) == (2, "SIGNATURE_INVALID")
    # A key of its own, which the kernel's keyring does not hold: refused here.
    stranger = dirk("decide", dfid, "--reject", *who, "--key", operator_keys.keys / "bob.key")
    assert (stranger.returncode, one_error_line(stranger)) == (1, "SIGNATURE_INVALID")
    nobody = dirk("decide", dfid, "--reject", "--operator", "zed", "--reason", "r", "--db", db)
    assert (nobody.returncode, one_error_line(nobody)) == (2, "SIGNATURE_INVALID")
    assert queued(db) == 0
    ok = dirk("decide", dfid, "--reject", *who)
    assert ok.returncode == 0, ok.stderr
    assert queued(db) == 1


@pytest.mark.parametrize(
    ("params", "status"),
    [
        (deeply_nested_json(5000), 2),
        ('{"x": ' + deeply_nested_json(40) + "}", 2),
        ('{"amount_cents": NaN}', 2),
        ('{"amount_cents": 1e999}', 2),
        ('{"amount_cents": Infinity}', 2),
        ('{"amount_cents": 36893488147419103232}', 2),
        ("[1]", 2),
        ('{"note": "\\ud800"}', 2),
    ],
    ids=["5000-deep", "40-deep", "NaN", "1e999", "Infinity", "2**65", "list", "surrogate"],
)
def test_what_the_kernel_would_refuse_is_refused_here_without_a_traceback(
    flow: tuple[Path, str], params: str, status: int
) -> None:
    db, dfid = flow
    done = dirk(
        "decide", dfid, "--modify", params, "--operator", "ana", "--reason", "r", "--db", db
    )
    assert (done.returncode, one_error_line(done)) == (status, "SCHEMA_INVALID")
    assert queued(db) == 0


@pytest.mark.parametrize("wait", ["-1", "nan", "inf", "1e999", "soon"])
def test_a_wait_that_is_no_time_is_refused(flow: tuple[Path, str], wait: str) -> None:
    db, dfid = flow
    who = ("--operator", "ana", "--reason", "r", "--db", db)
    done = dirk("decide", dfid, "--reject", *who, "--wait", wait)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert queued(db) == 0


def test_a_credential_for_an_agent_the_kernel_does_not_know_is_refused_before_a_secret(
    flow: tuple[Path, str],
) -> None:
    db, _ = flow
    who = ("--operator", "ana", "--reason", "new host", "--db", db)
    ghost = dirk("agent", "ghost", "--issue-credential", *who)
    assert (ghost.returncode, one_error_line(ghost)) == (1, "UNKNOWN_AGENT")
    assert ghost.stdout == ""  # no secret made, none shown
    # An agent the kernel allows (recorded when it started) but that never registered: ok.
    allowed = dirk("agent", "other", "--issue-credential", *who)
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout.strip().startswith("dirk_")
    assert queued(db) == 1


def test_the_surrogate_bytes_of_an_argument_are_refused_not_queued(flow: tuple[Path, str]) -> None:
    db, dfid = flow
    env = dict(os.environ)
    for operator in ("ana\udcff", "ana\x1b]0;pwned\x07"):
        done = dirk("decide", dfid, "--reject", "--operator", operator, "--reason", "r",
                    "--db", db, env=env)  # fmt: skip
        assert done.returncode != 0 and "Traceback" not in done.stderr
    assert queued(db) == 0
