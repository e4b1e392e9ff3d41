"""Another process awaiting an MCP task: ``python mcp_task_poller.py URL TASK_ID``.

Prints the task's status as first read (one line), then, once it completes, the tool's
result as JSON (one line): what a client that did not make the call, or one restarted,
does with a task id it kept.
"""

from __future__ import annotations

import json
import sys

import anyio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from kernel.mcp import TaskClient, await_task, get_task


async def main(url: str, task_id: str) -> None:
    async with Client(streamable_http_client(url), extensions=[TaskClient()]) as client:
        first = await get_task(client.session, task_id)
        print(first.status, flush=True)
        result = await await_task(client.session, task_id, poll_s=0.05)
        print(json.dumps(result.model_dump(by_alias=True, mode="json")), flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
