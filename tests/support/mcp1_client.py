"""An mcp 1.x client (run by a Python that has ``mcp<2``): ``python mcp1_client.py DB PYTHON``.

It launches ``PYTHON -m kernel mcp --db DB --kernel --agent ide`` over stdio,
calls add_fact and get_memory_context, and prints what came back as one JSON line.
"""

import json
import sys

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main(db: str, python: str) -> None:
    params = StdioServerParameters(
        command=python, args=["-m", "kernel", "mcp", "--db", db, "--kernel", "--agent", "ide"]
    )
    # mypy reads the mcp 2.x installed here; this runs under mcp 1.x, whose names are
    # camelCase (hence the three coded ignores below).
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        fact = await session.call_tool("add_fact", {"name": "lang", "value": "python"})
        memory = await session.call_tool("get_memory_context", {})
        print(
            json.dumps(
                {
                    "protocol": init.protocolVersion,  # type: ignore[attr-defined]
                    "fact": fact.structuredContent,  # type: ignore[attr-defined]
                    "memory": memory.structuredContent,  # type: ignore[attr-defined]
                }
            )
        )


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
