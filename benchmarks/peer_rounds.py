"""P9 and P14: the peers measured round by round beside P1, each run in its own process.

Peers' figures move with the machine's load as much as the kernel's do, so
each round runs P1 and then every peer once (``python -m benchmarks.peers
NAME``, a fresh process each time), and the comparison is the ratio P1 / peer
within each round, reported as the median, min and max over the rounds (as
R1 = P1 / B1 is). A peer that is not installed, or cannot run here, is tried
once and then shown as skipped with its reason; one that fails in a later
round is dropped for the rest of the run and shown as failed, with the round.

P10-P12 are the PostgreSQL figures and P13 the mesh, so Microsoft's Agent
Governance Toolkit, which the issue that asked for it called P10, is P14.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

from benchmarks.report import Figure


@dataclass(frozen=True)
class Peer:
    """One peer as a figure: its id, its name for ``benchmarks.peers`` and the goal against it."""

    id: str
    name: str
    shape: str
    goal: float | None
    """P1 as a multiple of the peer's decisions per second, at least (None: no goal set)."""
    scale: float = 1.0
    """Decisions per run as a share of the plan's: fast peers run more, slow ones fewer."""

    @property
    def group(self) -> str:
        return self.id.split(".", 1)[0]

    @property
    def ratio_id(self) -> str:
        return "R" + self.id[1:]

    def decisions(self, planned: int) -> int:
        return max(1, round(planned * self.scale))


PEERS = (
    Peer("P9.dbos", "dbos", "workflow, validate + execute steps, SQLite WAL", 25.0),
    Peer("P9.langgraph", "langgraph", "3-node graph, SqliteSaver", 25.0),
    Peer("P9.autogen", "autogen", "request/response, no durability", 2.0, scale=5.0),
    Peer(
        "P9.temporal",
        "temporal",
        "workflow, validate + execute activities, dev server on SQLite WAL",
        None,
        scale=0.3,
    ),
    Peer("P14.mem", "agt-govern", "govern(): policy, in-memory audit, execute", 1.0, scale=5.0),
    Peer(
        "P14.file",
        "agt-file",
        "policy, FileAuditSink decision + outcome entries, execute",
        2.0,
        scale=5.0,
    ),
)


@dataclass
class PeerSeries:
    """What one peer measured so far: per round, P1's flows/s and the peer's record."""

    peer: Peer
    p1: list[float] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    failed_round: int | None = None


class PeerRounds:
    """Runs the peers of the groups asked for (P9, P14) once per round, after that round's P1."""

    def __init__(self, only: set[str], decisions: int, directory: str | None) -> None:
        self.series = [PeerSeries(p) for p in PEERS if p.group in only]
        self._decisions = decisions
        self._directory = directory
        self._round = 0

    @property
    def active(self) -> bool:
        return bool(self.series)

    def run_round(self, p1_flows_per_s: float) -> list[str]:
        """Run every peer still in the race once; return what to print for this round."""
        self._round += 1
        said = []
        for series in self.series:
            if series.error is not None:
                continue
            peer = series.peer
            record = run_peer(peer.name, peer.decisions(self._decisions), self._directory)
            if "error" in record:
                series.error = str(record["error"])
                series.failed_round = self._round
                said.append(f"{peer.id} {series.error.split(':', 1)[0]}")
                continue
            series.p1.append(p1_flows_per_s)
            series.records.append(record)
            said.append(f"{peer.id} {record['per_s']:,.0f}/s")
        return said

    def figures(self) -> list[Figure]:
        return [figure for series in self.series for figure in peer_figures(series)]


def peer_figures(series: PeerSeries) -> list[Figure]:
    """The peer's decisions per second and the ratio P1 / peer paired per round (or why not)."""
    peer = series.peer
    if series.error is not None:
        reason = series.error
        if series.records:  # it ran in earlier rounds, then broke: not a figure to compare
            reason = f"failed in round {series.failed_round}: {reason}"
        return [Figure(peer.id, f"{peer.name}: {reason}", "", skipped=True)]
    if not series.records:
        return []
    rates = [float(r["per_s"]) for r in series.records]
    versions = {k: v for k, v in series.records[0].items() if k not in _RECORD_FIELDS}
    rate = Figure(
        peer.id,
        f"{peer.name}: one decision ({peer.shape})",
        "decisions/s",
        rates,
        extra={"decisions_per_run": series.records[0]["decisions"], "versions": versions},
    )
    paired = [p1 / r for p1, r in zip(series.p1, rates, strict=True)]
    ratio = Figure(
        peer.ratio_id,
        f"P1 / {peer.name}, paired per round",
        "ratio",
        paired,
        goal=peer.goal,
        extra={"p1_flows_per_s": series.p1},
    )
    return [rate, ratio]


_RECORD_FIELDS = {"peer", "decisions", "seconds", "per_s"}


def run_peer(name: str, decisions: int, directory: str | None) -> dict[str, Any]:
    """Run ``python -m benchmarks.peers NAME`` in a fresh process; return its JSON record.

    A peer whose process dies or prints no record comes back as an error record,
    so a broken peer is shown as failed in the table and never stops the run.
    """
    with tempfile.TemporaryDirectory(prefix="dir-bench-peer-", dir=directory) as tmp:
        argv = [sys.executable, "-m", "benchmarks.peers", name, "--decisions", str(decisions)]
        done = subprocess.run([*argv, "--dir", tmp], capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    try:
        record = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        record = None
    if done.returncode != 0 or not isinstance(record, dict):
        tail = done.stderr.strip()[-300:]
        return {"peer": name, "error": f"failed: exited {done.returncode}: {tail}"}
    return record
