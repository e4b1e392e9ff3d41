"""The trading example with its agents in host processes gives the single-process run's day.

``python -m examples.trading --bus`` starts one ``agents_sdk.serve`` process per agent; the
kernel's decisions are a function of the recorded events, so for one seed both runs record
the same events in the same order, with one difference that is the bus's own doing: the
resend beat. In one process the agent's client submits its last proposal again and the
kernel answers from the record (``DuplicateSuppressed``); on the bus the host's client
publishes the same message again and JetStream's duplicate window absorbs it before the
kernel sees it. The test names that one event and compares everything else exactly.

Every run is on a server started from the shipped configuration: the kernel's principals
plus the example's own (``extra``: the driver, each host's cue connection), each with its
own key in the run's bus directory. One run uses a server the test starts from what
``--bus-config`` printed, the others the server the example starts itself (``--bus``).
The example's principals are then attacked as such: they reach nothing of the kernel's.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any
from unittest.mock import patch

import anyio
import msgspec
import nats.errors
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.js.client import JetStreamContext

from examples import trading
from examples.desk_hosts import NOTHING, Pm1Host, host_principal
from examples.desk_mesh import DRIVER, KERNEL_KEY, key_files
from examples.summary import read_events
from kernel import FlowStatus
from kernel.adapters import Receipt
from kernel.audit import Event, payload_of
from kernel.core import keys
from kernel.core.events import ExecutionSucceeded, InputRefused
from kernel.mesh import (
    SIGNATURE_HEADER,
    BusAuth,
    GuardedClient,
    Result,
    agent_inbox,
    app_inbox,
    connect,
    handshake_subject,
    recorded_result_holds,
    result_subject,
    sign_result,
)
from tests.mesh.test_attacks import verifies
from tests.support.hostile import hostile_text, hostile_values
from tests.support.mesh_helpers import (
    STEP_S,
    executor,
    host,
    mesh_of,
    meshed,
    principals_of,
    provision,
    relay_of,
    remote_bank,
)
from tests.support.nats import (  # noqa: F401
    NatsServer,
    find_server,
    nats_server_fixture,
    principals_fixture,
    started_server,
)

MINUTES = 30  # the shortest day the plan allows: every beat and mistake


def run(
    db: Path, capsys: pytest.CaptureFixture[str], *args: str, seed: int = 3, minutes: int = MINUTES
) -> tuple[dict[str, Any], str]:
    """Run the example; return its summary and what it said on stderr."""
    command = ["--db", str(db), "--json", "--seed", str(seed), "--minutes", str(minutes), *args]
    code = trading.main(command)
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert code == 0, (lines, err)
    summary: dict[str, Any] = json.loads(lines[-1])
    return summary, err


def recorded(db: Path) -> list[dict[str, Any]]:
    """Every event as recorded, less what depends on its position (seq, causes, hashes)."""
    events: list[Event] = anyio.run(read_events, db)
    kept = []
    for event in events:
        record = msgspec.to_builtins(event)
        for key in ("seq", "ts", "hash", "prev_hash", "caused_by"):
            record.pop(key, None)
        if record["payload"]["type"] == "KernelStopped":
            record["payload"].pop("head_hash")
            record["payload"].pop("head_seq")
        if record["payload"]["type"] == "DriftBreached":
            # The seqs its window counted, which the resent submission's event shifts.
            for key in ("first_seq", "last_seq", "as_of_seq"):
                record["payload"].pop(key)
        if record["payload"].get("operator") == "drift":  # a breach's demotion names them too
            record["payload"]["reason"] = record["payload"]["reason"].split(" over seq ")[0]
        if record["payload"]["type"] == "CheckpointKeyChanged":
            # Each run signs with its own key, under its own journal's origin.
            for key in ("origin", "key", "vkey"):
                record["payload"].pop(key)
        kept.append(record)
    return kept


def verdicts(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The decisions: each proposal's kind and params, then how it was judged and why."""
    judged: list[tuple[Any, ...]] = []
    for e in events:
        p = e["payload"]
        match p["type"]:
            case "ProposalSubmitted":
                judged.append(
                    (e["dfid"], p["attempt"], p["proposal"]["kind"], p["proposal"]["params"])
                )
            case "ProposalAccepted" | "FlowEscalated" | "HumanDecided":
                judged.append((e["dfid"], p["type"], p.get("reason_code"), p.get("decision")))
            case "ProposalRejected":
                judged.append((e["dfid"], p["type"], p["feedback"]["reason_code"]))
            case "FlowAborted" | "SubmissionRefused":
                judged.append((e["dfid"], p["type"], p["reason_code"]))
    return judged


