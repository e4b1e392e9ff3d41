"""The simulated external system the remote-executor tests run in executor processes.

``Ledger`` keeps its effects in the SQLite file ``LEDGER_DB`` (shared by every
executor process, like a real bank) and deduplicates on the intent key, as
every adapter must. ``EXECUTOR_MODE=die_after_effect`` SIGKILLs the process
right after the effect is committed, before any result is published;
``EXECUTOR_MODE=hold`` is a slow external system: after the effect it prints
``HOLDING <key>`` and answers only once a line comes on its stdin.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
from contextlib import closing

import anyio

from kernel.adapters import ExecutionIntent, Receipt


class Ledger:
    async def execute(self, intent: ExecutionIntent) -> Receipt:
        with closing(sqlite3.connect(os.environ["LEDGER_DB"])) as conn, conn:
            conn.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT)")
            conn.execute("CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY)")
            conn.execute("INSERT INTO calls VALUES (?)", (intent.key,))
            conn.execute("INSERT OR IGNORE INTO effects VALUES (?)", (intent.key,))
        if os.environ.get("EXECUTOR_MODE") == "die_after_effect":
            print(f"EFFECT {intent.key}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if os.environ.get("EXECUTOR_MODE") == "hold":
            print(f"HOLDING {intent.key}", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.readline)  # the event loop runs meanwhile
        return Receipt(external_id=f"ledger-{intent.key}")
