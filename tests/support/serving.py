"""``dirk serve`` as a real process, and the trading journal a newcomer serves.

:func:`trading_journal` runs the trading example with ``--operator none`` (its
escalations left waiting, as the README's first step does); :func:`running_serve`
starts ``dirk serve`` on a journal, reads the console's address and sign-in link it
prints, and stops it with SIGTERM (which stops its kernel cleanly first).
:func:`approvable` picks a waiting order the market has not crossed since: approved,
it executes and its flow ends CLOSED.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import anyio

from kernel.core.flow import FlowStatus
from kernel.journal.opening import open_journal
from kernel.policy.quorums import SINGLE
from kernel.state.approvals import ApprovalStatus
from kernel.state.projections import Projections
from kernel.state.quorums import Quorums
from tests.support.browser import ROOT, stop

# Seed 9's day ends with an order one operator may approve and the market still allows
# (an approval is judged again before it executes; most seeds' last waiting orders need
# two operators under trading 0.4.0, or have drifted past the pack's 50 bps).
SEED, MINUTES = 9, 40


@dataclass
class Served:
    """A running ``dirk serve``."""

    url: str
    login: str
    proc: subprocess.Popen[str]
    lines: list[str]
    """What it printed before the console listened."""


def trading_journal(folder: Path, python: str = sys.executable, cwd: Path = ROOT) -> Path:
    """Run the trading example with nobody answering escalations; return its journal."""
    db = folder / "desk.db"
    command = [python, "-m", "examples.trading", "--seed", str(SEED), "--db", str(db)]
    command += ["--minutes", str(MINUTES), "--operator", "none"]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return db


def copied(db: Path, folder: Path) -> Path:
    """A copy of the trading journal and its simulated systems' ledgers in ``folder``."""
    for path in db.parent.glob(f"{db.stem}*"):
        shutil.copy(path, folder / path.name)
    return folder / db.name


def env_without_keys(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment less any keyring or key, as a newcomer's shell has none."""
    env = {k: v for k, v in os.environ.items() if k not in ("DIRK_KEYRING", "DIRK_KEY", "DIRK_DB")}
    return env | dict(extra or {})


@contextmanager
def running_serve(
    db: Path,
    *args: str,
    command: Sequence[str] = (sys.executable, "-m", "kernel"),
    env: Mapping[str, str] | None = None,
    cwd: Path = ROOT,
) -> Iterator[Served]:
    """Run ``dirk serve --db DB --port 0 ARGS``; yield it once its console listens; stop it."""
    proc = subprocess.Popen(
        [*command, "serve", "--db", str(db), "--port", "0", *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env) if env is not None else env_without_keys(),
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        while not (lines and lines[-1].startswith("sign in: ")):
            line = proc.stdout.readline()
            if not line:
                proc.kill()
                raise AssertionError(f"dirk serve did not start: {lines} {proc.communicate()[1]}")
            lines.append(line.strip())
        console = next(line for line in lines if line.startswith("dirk console for"))
        url = console.rsplit(" on ", 1)[1].strip().rstrip("/")
        yield Served(url=url, login=lines[-1].split("sign in: ", 1)[1], proc=proc, lines=lines)
    finally:
        stop(proc)


async def projections_of(db: Path) -> Projections:
    """The journal's projections, read now."""
    projections = Projections()
    async with open_journal(db, readonly=True) as journal:
        async for batch in journal.scan():
            projections.apply(batch)
    return projections


def folded(db: Path) -> Projections:
    """The journal's projections, read now (outside an event loop)."""
    return anyio.run(projections_of, db)


def approvable(db: Path) -> tuple[str, str]:
    """A waiting order of the journal at ``db`` that can still execute (see approvable_in)."""
    return approvable_in(folded(db))


def approvable_in(projections: Projections, margin_s: int = 600) -> tuple[str, str]:
    """A waiting order that can still execute: (DFID, short hash).

    Its validity window reaches ``margin_s`` past the journal's last event (the served
    clock continues from there), the last recorded price has not crossed its limit nor
    drifted past the pack's envelope (an approval is judged again before it executes), and
    one operator's approval is enough (no quorum of two).
    """
    last_ts = max(flow.updated_ts for flow in projections.flows.values())
    ballots = projections.domain(Quorums).ballots
    for dfid, approval in sorted(projections.approvals.items()):
        flow = projections.flows[dfid]
        if flow.status is not FlowStatus.ESCALATED or approval.status is not ApprovalStatus.PENDING:
            continue
        if dfid in ballots and ballots[dfid].quorum != SINGLE:
            continue  # the two-person rule: one operator's approval does not execute it
        until = flow.proposal.valid_until_ns if flow.proposal else None
        if flow.proposal is None or (until or 0) < last_ts + margin_s * 10**9:
            continue
        params = flow.proposal.params
        fact = projections.state.get(f"market.{params.get('symbol')}.price")
        if fact is None or "limit_price" not in params:
            continue
        price, limit = Decimal(str(fact.value)), Decimal(str(params["limit_price"]))
        # Judged again before it executes: the limit must still be within the pack's
        # 50 bps of the last price (trading's StateMatch), and not crossed by it.
        near = abs(limit - price) * 10_000 <= price * 50
        if near and ((price <= limit) if params.get("side") == "buy" else (price >= limit)):
            return dfid, approval.short_hash
    raise AssertionError("no waiting order the market has not crossed")
