"""Any MCP client, governed: ``dirk mcp proxy`` in front of a hotel's own MCP server, offline.

    python -m examples.frameworks.mcp_proxy [--db trip.db] [--json]

The hotel's server (examples/frameworks/_hotel_mcp.py) knows nothing of dirk. The
gateway's side is the TOML file below and one call (``open_gateway``, what
``dirk mcp proxy --config FILE`` runs); the client is the MCP SDK's, scripted like
the other frameworks' models: four rooms, one refused over the agent's limit and
revised, the revision approved by an operator (the example plays her), one with a
room type that does not exist. Then the client resumes a call it already made (the
booking is not made twice) and calls a tool the pack does not name.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp_types import CallToolResult, TextContent

from examples.frameworks._scene import AGENT, CONVERSATION, flow_tree, next_call, operator_approves
from kernel import KernelConfig, Principal
from kernel.audit import redact
from kernel.gateway import (
    CALL_META,
    CONVERSATION_META,
    open_gateway,
    read_config,
    write_listing,
)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """\
max_attempts = 3

[upstreams.hotel]                      # the hotel's MCP server, over stdio
command = [{python}, "-m", "examples.frameworks._hotel_mcp"]
env = {{ HOTEL_BOOKINGS = {bookings}, PYTHONPATH = {root} }}

[tools."hotel.reserve_room"]           # its schema is the hotel's; the rules are ours
one_of = {{ room_type = ["single", "double", "suite", "accessible"] }}
min = {{ nights = 1, nightly_rate_cents = 0 }}
max = {{ nights = 30 }}
limit = {{ nightly_rate_cents = "max_nightly_rate" }}
approve_above = {{ nightly_rate_cents = 40_000 }}

[limits.max_nightly_rate]
default = 60_000
floor = 0
ceiling = 100_000
"""
TOOL = "hotel_reserve_room"
PACK_FILE = """\
from pathlib import Path

from kernel.gateway import pack_of

PACK = pack_of(Path({workdir}) / "gateway.toml", Path({workdir}) / "listing.json")
"""


def shown(result: CallToolResult) -> str:
    """One line of what the client saw: the verdict, then the answer's text."""
    verdict = (result.meta or {}).get("dirk/verdict", "?")
    text = " ".join(b.text for b in result.content if isinstance(b, TextContent))
    text = " ".join(text.split())
    return text if text.startswith(verdict) else f"{verdict} {text}"


async def play(db: Path, workdir: Path) -> dict[str, Any]:
    """Run the scripted client through the gateway; return what it saw and what happened."""
    bookings = workdir / "bookings.json"
    config_file = workdir / "gateway.toml"
    config_file.write_text(
        CONFIG.format(
            python=json.dumps(sys.executable),
            bookings=json.dumps(str(bookings)),
            root=json.dumps(str(ROOT)),
        )
    )
    config = read_config(config_file)
    seen: list[str] = []
    # This host vouches for one local user: every governed call acts on their behalf.
    me = KernelConfig(principal=Principal(tenant="local", user="you"))
    async with (
        open_gateway(config, db, agents=[AGENT], kernel_config=me) as gateway,
        Client(gateway.server) as c,
    ):
        # What the pack was made from, for `dirk verify --verdicts --pack gateway_pack.py:PACK`.
        write_listing(workdir / "listing.json", gateway.listed)
        (workdir / "gateway_pack.py").write_text(PACK_FILE.format(workdir=json.dumps(str(workdir))))
        while (call := next_call(seen)) is not None:
            call_id, args = call
            keys = {CONVERSATION_META: CONVERSATION, CALL_META: call_id}
            result = await c.call_tool(TOOL, args, meta=keys)  # type: ignore[arg-type]
            if (result.meta or {}).get("dirk/verdict") == "ESCALATED":
                dfid = (result.meta or {})["dirk/dfid"]
                print(f"{call_id}: {shown(result)[:72]}...")
                await operator_approves(gateway.kernel)  # the console, `dirk decide`, MCP
                result = await c.call_tool("wait_flow", {"dfid": dfid, "timeout_s": 30})
            seen.append(shown(result))
        resumed = await c.call_tool(
            TOOL,
            next_call([])[1],  # type: ignore[index]
            meta={CONVERSATION_META: CONVERSATION, CALL_META: "call_1"},  # type: ignore[arg-type]
        )
        unnamed = await c.call_tool("hotel_cancel_all", {})
        tree = flow_tree(gateway.kernel)
    made = json.loads(bookings.read_text()) if bookings.exists() else {}
    print("what the client saw:")
    for n, output in enumerate(seen, 1):
        print(f"  call_{n}: {output}")
    replayed = (resumed.meta or {}).get("dirk/replayed")
    print(f"  call_1 again: {shown(resumed)} (answered from the record: {replayed})")
    print(f"  hotel_cancel_all: {shown(unnamed)}")
    print("flow tree:")
    for line in tree:
        print(f"  {line}")
    print(f"the hotel made {len(made)} bookings")
    return {
        "outputs": seen,
        "executed": sum(o.startswith("EXECUTED") for o in seen),
        "bookings": len(made),
        "replayed": bool(replayed),
        "flows": len(tree),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the example: ``--db`` (a fresh file by default) and ``--json``."""
    p = argparse.ArgumentParser(prog="python -m examples.frameworks.mcp_proxy")
    p.add_argument("--db", help="journal file (default: a fresh temporary file)")
    p.add_argument("--json", action="store_true", help="print a summary as JSON on the last line")
    args = p.parse_args(argv)
    db = Path(args.db) if args.db else Path(tempfile.mkdtemp(prefix="dirk-")) / "mcp_proxy.db"
    workdir = db.with_name(f"{db.stem}.gateway")
    for taken in (db, workdir):
        if taken.exists():
            print(f"error: {taken} exists; pick a new --db path", file=sys.stderr)
            return 2
    workdir.mkdir(parents=True)
    print(f"mcp_proxy: four rooms -> {redact(str(db))}", file=sys.stderr)
    summary = anyio.run(play, db, workdir)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    ok = summary["executed"] == 2 and summary["bookings"] == 2 and summary["replayed"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
