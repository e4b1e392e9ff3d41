"""A simulated external system, for tests and examples: it misbehaves like a real one.

It keeps its own durable ledger (a separate SQLite file) of effects by
idempotency key, so a crash of the kernel, or of this process, never loses or
invents an effect. From a seed it injects what real systems do: latency,
transient 5xx before the effect, answers lost after the effect happened,
requests delivered twice, and terminal refusals. Each misbehaviour is drawn
from (seed, key, call number), so the same run misbehaves the same way
whatever the scheduling.

It honours the adapter contract (docs/adapters.md): an effect happens at most
once per key (or, with ``dedupe=False``, the system does not deduplicate and
the kernel relies on :meth:`SimulatedSystem.lookup`).
"""

from __future__ import annotations

import hashlib
import random
import sqlite3
from collections.abc import Awaitable, Callable
from os import PathLike
from typing import Any

import anyio
import msgspec

from kernel.adapters.contract import AdapterError, Receipt, RetryPolicy
from kernel.core.events import ExecutionIntent


class Faults(msgspec.Struct, frozen=True, kw_only=True):
    """How often the system misbehaves, each a probability per call."""

    latency_s: tuple[float, float] = (0.0, 0.0)
    """A delay drawn uniformly from this range before anything happens."""
    transient: float = 0.0
    """A 503 before the effect: nothing happened, a retry may succeed."""
    lost_answer: float = 0.0
    """The effect happened but the answer is lost: the caller sees a timeout."""
    duplicate: float = 0.0
    """The request arrives twice: the second delivery must not be a second effect."""
    terminal: float = 0.0
    """A 4xx refusal, decided per key: every call of that key is refused."""


class SimulatedSystem:
    """An adapter for a simulated booking system, broker or ledger.

    Args:
        path: the system's own SQLite file (its ledger of effects).
        seed: where its misbehaviour comes from.
        faults: how often it misbehaves.
        dedupe: whether the system deduplicates on the key itself; if not, the
            kernel asks :meth:`lookup` before calling again.
        sleep: how latency passes (pass a ManualClock's sleep in tests).
        retry: the retry policy the kernel uses for this adapter.
    """

    def __init__(
        self,
        path: str | PathLike[str],
        *,
        seed: int = 0,
        faults: Faults | None = None,
        dedupe: bool = True,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        retry: RetryPolicy | None = None,
    ) -> None:
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = FULL")
        unique = " UNIQUE" if dedupe else ""
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY AUTOINCREMENT,"
            f" key TEXT NOT NULL{unique}, kind TEXT NOT NULL, params TEXT NOT NULL)"
        )
        # Deliveries absorbed per key: the system's own word that it did nothing twice.
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS absorbed (key TEXT PRIMARY KEY, n INTEGER NOT NULL)"
        )
        self._seed = seed
        self._faults = faults or Faults()
        self._dedupe = dedupe
        self._sleep = sleep
        self._calls: dict[str, int] = {}
        self.retry_policy = retry or RetryPolicy(base_s=0.01, max_s=0.1, max_attempts=6)
        self.duplicates_absorbed = 0
        self._delivered: tuple[str, int] | None = None
        if not dedupe:
            # Without deduplication the kernel must be able to ask what happened.
            self.lookup = self._lookup

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        """Carry out ``intent``, misbehaving as drawn for this key and call."""
        call = self._calls[intent.key] = self._calls.get(intent.key, 0) + 1
        draw = self._draw(intent.key, call)
        low, high = self._faults.latency_s
        if high > 0:
            await self._sleep(draw.uniform(low, high))
        self.before_call(intent, call)
        if self._draw(intent.key, 0).random() < self._faults.terminal:
            raise AdapterError(f"400 refused {intent.kind}", transient=False)
        if draw.random() < self._faults.transient:
            # Refused before anything happened: the system knows it did nothing.
            raise AdapterError("503 service unavailable", transient=True, outcome_unknown=False)
        self._record(intent)
        if draw.random() < self._faults.duplicate:
            # The network delivers the request again; the system knows the request (and
            # with dedupe, the key) and does nothing twice.
            self._record(intent)
        self.after_effect(intent, call)
        if draw.random() < self._faults.lost_answer:
            # The caller cannot tell this from a timeout before the effect: unknown.
            raise AdapterError("timeout: the answer was lost", transient=True)
        receipt = await self._lookup(intent.key)
        assert receipt is not None
        return receipt

    async def _lookup(self, key: str) -> Receipt | None:
        return self.receipt_of(key)

    def receipt_of(self, key: str) -> Receipt | None:
        """What the system's own console shows for ``key`` (an operator reconciling reads it)."""
        row = self._db.execute("SELECT min(id) FROM effects WHERE key = ?", (key,)).fetchone()
        if row[0] is None:
            return None
        absorbed = self._db.execute("SELECT n FROM absorbed WHERE key = ?", (key,)).fetchone()
        detail = {"duplicates_absorbed": absorbed[0]} if absorbed else {}
        return Receipt(external_id=f"sim-{row[0]:06d}", detail=detail)

    def ledger(self) -> list[tuple[str, str, dict[str, Any]]]:
        """Every effect in the ledger, as (key, kind, params), oldest first."""
        rows = self._db.execute("SELECT key, kind, params FROM effects ORDER BY id")
        return [(key, kind, msgspec.json.decode(params)) for key, kind, params in rows]

    def effects(self) -> list[tuple[str, str]]:
        """Every effect in the ledger, as (key, kind), oldest first."""
        return list(self._db.execute("SELECT key, kind FROM effects ORDER BY id"))

    def close(self) -> None:
        """Close the ledger."""
        self._db.close()

    def before_call(self, intent: ExecutionIntent, call: int) -> None:
        """A hook run before the effect (crash tests die here)."""

    def after_effect(self, intent: ExecutionIntent, call: int) -> None:
        """A hook run once the effect is durable, before the answer (crash tests die here)."""

    def _record(self, intent: ExecutionIntent) -> None:
        seen = self._db.execute("SELECT 1 FROM effects WHERE key = ?", (intent.key,)).fetchone()
        if seen and (self._dedupe or self._delivered == (intent.key, self._calls[intent.key])):
            self.duplicates_absorbed += 1
            self._db.execute(
                "INSERT INTO absorbed (key, n) VALUES (?, 1)"
                " ON CONFLICT (key) DO UPDATE SET n = n + 1",
                (intent.key,),
            )
            return
        self._delivered = (intent.key, self._calls[intent.key])
        self._db.execute(
            "INSERT INTO effects (key, kind, params) VALUES (?, ?, ?)",
            (intent.key, intent.kind, msgspec.json.encode(intent.params).decode()),
        )

    def _draw(self, key: str, call: int) -> random.Random:
        digest = hashlib.sha256(f"{self._seed}/{key}/{call}".encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))
