"""The trading example with its agents in host processes gives the single-process run's day.

``python -m examples.trading --bus`` starts one ``agents_sdk.serve`` process per agent; the
kernel's decisions are a function of the recorded events, so for one seed both runs record
the same events in the same order, with one difference that is the bus's own doing: the
resend beat. In one process the agent's client submits its last proposal again and the
kernel answers from the record (``DuplicateSuppressed``); on the bus the host's client
publishes the same message again and JetStream's duplicate window absorbs it before the
kernel sees it. The test names that one event and compares everything else exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from examples import trading
from examples.summary import read_events
from kernel.audit import Event
from tests.support.nats import NatsServer, nats_server_fixture, reset_bus  # noqa: F401

MINUTES = 30  # the shortest day the plan allows: every beat and mistake


def run(db: Path, capsys: Any, *args: str, seed: int = 3, minutes: int = MINUTES) -> dict[str, Any]:
    command = ["--db", str(db), "--json", "--seed", str(seed), "--minutes", str(minutes), *args]
    code = trading.main(command)
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0, out
    summary: dict[str, Any] = json.loads(out[-1])
    return summary


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
        if record["payload"]["type"] == "CheckpointKeyChanged":
            # Each run signs with its own key, under its own journal's origin.
            for key in ("origin", "key", "vkey"):
                record["payload"].pop(key)
        kept.append(record)
    return kept


def verdicts(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The decisions: each proposal's kind and params, then how it was judged and why."""
    judged = []
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


def test_the_mesh_run_and_the_single_process_run_agree(tmp_path, capsys, nats_server):
    agree(tmp_path, capsys, nats_server.url, seed=3, minutes=MINUTES)


@settings(
    max_examples=2,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 10_000), minutes=st.integers(MINUTES, MINUTES + 6))
def test_any_seed_agrees_on_the_bus(tmp_path_factory, capsys, nats_server, seed, minutes):
    agree(tmp_path_factory.mktemp("day"), capsys, nats_server.url, seed=seed, minutes=minutes)


def agree(tmp_path: Path, capsys: Any, url: str, *, seed: int, minutes: int) -> None:
    anyio.run(reset_bus, url)
    alone = run(tmp_path / "alone.db", capsys, seed=seed, minutes=minutes)
    meshed = run(tmp_path / "mesh.db", capsys, "--bus", url, seed=seed, minutes=minutes)
    one, bus = recorded(tmp_path / "alone.db"), recorded(tmp_path / "mesh.db")

    # The one event only the single-process run records: the resent submission it answered
    # from the record. On the bus the same resend never reached the kernel.
    [resent] = [e for e in one if e["payload"]["type"] == "DuplicateSuppressed"]
    assert resent["payload"]["source"] == "submission"
    assert not [e for e in bus if e["payload"]["type"] == "DuplicateSuppressed"]
    one.remove(resent)

    assert bus == one  # every other event, in the same order, field for field
    assert verdicts(bus) == verdicts(one) and len(verdicts(one)) > 50

    expected = dict(alone)
    expected["events"] -= 1
    expected["duplicates_prevented"] -= 1
    expected["duplicates_by_source"] = {
        k: v for k, v in alone["duplicates_by_source"].items() if k != "submission"
    }
    # The projection hash differs only as the seqs do (facts carry the seq that set them).
    # Each run signs its checkpoints with its own key; each covers its own journal's events.
    assert meshed.pop("checkpoints") == f"signed; the latest covers all {meshed['events']} events"
    assert expected.pop("checkpoints").startswith("signed; the latest covers all")
    for key in ("projection_hash", "inspect", "verify"):
        expected.pop(key)
        meshed.pop(key)
    assert meshed == expected
    assert meshed["verified"] and meshed["reason_codes"] == alone["reason_codes"]
