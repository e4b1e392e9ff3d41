"""P5: how fast a journal is folded again (replay) and proven (verify).

Replay folds every projection from event 1 in a fresh read-only open, as
``dirk state`` does without a snapshot. Verify is what ``dirk verify`` does
(:func:`kernel.audit.verification.verify_all`): the hash chain, and every
projection folded again from the same read and compared with each recorded
checkpoint. Both are read as events folded per second: what a reader of the journal
sees, the events a row stands for too (a FlowCreated row carries its ContextCompiled, a
closing ExecutionSucceeded its FlowClosed: kernel.core.events ``with_derived``); rows per
second beside them (``rows``: what is read, hashed and decoded). The chain alone
(:func:`kernel.verify_journal`) and the projections alone
(:func:`kernel.verify_projections`, which reads the journal itself) are timed
apart as extras. Beside each wall time, the CPU seconds: this process's, and a helper
process's (kernel.journal._helper reads and checks a long journal's rows beside the fold
when a core is free), so a figure taken on a busy machine can be read for what it cost.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from pathlib import Path

from kernel.audit import open_journal, verify_journal, verify_projections
from kernel.audit.verification import verify_all
from kernel.state.collector import collector_paused
from kernel.state.projections import Projections


@dataclass(frozen=True)
class ReplayRun:
    """Seconds to replay and to verify one journal of ``events`` events in ``rows`` rows."""

    events: int
    """Events folded: every row's, and the events rows stand for (what a reader sees)."""
    replay_s: float
    verify_s: float
    chain_s: float
    projections_s: float
    replay_cpu_s: float = 0.0
    verify_cpu_s: float = 0.0
    helper_cpu_s: float = 0.0
    """CPU seconds of helper processes, replay's and verify's together."""
    rows: int = 0
    """Rows of the journal (its head seq): fewer than ``events`` where a row stands for two."""

    @property
    def replay_per_s(self) -> float:
        return self.events / self.replay_s

    @property
    def verify_per_s(self) -> float:
        return self.events / self.verify_s

    @property
    def rows_per_s(self) -> float:
        """Rows replayed per second (P5.rows)."""
        return self.rows / self.replay_s

    @property
    def verify_rows_per_s(self) -> float:
        """Rows verified per second (P5.v.rows)."""
        return self.rows / self.verify_s


class ReplayMismatch(Exception):
    """Replay or verify did not agree with the journal: the figure would be meaningless."""


async def run_replay(path: Path) -> ReplayRun:
    """Replay and verify the closed journal at ``path``; raise if either finds a problem."""
    children = _children_cpu()
    async with open_journal(path, readonly=True) as journal:
        start, cpu = time.perf_counter(), time.process_time()
        projections, events = Projections(), 0
        with collector_paused():  # as kernel.state.snapshots folds a journal
            async for batch in journal.scan(hashes=False):
                projections.apply(batch)
                events += len(batch)
        replay_s, replay_cpu_s = time.perf_counter() - start, time.process_time() - cpu
        rows = journal.head_seq

    start, cpu = time.perf_counter(), time.process_time()
    both, replayed = await verify_all(path)
    verify_s, verify_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    helper_cpu_s = _children_cpu() - children
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
        replay_cpu_s=replay_cpu_s,
        verify_cpu_s=verify_cpu_s,
        helper_cpu_s=helper_cpu_s,
        rows=rows,
    )


def _children_cpu() -> float:
    """CPU seconds of this process's ended children (a helper is waited for when done)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
