"""The kernel seen from MCP hosts: an MCP server (the optional extra ``dir-kernel[mcp]``).

Importing this package imports the ``mcp`` SDK (over a second); ``import kernel``
never does. :func:`build_server` gives the server over a backend:
:class:`Embedded` beside a running kernel, or :class:`Follower` over a journal
whose kernel runs in another process. :class:`Identity` says who calls: the
principal the command line set (stdio) or one per bearer token (HTTP, see
:mod:`kernel.mcp._http`). ``dirk mcp`` serves it (kernel/cli/_mcp.py).
"""

from kernel.mcp._backend import Embedded, Follower, Principal, Settled, ToolRefused
from kernel.mcp._rules import watch_rules
from kernel.mcp._server import build_server
from kernel.mcp._tasks import TASKS, TaskClient, await_task, cancel_task, get_task
from kernel.mcp._tools import Answer, Identity

__all__ = [
    "TASKS",
    "Answer",
    "Embedded",
    "Follower",
    "Identity",
    "Principal",
    "Settled",
    "TaskClient",
    "ToolRefused",
    "await_task",
    "build_server",
    "cancel_task",
    "get_task",
    "watch_rules",
]
