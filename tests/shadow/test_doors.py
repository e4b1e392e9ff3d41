"""``dirk shadow`` and the shadow acts at every door: the report as a CI gate, the inbox,
and hostile input (a reason code, never a traceback)."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
import sqlite3
import subprocess
import time
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel import InputInvalid, SystemClock
from kernel.audit import open_journal, verify_journal
from kernel.cli._main import main
from kernel.core import keys as keyfns
from kernel.core.events import InputRefused, ShadowLoaded, ShadowPromoted, payload_of
from kernel.core.reasons import ExitCode, ReasonCode
from kernel.dim import ShadowRefused
from kernel.inbox import ShadowRequest
from kernel.inbox.proof import sign
from kernel.inbox.requests import normalized
from tests.cli.test_cli import dirk, one_error_line
from tests.shadow.test_shadow import CANDIDATE, kernel, run_flows, trader
from tests.support.hostile import hostile_scalars, hostile_text
from tests.support.operators import Keys, wait_taken

HERE = Path(__file__).parent
CANDIDATE_SPEC = f"{HERE / 'test_shadow.py'}:CANDIDATE"
ENFORCED_SPEC = f"{HERE.parent / 'dim' / 'test_amendments.py'}:PACK"
EXAMPLES = itertools.count()


def report_json(*args: str | Path) -> tuple[int, dict[str, object]]:
    done = dirk("shadow", "report", "--json", *args)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


async def test_the_report_gates_ci_and_promotion_through_the_inbox_records_its_digest(
    tmp_path: Path, operator_keys: Keys
) -> None:
    db = tmp_path / "j.db"
    async with kernel(db, clock=SystemClock(), poll_s=0.02) as k:
        await k.register(trader([4, 1]))
        await k.load_shadow(CANDIDATE, operator="ana", reason="try the tighter limit")
        [loaded] = await k.journal.read(types=["ShadowLoaded"])
        await run_flows(k, 4)

        def reports() -> tuple[tuple[int, dict[str, object]], ...]:
            live = report_json("--db", db, "--fail-above", "2")
            replayed = report_json(
                "--db",
                db,
                "--pack",
                CANDIDATE_SPEC,
                "--with",
                ENFORCED_SPEC,
                "--from",
                str(loaded.seq),
                "--to",
                str(live[1]["stop"]),
                "--fail-above",
                "1",
            )
            return live, replayed

        (live_code, live), (replayed_code, replayed) = await anyio.to_thread.run_sync(reports)
        # Two of four differ: under the bar of 2, above the bar of 1; history reads alike.
        assert (live["differed"], live_code, replayed_code) == (2, 0, ExitCode.FAILED)
        assert live["source"] == "live" and replayed["source"] == "history"
        assert live["digest"] == replayed["digest"]
        assert live["differences"] == replayed["differences"]

        def promote(*extra: str) -> subprocess.CompletedProcess[str]:
            return dirk(
                "shadow",
                "promote",
                "desk",
                "--operator",
                "ana",
                "--reason",
                "reviewed",
                "--db",
                db,
                "--wait",
                "30",
                *extra,
            )

        stale = await anyio.to_thread.run_sync(promote, "--report", "ab" * 32)
        assert one_error_line(stale) == ReasonCode.SHADOW_REPORT_CHANGED
        done = await anyio.to_thread.run_sync(promote, "--report", str(live["digest"]))
        assert done.returncode == 0, done.stderr
        assert "applied: shadow desk 1.1.0 promoted by ana" in done.stdout
        [promoted] = await k.journal.read(types=["ShadowPromoted"])
        assert isinstance(promoted.payload, ShadowPromoted)
        assert promoted.payload.report == live["digest"]
        assert promoted.payload.inbox_id is not None
        assert k.projections.packs["desk"] == CANDIDATE.ref
        gone = await anyio.to_thread.run_sync(
            lambda: dirk(
                "shadow", "retire", "desk", "--operator", "ana", "--reason", "x", "--db", db
            )
        )
        assert one_error_line(gone) == ReasonCode.SHADOW_NOT_LOADED
    assert (await verify_journal(db)).ok


async def test_an_offered_candidate_loads_by_a_signed_request_and_a_forged_one_is_refused(
    tmp_path: Path, operator_keys: Keys
) -> None:
    db = tmp_path / "j.db"
    async with kernel(db, clock=SystemClock(), poll_s=0.02) as k:
        await k.register(trader([4, 1]))
        k.offer_shadow(CANDIDATE)  # the code, from the embedding program; nothing recorded
        assert not await k.journal.read(types=["ShadowLoaded"])
        load = ShadowRequest(
            action="load", pack="desk", version="1.1.0", candidate=CANDIDATE.ref.hash,
            operator="ana", reason="the committee's candidate",
        )  # fmt: skip
        # As the attacker writes rows: unsigned, and signed by a key the keyring lacks.
        journal_id = k.journal.journal_id
        unsigned = json.dumps(
            {"journal_id": journal_id, "request": msgspec.to_builtins(load),
             "request_id": "attacker-request-0001", "signer": "ana", "signature": ""}
        ).encode()  # fmt: skip
        forged = sign(
            load, key=keyfns.generate(), signer="ana", journal_id=journal_id,
            signed_ns=time.time_ns(),
        )  # fmt: skip
        for body in (unsigned, forged):
            with closing(sqlite3.connect(db)) as conn, conn:
                [(row,)] = conn.execute(
                    "INSERT INTO operator_inbox (request, created_ts) VALUES (?, 0) RETURNING id",
                    (body,),
                ).fetchall()
            seq = await wait_taken(k, row)
            [refused] = await k.journal.read(seq, seq + 1)
            assert payload_of(refused, InputRefused).reason_code is ReasonCode.SIGNATURE_INVALID
        assert not await k.journal.read(types=["ShadowLoaded"])

        def shadow_load(*extra: str) -> subprocess.CompletedProcess[str]:
            return dirk(
                "shadow", "load", "desk", "--operator", "ana", "--reason", "the candidate",
                "--db", db, "--wait", "30", *extra,
            )  # fmt: skip

        # Signed by ana, but naming a version not offered, or a hash not the one offered.
        missing = await anyio.to_thread.run_sync(shadow_load, "--version", "9.9.9")
        assert one_error_line(missing) == ReasonCode.SHADOW_INVALID
        other = await anyio.to_thread.run_sync(
            shadow_load, "--version", "1.1.0", "--candidate", "ab" * 32
        )
        assert one_error_line(other) == ReasonCode.SHADOW_INVALID
        assert not await k.journal.read(types=["ShadowLoaded"])

        done = await anyio.to_thread.run_sync(
            shadow_load, "--version", "1.1.0", "--candidate", CANDIDATE.ref.hash
        )
        assert done.returncode == 0, done.stderr
        assert "applied: pack desk 1.1.0 shadows 1.0.0 by ana" in done.stdout
        [loaded] = await k.journal.read(types=["ShadowLoaded"])
        shadow = payload_of(loaded, ShadowLoaded)
        assert shadow.pack == CANDIDATE.ref and shadow.operator == "ana"
        assert shadow.inbox_id is not None and k.projections.inbox_taken[shadow.inbox_id]
        await run_flows(k, 2)  # it judges: the first order (4) is over its limit of 3
        assert await k.journal.read(types=["ShadowDiffered"])
    assert (await verify_journal(db)).ok


SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
@given(
    name=hostile_scalars(),
    version=hostile_scalars(),
    report=hostile_scalars(),
    operator=hostile_scalars(),
    reason=hostile_text(),
)
async def test_hostile_shadow_acts_are_refused_with_a_code_and_the_kernel_goes_on(
    tmp_path: Path, name: object, version: object, report: object, operator: object, reason: str
) -> None:
    path = tmp_path / f"j{next(EXAMPLES)}.db"
    async with kernel(path) as k:
        await k.register(trader([4]))
        await k.load_shadow(CANDIDATE, operator="ana", reason="try")
        acts: list[Callable[[], Awaitable[object]]] = [
            lambda: k.retire_shadow(name, operator=operator, reason=reason, version=version),  # type: ignore[arg-type]
            lambda: k.promote_shadow(name, operator=operator, reason=reason, report=report),  # type: ignore[arg-type]
            lambda: k.load_shadow(name, operator=operator, reason=reason),  # type: ignore[arg-type]
        ]
        for act in acts:
            try:
                await act()
            except (InputInvalid, ShadowRefused) as exc:
                assert isinstance(exc.reason_code, ReasonCode)
            assert k.stopped is None
        # Whatever was refused, the shadow judges on (unless a hostile act was valid).
        await run_flows(k, 1)
    assert (await verify_journal(path)).ok


@SETTINGS
@given(fields=st.dictionaries(st.sampled_from(["action", "pack", "version", "report",
                                               "candidate", "operator", "reason", "extra"]),
                              hostile_scalars(), max_size=7))  # fmt: skip
def test_a_hostile_inbox_request_is_refused_at_the_wall(fields: dict[str, object]) -> None:
    try:
        normalized(ShadowRequest(**fields))  # type: ignore[arg-type]
    except InputInvalid as exc:
        assert exc.reason_code is ReasonCode.SCHEMA_INVALID
    except TypeError:
        pass  # a Struct without its required fields cannot even be built (never sent)


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shadow") / "j.db"

    async def record() -> None:
        async with kernel(path) as k:
            await k.register(trader([4]))
            await k.load_shadow(CANDIDATE, operator="ana", reason="try")
            await run_flows(k, 2)

    anyio.run(record)
    return path


ERROR = re.compile(r"error: [A-Z_]+: ")


@settings(max_examples=40, deadline=None)
@given(
    flag=st.sampled_from(["--shadow", "--from", "--to", "--fail-above", "--pack", "--with"]),
    value=hostile_text(max_size=20) | st.integers(-(2**70), 2**70).map(str),
    act=st.sampled_from(["report", "retire", "promote"]),
    text=hostile_text(max_size=20),
)
def test_hostile_arguments_get_a_code_never_a_traceback(
    journal: Path, flag: str, value: str, act: str, text: str
) -> None:
    if act == "report":
        argv = ["shadow", "report", "--db", str(journal), flag, value]
    else:
        argv = ["shadow", act, text, "--operator", text, "--reason", value, "--db", str(journal)]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's own refusal: usage, status 2
            code = int(exit_.code or 0)
    assert code in (ExitCode.OK, ExitCode.FAILED, ExitCode.USAGE), err.getvalue()
    assert "Traceback" not in err.getvalue()
    for line in err.getvalue().splitlines():
        assert ERROR.match(line) or line.startswith(("usage:", "  ", "dirk", "note:")), line


async def test_old_journals_open_and_verify(tmp_path: Path) -> None:
    golden = Path(__file__).parent.parent / "golden" / "trading.db"
    assert (await verify_journal(golden)).ok
    async with open_journal(golden, readonly=True) as j:
        assert not await j.read(types=["ShadowLoaded"])
