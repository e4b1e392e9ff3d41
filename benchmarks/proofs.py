"""P15: what proofs cost: signing on the hot path, proof size and time at scale, a bundle.

- **P15.p1**: P1 with the Merkle tree and a checkpoint signed every second, as a share
  of P1 without either (the tree dropped from the open journal), in the same round
  (goal: at least 0.95).
- **P15.proof**: one inclusion proof of a random event of a journal of ``events``
  events (1M in the full run): made from the stored tree (a few nodes and at most two
  partial tiles of 16 events), checked against the root; median milliseconds (goal:
  under 1 ms) and its size in bytes (goal: under 1 KB).
- **P15.bundle**: the bytes of ``dirk export --bundle`` for a trading flow that
  executed, against the checkpoint the desk signed when it stopped.

P6 counts the tree's share of the journal file (``tree_nodes``).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path

import anyio

from benchmarks.checkpoints import EVENTS_PER_FLOW, flow_drafts
from examples import trading
from examples.summary import checkpoint_signing
from kernel.core.merkle import leaf_hash, verify_inclusion
from kernel.journal.opening import open_journal
from kernel.proofs.bundle import _bare, export_bundle

PROOF_GOAL_MS = 1.0
PROOF_GOAL_BYTES = 1024


async def build(path: Path, events: int) -> bytes:
    """Write ``events`` events (closed flows) and return the tree's root."""
    async with open_journal(path, synchronous="OFF") as journal:
        batch = []
        for n in range(events // EVENTS_PER_FLOW):
            batch += flow_drafts(n)
            if len(batch) >= 7_000:
                await journal.append(batch)
                batch = []
        if batch:
            await journal.append(batch)
        root = journal.tree_root
        assert root is not None
        return root


async def proofs(path: Path, root: bytes, samples: int, seed: int = 1) -> tuple[list[float], int]:
    """Time ``samples`` inclusion proofs of random events; return their ms and the largest size."""
    rng = random.Random(seed)
    times: list[float] = []
    largest = 0
    async with open_journal(path, readonly=True) as journal:
        size = journal.head_seq
        trees = journal.trees()
        for _ in range(samples):
            seq = rng.randrange(1, size + 1)
            [event] = await journal.read(seq, seq + 1)
            start = time.perf_counter()
            proof = await trees.inclusion(seq, size)
            ok = verify_inclusion(seq - 1, size, leaf_hash(_bare(event)), proof, root)
            times.append((time.perf_counter() - start) * 1e3)
            if not ok:
                raise AssertionError(f"the proof of event {seq} does not verify")
            largest = max(largest, 32 * len(proof))
    return times, largest


def proof_figure_data(directory: Path, events: int, samples: int = 200) -> dict[str, float]:
    """Build a journal of ``events`` events, time proofs in it; remove it."""
    path = directory / "p15.db"
    try:
        root = anyio.run(build, path, events)
        times, largest = anyio.run(proofs, path, root, samples)
    finally:
        for suffix in ("", "-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
    return {
        "median_ms": statistics.median(times),
        "p99_ms": sorted(times)[int(len(times) * 0.99) - 1],
        "bytes": float(largest),
    }


async def bundle_bytes(directory: Path, minutes: int) -> int:
    """Run the trading desk with a key, export an executed flow's bundle; return its bytes."""
    path = directory / "p15-trading.db"
    signing = checkpoint_signing(path)
    await trading.simulate(1, path, minutes, "scripted", "scripted", False, signing=signing)
    async with open_journal(path, readonly=True) as journal:
        [done, *_] = await journal.read(types=["ExecutionSucceeded"], limit=1)
        assert done.dfid is not None
        bundle = await export_bundle(journal, done.dfid)
    return len(json.dumps(bundle, indent=1, sort_keys=True).encode()) + 1
