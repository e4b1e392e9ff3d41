"""The example's upstream: a hotel's own MCP server, which knows nothing of dirk.

    python -m examples.frameworks._hotel_mcp    # stdio; the gateway starts it

``reserve_room`` takes an ``idempotency_key`` and honours it: one booking per key.
Its bookings are kept in the JSON file ``HOTEL_BOOKINGS`` names (the example reads
it to show that each booking was made once).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer

server = MCPServer("miramar-hotel", log_level="WARNING")


def _bookings() -> dict[str, Any]:
    path = Path(os.environ.get("HOTEL_BOOKINGS", "bookings.json"))
    found: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    return found


@server.tool()
def reserve_room(
    traveller: str,
    hotel: str,
    room_type: str,
    nights: int,
    nightly_rate_cents: int,
    idempotency_key: str,
) -> dict[str, Any]:
    """Reserve nights of a room of room_type at hotel for traveller (rates in cents)."""
    bookings = _bookings()
    if idempotency_key not in bookings:
        ref = f"MIR-{len(bookings) + 1:04d}"
        bookings[idempotency_key] = {"ref": ref, "traveller": traveller, "nights": nights}
        path = Path(os.environ.get("HOTEL_BOOKINGS", "bookings.json"))
        path.write_text(json.dumps(bookings, sort_keys=True))
    return {"ref": bookings[idempotency_key]["ref"]}


@server.tool()
def cancel_all() -> str:
    """Cancel every booking (the gateway's pack does not name this tool)."""
    Path(os.environ.get("HOTEL_BOOKINGS", "bookings.json")).write_text("{}")
    return "cancelled"


if __name__ == "__main__":
    server.run("stdio")
