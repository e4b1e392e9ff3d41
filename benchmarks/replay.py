"""P5: how fast a journal is folded again (replay) and proven (verify).

Replay folds every projection from event 1 in a fresh read-only open, as
``dirk state`` does without a snapshot. Verify is what ``dirk verify`` does:
the hash chain (:func:`kernel.verify_journal`), then every projection folded
again and compared with each recorded checkpoint
(:func:`kernel.verify_projections`). Both are read as events per second.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from kernel.audit import open_journal, verify_journal, verify_projections
from kernel.state.projections import Projections


@dataclass(frozen=True)
class ReplayRun:
    """Seconds to replay and to verify one journal of ``events`` events."""

    events: int
    replay_s: float
    chain_s: float
    projections_s: float

    @property
    def replay_per_s(self) -> float:
        return self.events / self.replay_s

    @property
    def verify_per_s(self) -> float:
        return self.events / (self.chain_s + self.projections_s)


class ReplayMismatch(Exception):
    """Replay or verify did not agree with the journal: the figure would be meaningless."""


async def run_replay(path: Path) -> ReplayRun:
    """Replay and verify the closed journal at ``path``; raise if either finds a problem."""
    async with open_journal(path, readonly=True) as journal:
        start = time.perf_counter()
        projections = Projections()
        async for batch in journal.scan():
            projections.apply(batch)
        replay_s = time.perf_counter() - start
        events = journal.head_seq

    start = time.perf_counter()
    chain = await verify_journal(path)
    chain_s = time.perf_counter() - start
    async with open_journal(path, readonly=True) as journal:
        start = time.perf_counter()
        report = await verify_projections(journal)
        projections_s = time.perf_counter() - start
    if not chain.ok or not report.ok or report.digest != projections.digest():
        raise ReplayMismatch(f"P5: verify failed: {chain.problem or report.problems}")
    return ReplayRun(events=events, replay_s=replay_s, chain_s=chain_s, projections_s=projections_s)
