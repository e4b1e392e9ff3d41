"""Baselines measured in the same run as the kernel: what the machine does with no kernel at all.

B1 is the floor of one actor hop (two tasks and two plain asyncio.Queues);
B2 is the floor of durability (aiosqlite, WAL, synchronous=FULL, 100 rows per
transaction). The kernel's figures are read as ratios to these, since
absolute numbers move with the machine and its load.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import aiosqlite

BLOB_BYTES = 250
ROWS_PER_TRANSACTION = 100


async def queue_round_trips(n: int) -> float:
    """Return ping-pong round trips per second between two tasks over two asyncio.Queues.

    Task A puts a message and waits for the reply; task B gets it and puts a
    reply on the second queue. Run it on a plain asyncio loop.
    """
    requests: asyncio.Queue[int] = asyncio.Queue()
    replies: asyncio.Queue[int] = asyncio.Queue()

    async def pong() -> None:
        for _ in range(n):
            await replies.put(await requests.get() + 1)

    async def ping() -> None:
        for i in range(n):
            await requests.put(i)
            if await replies.get() != i + 1:
                raise AssertionError("a reply went astray")

    start = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(pong())
        tg.create_task(ping())
    return n / (time.perf_counter() - start)


async def sqlite_appends(path: Path, rows: int, *, seed: int = 7) -> float:
    """Return rows per second appended to a fresh SQLite file through aiosqlite.

    Each transaction is one ``executemany`` of 100 rows carrying a 250-byte
    blob, then a commit, in WAL mode with synchronous=FULL: the journal's
    write pattern with nothing of the kernel around it.
    """
    rng = random.Random(seed)
    blobs = [rng.randbytes(BLOB_BYTES) for _ in range(ROWS_PER_TRANSACTION)]
    async with aiosqlite.connect(path) as db:
        await db.execute("PRAGMA journal_mode = WAL")
        await db.execute("PRAGMA synchronous = FULL")
        await db.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        await db.commit()
        seq = 0
        start = time.perf_counter()
        while seq < rows:
            batch = [(seq + i + 1, blob) for i, blob in enumerate(blobs)]
            await db.executemany("INSERT INTO events (seq, body) VALUES (?, ?)", batch)
            await db.commit()
            seq += len(batch)
        elapsed = time.perf_counter() - start
        ((count,),) = await db.execute_fetchall("SELECT count(*) FROM events")
    if count != seq:
        raise AssertionError(f"{seq} rows appended but {count} in the file")
    return seq / elapsed
