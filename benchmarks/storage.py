"""P6: journal bytes per event on disk for a trading-like workload, and where they go.

The workload is the shipped trading desk (``examples.trading``): a mandate
flow, position, risk and strategy agents, stale contexts, rejections,
escalations answered by a scripted operator, a compensated saga, executions on
a simulated broker with retries and duplicate deliveries. Its mix of contexts,
verdicts and executions is what a desk's journal holds; the benchmark's own
no-op flows (J1) are not.

Bytes are the database file after a WAL checkpoint, split by SQLite's
``dbstat`` into the events table, each index and the rest, and the events
table further into canonical JSON bodies, hashes and the indexed columns.

P6 divides by the rows stored (the goal's unit since a row was one event). A row may
stand for the events that always follow it (a submission carries its acceptance and
its start: kernel.core.carrying), so P6.read divides the same bytes by the events a
reader of the journal gets, derived ones included, as P5 counts them.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from examples import trading
from kernel.audit import open_journal


@dataclass(frozen=True)
class StorageRun:
    """Bytes on disk of one trading journal, and their breakdown per event."""

    events: int
    file_bytes: int
    breakdown: dict[str, float] = field(default_factory=dict)
    """Bytes per event by where they are stored."""
    events_read: int = 0
    """The events a reader gets from those rows, derived ones included (0: not read)."""

    @property
    def bytes_per_event(self) -> float:
        return self.file_bytes / self.events

    @property
    def bytes_per_event_read(self) -> float:
        """P6.read: the same bytes per event as read."""
        return self.file_bytes / self.events_read


async def run_storage(path: Path, minutes: int, seed: int = 1) -> StorageRun:
    """Run the trading desk for ``minutes`` simulated minutes into ``path``; measure the file."""
    await trading.simulate(seed, path, minutes, "scripted", "scripted", progress=False)
    run = measure_file(path)
    return dataclasses.replace(run, events_read=await events_read(path))


async def events_read(path: Path) -> int:
    """How many events a reader of the closed journal at ``path`` gets, derived included."""
    read = 0
    async with open_journal(path, readonly=True) as journal:
        async for batch in journal.scan(hashes=False):
            read += len(batch)
    return read


def measure_file(path: Path) -> StorageRun:
    """Checkpoint the closed journal at ``path`` and break its bytes down per event."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (events,) = conn.execute("SELECT count(*) FROM events").fetchone()
        columns = dict(
            zip(
                ("body", "hash", "type", "dfid"),
                conn.execute(
                    "SELECT sum(length(body)), sum(length(hash)), sum(length(type)),"
                    " sum(coalesce(length(dfid), 0)) FROM events"
                ).fetchone(),
                strict=True,
            )
        )
        try:
            pages = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))
        except sqlite3.OperationalError:  # an SQLite built without dbstat
            pages = {}
    finally:
        conn.close()
    size = path.stat().st_size
    breakdown = {f"column_{name}": value / events for name, value in columns.items()}
    if pages:
        table = pages.pop("events", 0)
        breakdown["events_table_pages"] = table / events
        breakdown["row_and_page_overhead"] = (table - sum(columns.values())) / events
        for name in sorted(pages):
            if name.startswith("events_"):
                breakdown[f"index_{name}"] = pages.pop(name) / events
        # The Merkle tree's stored subtrees (kernel.journal.tree): the proofs' cost on disk.
        breakdown["tree_nodes"] = pages.pop("tree_nodes", 0) / events
        breakdown["other_tables"] = sum(pages.values()) / events
    return StorageRun(events=events, file_bytes=size, breakdown=breakdown)
