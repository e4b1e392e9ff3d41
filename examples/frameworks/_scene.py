"""The scene every framework example plays: a model books four rooms under the booking pack.

One room is cheap (executed), one is over the agent's limit (refused; the model
revises it, and the revision is over the approval threshold, so it waits for an
operator, whom the example plays), one has a room type that does not exist
(refused). The model is scripted and stateless: it picks its next call from the
tool outputs it has seen, so a run resumed from saved state (another process)
gets the same answers. What the model saw and the flow tree are printed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from kernel import FlowStatus, Kernel, KernelConfig, Manifest, Principal, action_hash, open_kernel
from kernel.adapters import ExecutionIntent, Receipt
from kernel.audit import redact
from kernel.frameworks import Gate
from policies.booking import BOOKING

AGENT = "booker"
TOOL = "booking_reserve_room"
CONVERSATION = "trip-42"


def room(traveller: str, rate: int, nights: int, room_type: str) -> dict[str, Any]:
    """A room the model asks for (rates in cents)."""
    return {
        "traveller": traveller,
        "hotel": "Miramar",
        "room_type": room_type,
        "nights": nights,
        "nightly_rate_cents": rate,
    }


CALLS: list[dict[str, Any]] = [
    room("ana", 12_000, 2, "double"),  # cheap: executed
    room("bo", 90_000, 5, "suite"),  # 450,000 > the agent's max_booking 300,000: refused
    room("bo", 50_000, 5, "suite"),  # the revision: 250,000 > 200,000, an operator approves
    room("cy", 30_000, 2, "penthouse"),  # no such room type: refused
]
"""The model's calls, one a turn (``call_1`` ...): the fourth room is the revision's."""


def next_call(outputs: list[str]) -> tuple[str, dict[str, Any]] | None:
    """The scripted model: its next call (id, arguments) from the tool outputs seen, or None."""
    n = len(outputs)
    return (f"call_{n + 1}", CALLS[n]) if n < len(CALLS) else None


class Hotel:
    """The hotel's booking system at the edge of the world: one booking per idempotency key."""

    def __init__(self) -> None:
        self.bookings: dict[str, Receipt] = {}
        self._refs = itertools.count(1)

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        if intent.key not in self.bookings:
            ref = f"MIR-{next(self._refs):04d}"
            self.bookings[intent.key] = Receipt(external_id=ref, detail={"ref": ref})
        return self.bookings[intent.key]


@asynccontextmanager
async def scene(db: Path) -> AsyncIterator[Gate]:
    """A kernel on ``db`` with the booking pack and the hotel; the agent's session and gate."""
    # This host vouches for one local user: every flow acts on its behalf (docs/identity.md).
    local = KernelConfig(principal=Principal(tenant="local", user="local"))
    async with open_kernel(
        db, packs=[BOOKING], adapters={"hotel": Hotel()}, allow=[AGENT], config=local
    ) as k:
        await k.handshake(
            Manifest(
                agent_id=AGENT,
                version="1.0.0",
                capabilities=["booking.reserve_room"],
                max_attempts=3,
            )
        )
        yield Gate(k, AGENT, BOOKING)


async def operator_approves(kernel: Kernel) -> list[str]:
    """Play the operator: approve every flow waiting for a human, as ``dirk decide`` would."""
    waiting = [flow.dfid for flow in kernel.flows(FlowStatus.ESCALATED)]
    for dfid in waiting:
        print(f"operator ana approves {dfid[:12]}")
        await kernel.decide(
            dfid,
            "approve",
            operator="ana",
            reason="the offsite is budgeted",
            action_hash=action_hash(kernel, dfid),
        )
        await kernel.await_decision(dfid)
    return waiting


def flow_tree(kernel: Kernel) -> list[str]:
    """The agent's flows as a tree: the conversation, then each call under it."""
    flows = [f for f in kernel.flows() if f.agent_id == AGENT]
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for flow in flows:
            if flow.parent_dfid == parent:
                why = f" {flow.reason_code}" if flow.reason_code else ""
                ext = f" -> {flow.external_id}" if flow.external_id else ""
                lines.append(f"{'  ' * depth}{flow.dfid[:12]} {flow.status}{why}{ext}")
                walk(flow.dfid, depth + 1)

    walk(None, 0)
    return lines


Play = Callable[[Gate, Path], Awaitable[list[str]]]
"""One framework's run of the scene, saving its paused run in the directory it is given;
it returns the tool outputs the model saw."""


def main_of(name: str, play: Play, argv: list[str] | None) -> int:
    """The examples' command line: ``--db`` (a fresh file by default) and ``--json``."""
    p = argparse.ArgumentParser(prog=f"python -m examples.frameworks.{name}")
    p.add_argument("--db", help="journal file (default: a fresh temporary file)")
    p.add_argument("--json", action="store_true", help="print a summary as JSON on the last line")
    args = p.parse_args(argv)
    db = Path(args.db) if args.db else Path(tempfile.mkdtemp(prefix="dirk-")) / f"{name}.db"
    saved = db.with_name(f"{db.stem}.saved")  # the framework's paused run, beside the journal
    for taken in (db, saved):
        if taken.exists():
            print(f"error: {taken} exists; pick a new --db path", file=sys.stderr)
            return 2
    saved.mkdir(parents=True)
    print(f"{name}: four rooms -> {redact(str(db))}", file=sys.stderr)
    summary = anyio.run(_run, play, db, saved)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 0 if summary["executed"] == 2 else 1


async def _run(play: Play, db: Path, saved: Path) -> dict[str, Any]:
    async with scene(db) as gate:
        seen = await play(gate, saved)
        tree = flow_tree(gate.kernel)
    print("what the model saw:")
    for n, output in enumerate(seen, 1):
        print(f"  call_{n}: {output}")
    print("flow tree:")
    for line in tree:
        print(f"  {line}")
    return {
        "outputs": seen,
        "executed": sum(o.startswith("EXECUTED") for o in seen),
        "flows": len(tree),
    }