def bus_config(capsys: pytest.CaptureFixture[str], folder: Path, seed: int, port: int) -> str:
    """What ``python -m examples.trading --bus-config`` prints for ``seed``, keys in ``folder``."""
    argv = ["--seed", str(seed), "--bus-dir", str(folder), "--bus-config", f"127.0.0.1:{port}"]
    assert trading.main(argv) == 0
    out, err = capsys.readouterr()
    assert str(folder) in err
    return out


def test_the_mesh_run_and_the_single_process_run_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "run.bus"
    with started_server(lambda port, _store: bus_config(capsys, folder, 3, port)) as server:
        # The keys are the example's, each readable by its owner only.
        for path in key_files(folder, trading.AGENTS):
            assert path.stat().st_mode & 0o777 == 0o600
        assert folder.stat().st_mode & 0o077 == 0
        agree(tmp_path, capsys, ["--bus", server.url, "--bus-dir", str(folder)], seed=3)

        # Another seed's agents are not this server's users: said in one line, nothing run.
        other = ["--db", str(tmp_path / "other.db"), "--seed", "4"]
        code = trading.main([*other, "--bus", server.url, "--bus-dir", str(folder)])
        err = capsys.readouterr().err
        assert code == 2 and "refused agent strategist" in err and "Traceback" not in err
        assert not (tmp_path / "other.db").exists()
        assert "Violation" not in server.server_log().replace("Authorization Violation", "")


def test_a_named_bus_without_the_runs_keys_is_refused_in_one_line(
    tmp_path: Path, capsys: Any
) -> None:
    argv = ["--db", str(tmp_path / "t.db"), "--bus", "nats://127.0.0.1:9"]
    assert trading.main(argv) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 't.bus' / KERNEL_KEY} is missing" in err and "--bus-config" in err
    argv = ["--bus-dir", str(tmp_path / "b"), "--bus-config", "127.0.0.1:4222\nauthorization {}"]
    assert trading.main(argv) == 2
    assert capsys.readouterr().err.startswith("error: listen ")


@settings(
    max_examples=2,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 10_000), minutes=st.integers(MINUTES, MINUTES + 6))
def test_any_seed_agrees_on_the_bus(
    tmp_path_factory: pytest.TempPathFactory, capsys: Any, seed: int, minutes: int
) -> None:
    find_server()  # the example starts its own: skip (or fail under CI) without one
    day = tmp_path_factory.mktemp("day")
    agree(day, capsys, ["--bus"], seed=seed, minutes=minutes)
    # The server it started ran the shipped configuration, with the example's principals.
    conf = (day / "mesh.bus" / "nats-server.conf").read_text()
    assert f"_INBOX.app.{DRIVER}.>" in conf and "allow_responses" in conf
    assert "Violation" not in (day / "mesh.bus" / "nats-server.log").read_text()


@functools.cache
def pm1_host() -> Pm1Host:
    env = {"TRADING_SEED": "3", "TRADING_MINUTES": str(MINUTES), "TRADING_RUN": "r"}
    with patch.dict(os.environ, env | {"DIRK_BUS": "nats://127.0.0.1:9"}):
        return Pm1Host()


