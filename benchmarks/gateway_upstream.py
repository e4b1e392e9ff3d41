"""The MCP server P16.g puts behind the gateway: ``python -m benchmarks.gateway_upstream``.

One tool, ``lookup``, that answers at once over stdio: what the gateway adds is measured
against the same call made to this server bare.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("bench-upstream", log_level="WARNING")


@server.tool()
def lookup(quantity: int) -> str:
    """Answer at once."""
    return f"looked up {quantity}"


if __name__ == "__main__":
    server.run("stdio")
