"""P5: how fast a journal is folded again (replay) and proven (verify).

Replay folds every projection from event 1 in a fresh read-only open, as
``dirk state`` does without a snapshot. Verify is what ``dirk verify`` does
(:func:`kernel.audit.verification.verify_all`): the hash chain, and every
projection folded again from the same read and compared with each recorded
checkpoint. Both are read as events per second; the chain alone
(:func:`kernel.verify_journal`) and the projections alone
(:func:`kernel.verify_projections`, which reads the journal itself) are timed
apart as extras.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from kernel.audit import open_journal, verify_journal, verify_projections
from kernel.audit.verification import verify_all
from kernel.state.projections import Projections


@dataclass(frozen=True)
class ReplayRun:
    """Seconds to replay and to verify one journal of ``events`` events."""

    events: int
    replay_s: float
    verify_s: float
    chain_s: float
    projections_s: float

    @property
    def replay_per_s(self) -> float:
        return self.events / self.replay_s

    @property
    def verify_per_s(self) -> float:
        return self.events / self.verify_s


class ReplayMismatch(Exception):
    """Replay or verify did not agree with the journal: the figure would be meaningless."""


async def run_replay(path: Path) -> ReplayRun:
    """Replay and verify the closed journal at ``path``; raise if either finds a problem."""
    async with open_journal(path, readonly=True) as journal:
        start = time.perf_counter()
        projections = Projections()
        async for batch in journal.scan(hashes=False):
            projections.apply(batch)
        replay_s = time.perf_counter() - start
        events = journal.head_seq

    start = time.perf_counter()
    both, replayed = await verify_all(path)
    verify_s = time.perf_counter() - start
    start = time.perf_counter()
    chain = await verify_journal(path)
    chain_s = time.perf_counter() - start
    async with open_journal(path, readonly=True) as journal:
        start = time.perf_counter()
        report = await verify_projections(journal)
        projections_s = time.perf_counter() - start
    digests = {projections.digest(), report.digest, replayed.digest if replayed else ""}
    if not (chain.ok and both.ok and report.ok and replayed and replayed.ok) or len(digests) > 1:
        raise ReplayMismatch(f"P5: verify failed: {chain.problem or report.problems}")
    return ReplayRun(
        events=events,
        replay_s=replay_s,
        verify_s=verify_s,
        chain_s=chain_s,
        projections_s=projections_s,
    )