@settings(max_examples=80, deadline=None)
@given(
    data=st.one_of(
        st.binary(max_size=80),
        hostile_text().map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.tuples(hostile_values(max_leaves=3), hostile_values(max_leaves=3)).map(
            lambda v: json.dumps(
                {"type": "resend", "journal": v[0], "dfid": v[1]}, default=repr
            ).encode()
        ),
    )
)
def test_a_host_answers_any_resend_ask_in_words(data: bytes) -> None:
    # A flow the host never decided has nothing to send again; anything else is not an ask.
    answer = anyio.run(pm1_host().resend, data)
    assert answer == NOTHING or answer.startswith(b"error: not a resend")


def agree(
    tmp_path: Path, capsys: Any, bus: list[str], *, seed: int, minutes: int = MINUTES
) -> None:
    alone, _ = run(tmp_path / "alone.db", capsys, seed=seed, minutes=minutes)
    meshed_run, said = run(tmp_path / "mesh.db", capsys, *bus, seed=seed, minutes=minutes)
    one, on_bus = recorded(tmp_path / "alone.db"), recorded(tmp_path / "mesh.db")

    # The one event only the single-process run records: the resent submission it answered
    # from the record. On the bus the host sent the same message again, and JetStream's
    # duplicate window absorbed it: it never reached the kernel.
    [resent] = [e for e in one if e["payload"]["type"] == "DuplicateSuppressed"]
    assert resent["payload"]["source"] == "submission"
    assert f"sent {resent['dfid']} again, absorbed as a duplicate" in said
    assert not [e for e in on_bus if e["payload"]["type"] == "DuplicateSuppressed"]
    one.remove(resent)

    assert on_bus == one  # every other event, in the same order, field for field
    assert verdicts(on_bus) == verdicts(one) and len(verdicts(one)) > 50

    expected = dict(alone)
    expected["events"] -= 1
    expected["duplicates_prevented"] -= 1
    expected["duplicates_by_source"] = {
        k: v for k, v in alone["duplicates_by_source"].items() if k != "submission"
    }
    # The projection hash differs only as the seqs do (facts carry the seq that set them).
    # Each run signs its checkpoints with its own key; each covers its own journal's events.
    covers = f"signed; the latest covers all {meshed_run['events']} events"
    assert meshed_run.pop("checkpoints") == covers
    assert expected.pop("checkpoints").startswith("signed; the latest covers all")
    for key in ("projection_hash", "inspect", "verify"):
        expected.pop(key)
        meshed_run.pop(key)
    assert meshed_run == expected
    assert meshed_run["verified"] and meshed_run["reason_codes"] == alone["reason_codes"]


# --- the example's principals, as attackers -------------------------------------------------

SNOOPED = (
    ">",
    "_INBOX.>",
    "_INBOX.kernel.>",
    f"{agent_inbox('clerk')}.>",
    "dirk.mesh.handshake.*",
    "dirk.work.>",
    "dirk.proposals.>",
    "dirk.verdicts.>",
    "dirk.intents.>",
    "dirk.results.>",
    "dirk.evt.>",
    "$KV.DIRK_RELAY.>",
)
"""Handshakes, contexts, proposals, verdicts, intents, results, the relay, others' replies."""


async def as_principal(server: NatsServer, key: Path, name: str) -> GuardedClient:
    """A client logged in as the application principal ``name`` (its key file ``key``)."""
    auth = BusAuth(key=keys.load_private_key(key), inbox=app_inbox(name), tls=server.ca)
    return await connect(server.url, name=f"test-{name}", auth=auth, reconnect=False)


