"""P7: opening a long journal from its latest snapshot against replaying it from zero.

``python -m benchmarks.checkpoints [--events N] [--keep PATH]`` writes a journal
of N events (default one million: closed flows of seven events each, in
appends of 7,000), records a projection checkpoint and its snapshot near the
end the way a running kernel does, appends a tail, then measures
:func:`kernel.state.snapshots.restore` (snapshot + tail) and a full fold, each in a
fresh read-only open. A figure, not a timed test.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import anyio

from kernel.core.events import (
    AnyPayload,
    ContextCompiled,
    Draft,
    ExecutionIntent,
    ExecutionStarted,
    ExecutionSucceeded,
    FlowClosed,
    FlowCreated,
    ProposalAccepted,
    ProposalRecord,
    ProposalSubmitted,
)
from kernel.journal.opening import open_journal
from kernel.state.projections import Projections
from kernel.state.snapshots import capture, record_checkpoint, restore

EVENTS_PER_FLOW = 7


def flow_drafts(n: int) -> list[Draft]:
    """The seven events of one closed flow."""
    dfid = f"{n:032x}"
    key = f"k{n}"
    payloads: list[AnyPayload] = [
        FlowCreated(root_dfid=dfid, topic="bench"),
        ContextCompiled(attempt=1, context_ref="c", state={"bench.n": n}),
        ProposalSubmitted(
            attempt=1, proposal=ProposalRecord(kind="test.transfer", params={"amount_cents": n})
        ),
        ProposalAccepted(attempt=1),
        ExecutionStarted(intent=ExecutionIntent(key=key, kind="test.transfer", adapter="bank")),
        ExecutionSucceeded(key=key, external_id=f"tx-{n}"),
        FlowClosed(),
    ]
    return [Draft(payload=p, dfid=dfid, agent_id="clerk") for p in payloads]


async def build(path: Path, events: int, tail: int) -> None:
    """Write ``events`` events with one checkpoint ``tail`` events before the end."""
    flows = events // EVENTS_PER_FLOW
    checkpoint_at = max(0, (events - tail) // EVENTS_PER_FLOW)
    projections = Projections()
    async with open_journal(path, synchronous="OFF") as journal:
        journal.set_transition_check(projections.transition_check)
        journal.add_listener(projections.apply)
        batch: list[Draft] = []
        for n in range(flows):
            batch += flow_drafts(n)
            if len(batch) >= 7_000 or n == flows - 1:
                await journal.append(batch)
                batch = []
            if n + 1 == checkpoint_at:
                await record_checkpoint(journal, capture(projections))


async def open_ready(path: Path) -> tuple[float, str]:
    """Return the seconds from opening the journal to its restored projections, and their digest.

    The clock includes the open itself (reading the head and checking it chains),
    because that is what a kernel pays before it is ready.
    """
    start = time.perf_counter()
    async with open_journal(path, readonly=True) as journal:
        restored = await restore(journal)
        restored_s = time.perf_counter() - start
    return restored_s, restored.digest()


async def measure(path: Path) -> tuple[float, float, int]:
    """Return (seconds to restore, seconds to fold from zero, events)."""
    restored_s, restored_digest = await open_ready(path)
    async with open_journal(path, readonly=True) as journal:
        start = time.perf_counter()
        full = Projections()
        async for batch in journal.scan():
            full.apply(batch)
        full_s = time.perf_counter() - start
    if restored_digest != full.digest():
        raise AssertionError("the snapshot plus tail differs from a fold from zero")
    return restored_s, full_s, full.last_seq


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.checkpoints")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--tail", type=int, default=5_000, help="events after the checkpoint")
    parser.add_argument("--keep", type=Path, help="build the journal here (reused if present)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "p7.db"
        if not path.exists():
            start = time.perf_counter()
            anyio.run(build, path, args.events, args.tail)
            print(f"built {path} in {time.perf_counter() - start:.1f} s")
        restored_s, full_s, events = anyio.run(measure, path)
    print(f"P7  events={events}  open from snapshot + tail: {restored_s:.2f} s")
    print(f"P7  events={events}  fold from zero:          {full_s:.2f} s")


if __name__ == "__main__":
    main()
