"""The booking example's memory steps, taken by an agent through MCP tools against a running kernel.

The travel desk's story (examples/booking.py), with the agent in an MCP host
instead of hosted in the kernel: a booking that ignored access, the learned
constraint that names it, a refusal until memory is queried, the booking that
then goes through, and the counterfactual that shows the first would have been
refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.mcp_kernel import memory_kernel, require_mcp

require_mcp()

from mcp import Client  # noqa: E402

from examples.booking import LESSON, RATES  # noqa: E402
from kernel.mcp import Embedded, Identity, Principal, build_server  # noqa: E402
from kernel.testing import Faults, SimulatedSystem  # noqa: E402
from policies.booking import BOOKING  # noqa: E402


def room(kind: str) -> dict[str, Any]:
    return {
        "kind": "booking.reserve_room",
        "traveller": "ana",
        "hotel": "Miramar",
        "room_type": kind,
        "nights": 3,
        "nightly_rate_cents": RATES[kind],
        "accessible": kind == "accessible",
    }


async def call(c: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await c.call_tool(tool, args)
    assert result.structured_content is not None
    return dict(result.structured_content)


async def test_the_travel_desk_learns_through_mcp_tools(tmp_path: Path) -> None:
    hotel = SimulatedSystem(tmp_path / "hotel.db", seed=1, faults=Faults())
    try:
        async with memory_kernel(
            tmp_path / "j.db", BOOKING, allow=("travel-agent",), adapters={"hotel": hotel}
        ) as kernel:
            server = build_server(
                Embedded(kernel), Identity(Principal(role="agent", name="travel-agent"))
            )
            async with Client(server) as c:
                explain = "conference in Lisbon; great reviews"
                mistake = await call(c, "propose", policy=room("double"), explain=explain)
                assert mistake["verdict"] == "ACCEPTED"
                [submitted] = await kernel.journal.read(
                    dfid=mistake["dfid"], types=["ProposalSubmitted"]
                )
                learned = await call(
                    c,
                    "add_constraint",
                    text=LESSON,
                    priority="learned",
                    triggered_by=submitted.seq,
                    explain="ana uses a wheelchair and the Miramar room has steps",
                )
                assert learned["verdict"] == "ACCEPTED"
                blocked = await call(c, "propose", policy=room("accessible"), explain="rebook ana")
                assert blocked["verdict"] == "REJECTED"
                assert blocked["reason_code"] == "VERIFICATION_REQUIRED"
                checked = await call(c, "query_memory", topic="accessibility Miramar")
                assert checked["verdict"] == "ACCEPTED"
                booked = await call(c, "propose", policy=room("accessible"), explain="rebook ana")
                assert booked["verdict"] == "ACCEPTED" and booked["status"] == "CLOSED"
                context = await call(c, "get_memory_context")
                [constraint] = context["result"]["constraints"]
                assert constraint["text"] == LESSON and constraint["priority"] == "learned"
                replay = await call(
                    c, "simulate_timeline", constraint=LESSON, at=1, priority="learned"
                )
                changed = {change["dfid"] for change in replay["result"]["changes"]}
                assert mistake["dfid"] in changed
            assert len(hotel.effects()) == 2
    finally:
        hotel.close()