@pytest.mark.parametrize("who", ["driver", "host cues"])
async def test_the_examples_principals_reach_nothing_of_the_kernels(
    tmp_path: Path, nats_server: NatsServer, who: str
) -> None:
    path = tmp_path / "j.db"
    principals = principals_of(nats_server)
    if who == "driver":
        attacker_key, name = principals.driver_key, DRIVER
    else:  # lives in the host process beside clerk's credential: still not clerk
        attacker_key, name = principals.cue_key, host_principal("clerk")
    remote = remote_bank(nats_server)
    try:
        async with (
            executor(nats_server, tmp_path / "ledger.db"),
            meshed(path, nats_server, bank=remote) as kernel,
        ):
            secret = await provision(kernel, nats_server)
            journal = kernel.journal.journal_id
            attacker = await as_principal(nats_server, attacker_key, name)
            seen: list[str] = []

            async def record(msg: Any) -> None:
                seen.append(msg.subject)

            try:
                for subject in SNOOPED:
                    await attacker.subscribe(subject, cb=record)
                # A proposal for clerk with the real journal id, a handshake, a forged result
                # signed with the attacker's own key, each where the kernel listens.
                forged = Result(key="k", receipt=Receipt(external_id="forged"))
                signed = {
                    SIGNATURE_HEADER: sign_result(
                        keys.load_private_key(attacker_key), "bank", forged
                    )
                }
                headers = {"Nats-Msg-Id": f"{journal}:flow:1", SIGNATURE_HEADER: "x"}
                await attacker.publish("dirk.proposals.clerk", b'{"proposal": {}}', headers=headers)
                await attacker.publish(handshake_subject("clerk"), b'{"type": "hello"}')
                await attacker.publish(
                    result_subject("bank", "k"), msgspec.json.encode(forged), headers=signed
                )
                await attacker.publish("dirk.mesh.started", journal.encode())
                with anyio.fail_after(STEP_S):
                    refused = await attacker.wait_violations(len(SNOOPED) + 4)
                assert sum("subscription" in r for r in refused) == len(SNOOPED)
                assert sum("publish" in r for r in refused) == 4
                # Stored copies are out of reach too: the relay, proposals, clerk's pool.
                js = attacker.jetstream(timeout=1)
                for read in (
                    lambda: js.stream_info("DIRK_EVENTS"),
                    lambda: js.get_last_msg("DIRK_PROPOSALS", "dirk.proposals.clerk"),
                    lambda: js.pull_subscribe_bind(durable="pool-clerk", stream="DIRK_WORK"),
                ):
                    with pytest.raises(nats.errors.Error):
                        got = await read()
                        if isinstance(got, JetStreamContext.PullSubscription):
                            # bind itself asks nothing: the fetch does
                            await got.fetch(1, timeout=1)
                # The kernel runs on: a real flow through clerk's host and bank's executor.
                async with host(nats_server, secret) as remote_host:
                    [dfid] = await kernel.trigger("bank.invoice")
                    with anyio.fail_after(STEP_S):
                        assert (await kernel.wait_flow(dfid)).status is FlowStatus.CLOSED
                    await remote_host.line(f"DECIDED {dfid}")
                await relay_of(mesh_of(kernel)).wait_for(kernel.journal.head_seq - 1)
            finally:
                await attacker.close()
            assert seen == []
            [done] = await kernel.journal.read(dfid=dfid, types=["ExecutionSucceeded"])
            succeeded = payload_of(done, ExecutionSucceeded)
            assert recorded_result_holds(succeeded, "bank", principals.bank_public)
            # Nothing the attacker sent reached the kernel (the server refused it all, and
            # recorded each refusal in its log); the kernel never stopped.
            assert remote.refused == 0
            assert not [
                e for e in await kernel.journal.read() if isinstance(e.payload, InputRefused)
            ]
            assert kernel.stopped is None
        log = nats_server.server_log()
        mine = [line for line in log.splitlines() if f"test-{name}" in line]
        assert any("Publish Violation" in line for line in mine)
        assert any("Subscription Violation" in line for line in mine)
    finally:
        await remote.close()
    await verifies(path)
