"""The frameworks' shared scene: a booking kernel, a hotel at the edge, four rooms.

The scenario of issue 29: a model books four rooms (one cheap, one over the approval
threshold, one over the agent's limit, one with a room type that does not exist),
revises after a refusal, and waits for an operator's approval.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from kernel import FlowStatus, Kernel, KernelConfig, Manifest, action_hash, open_kernel
from kernel.adapters import ExecutionIntent, Receipt
from kernel.config import Ports
from kernel.core import events as ev
from kernel.core.reasons import ReasonCode
from kernel.frameworks import Gate
from kernel.policy import ModelPrice, PolicyPack
from kernel.testing import ManualClock, SeededIds
from policies.booking import BOOKING
from tests.support.helpers import LOCAL

AGENT = "booker"
PRICES = {
    name: ModelPrice(currency="USD", per_million=1_000_000)
    for name in ("scripted", "gpt-test", "chat-test")
}
"""A cent a token for the models the frameworks' tests name."""
TOOL = "booking_reserve_room"


class Hotel:
    """A hotel at the edge of the world: it books once per idempotency key, and counts calls."""

    def __init__(self) -> None:
        self.calls: list[ExecutionIntent] = []
        self._refs = itertools.count(1)

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        self.calls.append(intent)
        ref = f"bk-{next(self._refs)}"
        return Receipt(external_id=ref, detail={"hotel": intent.params["hotel"]})


def room(rate: int = 10_000, nights: int = 2, room_type: str = "double") -> dict[str, Any]:
    """A room the model asks for."""
    return {
        "traveller": "cy",
        "hotel": "Miramar",
        "room_type": room_type,
        "nights": nights,
        "nightly_rate_cents": rate,
    }


CHEAP = room()
OVER_LIMIT = room(rate=90_000, nights=5, room_type="suite")  # 450,000 > max_booking 300,000
REVISED = room(rate=50_000, nights=5, room_type="suite")  # 250,000: over the threshold, a human
NO_SUCH_ROOM = room(room_type="penthouse")
SCRIPT: list[dict[str, Any]] = [CHEAP, OVER_LIMIT, NO_SUCH_ROOM, REVISED]
"""The model's calls, one per turn: call_1 .. call_4, then it is done."""


@asynccontextmanager
async def booking_kernel(
    path: Path,
    hotel: Hotel,
    *,
    max_attempts: int = 5,
    pack: PolicyPack = BOOKING,
    model: str = "",
) -> AsyncIterator[Gate]:
    """A kernel with the booking pack (or ``pack``, a variant), the booker's session, its gate.

    A token of any model costs a cent (:data:`PRICES`); ``model`` names the gate's model.
    """
    config = KernelConfig(
        principal=LOCAL, ports=Ports(clock=ManualClock(), ids=SeededIds(29)), prices=PRICES
    )
    async with open_kernel(
        path, packs=[pack], adapters={"hotel": hotel}, allow=[AGENT], config=config
    ) as kernel:
        await kernel.handshake(
            Manifest(
                agent_id=AGENT,
                version="1.0.0",
                capabilities=["booking.reserve_room"],
                max_attempts=max_attempts,
            )
        )
        yield Gate(kernel, AGENT, BOOKING, model=model)


async def charged(kernel: Kernel) -> list[dict[str, int]]:
    """The tokens charged to each flow's reasoning, in journal order."""
    events = await kernel.journal.read(types=["ReasoningCharged"])
    return [dict(e.payload.tokens) for e in events if isinstance(e.payload, ev.ReasoningCharged)]


async def approve_all(kernel: Kernel) -> list[str]:
    """Approve, as the operator ana, every flow that waits for a human; return their DFIDs."""
    waiting = [flow.dfid for flow in kernel.flows(FlowStatus.ESCALATED)]
    for dfid in waiting:
        await kernel.decide(
            dfid,
            "approve",
            operator="ana",
            reason="fits the trip",
            action_hash=action_hash(kernel, dfid),
        )
        await kernel.await_decision(dfid)
    return waiting


async def created(kernel: Kernel, dfid: str) -> ev.FlowCreated:
    """The FlowCreated event of ``dfid``."""
    [event] = await kernel.journal.read(dfid=dfid, types=["FlowCreated"])
    assert isinstance(event.payload, ev.FlowCreated)
    return event.payload


async def proposals(kernel: Kernel) -> int:
    """The calls that reached the kernel: each opened a flow or was refused at the boundary.

    The governor's record of a stop on the conversation's flow (a SubmissionRefused in
    the tripping call's batch) is not a call; a refusal of a later call is, and says
    ``start a new conversation``.
    """
    events = await kernel.journal.read(types=["FlowCreated", "SubmissionRefused"])
    return sum(
        1
        for event in events
        if not isinstance(event.payload, ev.SubmissionRefused)
        or event.payload.reason_code is not ReasonCode.REASONING_EXHAUSTION
        or event.payload.detail.endswith("start a new conversation")
    )


async def suspend(kernel: Kernel, agent_id: str = AGENT) -> None:
    """Suspend ``agent_id``, as the operator ana."""
    await kernel.set_agent_status(agent_id, "SUSPENDED", operator="ana", reason="stop it")
