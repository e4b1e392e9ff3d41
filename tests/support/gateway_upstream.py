"""A small MCP server the gateway's tests put behind it: it counts every call it carries out.

``python gateway_upstream.py`` serves stdio; ``--http`` serves streamable HTTP on a
free 127.0.0.1 port and prints ``port N`` on stdout once bound. Every call of a
tool appends one JSON line (the tool and its arguments) to the file ``UPSTREAM_LOG``
names, so a test counts what the upstream really did. ``UPSTREAM_PID`` names a
file the server writes its pid to (a test SIGKILLs it).

Tools: ``add_note`` (no idempotency key), ``transfer`` (takes ``idempotency_key``
and honours it: a repeated key answers the first receipt, no second effect),
``delete_all`` (a tool the tests' pack does not name), ``fail`` (answers
``isError``), ``hang`` (takes as long as it is told), ``die`` (SIGKILLs its own
process mid-call), ``garbage`` (writes a line that is not JSON-RPC on stdout,
then never answers).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("upstream", log_level="WARNING")
_receipts: dict[str, str] = {}


def _log(tool: str, args: dict[str, Any]) -> int:
    """Append one line for a call carried out; return how many calls of ``tool`` there were."""
    path = Path(os.environ["UPSTREAM_LOG"])
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"tool": tool, "args": args}, ensure_ascii=True) + "\n")
        f.flush()
    lines = path.read_text(encoding="utf-8").splitlines()
    return sum(1 for line in lines if json.loads(line)["tool"] == tool)


@server.tool()
def add_note(text: str, tag: str = "misc") -> str:
    """Add a note with a tag."""
    n = _log("add_note", {"text": text, "tag": tag})
    return f"note {n}: {text}"


@server.tool()
def transfer(amount_cents: int, to: str, idempotency_key: str) -> dict[str, Any]:
    """Transfer an amount in cents to an account; one transfer per idempotency key."""
    if idempotency_key not in _receipts:
        n = _log("transfer", {"amount_cents": amount_cents, "to": to, "key": idempotency_key})
        _receipts[idempotency_key] = f"tx-{n}"
    return {"tx": _receipts[idempotency_key], "amount_cents": amount_cents, "to": to}


@server.tool()
def delete_all() -> str:
    """Delete every note."""
    _log("delete_all", {})
    return "deleted"


@server.tool()
def fail(why: str) -> str:
    """Always refuses, saying why."""
    _log("fail", {"why": why})
    raise ToolError(f"refused: {why}")


@server.tool()
def hang(seconds: int) -> str:
    """Take ``seconds`` to answer."""
    _log("hang", {"seconds": seconds})
    time.sleep(seconds)
    return "woke"


@server.tool()
def die() -> str:
    """SIGKILL this server in the middle of the call (it logs the call first)."""
    _log("die", {})
    os.kill(os.getpid(), signal.SIGKILL)
    return "never"


@server.tool()
def garbage() -> str:
    """Write a line that is no JSON-RPC on stdout, and never answer."""
    _log("garbage", {})
    sys.stdout.write("this is not JSON-RPC {{{\n")
    sys.stdout.flush()
    time.sleep(3600)
    return "never"


def main() -> None:
    pid_file = os.environ.get("UPSTREAM_PID")
    if pid_file:
        Path(pid_file).write_text(str(os.getpid()))
    if "--http" not in sys.argv:
        server.run("stdio")
        return
    import anyio
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    print(f"port {sock.getsockname()[1]}", flush=True)
    app = server.streamable_http_app(stateless_http=True, host="127.0.0.1")
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    anyio.run(uvicorn.Server(config).serve, [sock])


if __name__ == "__main__":
    main()
