"""Run flows against a durable ledger, and SIGKILL this process at a chosen point.

Usage: ``execution_worker.py JOURNAL LEDGER MODE KILL LOOKUP`` where MODE is
``run`` (register a clerk and trigger a stream of flows) or ``recover`` (only
open the kernel and let it finish what an earlier run left); KILL is
``none``, ``commit:N`` (after the Nth journal commit), ``call:N`` (before the
Nth adapter call) or ``effect:N`` (after the Nth effect is durable in the
ledger, before its answer reaches the kernel); LOOKUP is ``1`` for a ledger
that does not deduplicate but answers ``lookup(key)``, ``0`` for one that
deduplicates on the key.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
from typing import Any

import anyio

from kernel import AdapterError, ExecutionIntent, FlowStatus, Receipt, open_kernel
from tests.execution_domain import DESK, KINDS, Ping, Trip, name_of
from tests.helpers import ScriptedAgent

FLOWS = 9


def die() -> None:
    """Die as a crash does: no cleanup, no flush, no exception handlers."""
    os.kill(os.getpid(), signal.SIGKILL)


class Ledger:
    """An external system with its own SQLite file: every effect is a row, by key."""

    def __init__(self, path: str, kill: str, lookup: bool) -> None:
        self._db = sqlite3.connect(path)
        unique = "" if lookup else " UNIQUE"
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY AUTOINCREMENT,"
            f" key TEXT NOT NULL{unique}, name TEXT NOT NULL)"
        )
        self._db.commit()
        what, _, n = kill.partition(":")
        self._kill = (what, int(n or 0))
        self._calls = 0
        self._effects = 0
        if lookup:
            self.lookup = self._lookup

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        self._calls += 1
        if self._kill == ("call", self._calls):
            die()
        name = name_of(intent)
        if name == "book_fail":
            raise AdapterError("no such leg")
        self._db.execute(
            "INSERT OR IGNORE INTO effects (key, name) VALUES (?, ?)", (intent.key, name)
        )
        self._db.commit()
        self._effects += 1
        if self._kill == ("effect", self._effects):
            die()
        receipt = await self._lookup(intent.key)
        assert receipt is not None
        return receipt

    async def _lookup(self, key: str) -> Receipt | None:
        row = self._db.execute("SELECT min(id) FROM effects WHERE key = ?", (key,)).fetchone()
        return Receipt(external_id=f"L{row[0]}") if row[0] is not None else None


def decide(ctx: Any) -> Any:
    """Ping, a saga that completes, or a saga whose last leg fails (and is compensated)."""
    kind = ctx.topic.split(".")[1]
    policy = {
        "ping": Ping(text="hi"),
        "trip": Trip(legs=["flight", "hotel"]),
        "undo": Trip(legs=["flight", "hotel", "fail"]),
    }[kind]
    return ctx.propose(policy, valid_for_s=3600)


async def main(journal: str, ledger_path: str, mode: str, kill: str, lookup: str) -> None:
    ledger = Ledger(ledger_path, kill, lookup == "1")
    async with open_kernel(
        journal, packs=[DESK], adapters={"desk": ledger}, allow=["clerk"]
    ) as kernel:
        if kill.startswith("commit:"):
            commits = [0]
            wanted = int(kill.partition(":")[2])

            def count(_: Any) -> None:
                commits[0] += 1
                if commits[0] == wanted:
                    die()

            kernel.journal.add_listener(count)
        if mode == "run":
            clerk = ScriptedAgent(steps=[decide], capabilities=KINDS, subscriptions=["desk"])
            await kernel.register(clerk)
            async with anyio.create_task_group() as tg:
                for i in range(FLOWS):
                    tg.start_soon(kernel.trigger, f"desk.{('ping', 'trip', 'undo')[i % 3]}.{i}")
            await kernel.wait_quiet()
        else:
            unfinished = (FlowStatus.ACCEPTED, FlowStatus.EXECUTING, FlowStatus.DIRTY)
            for flow in kernel.flows():
                if flow.status in unfinished:
                    await kernel.wait_flow(flow.dfid)
    print("DONE", flush=True)


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:6])
