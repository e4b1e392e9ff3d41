"""Free TCP ports for the servers the suite starts, one block of ports per xdist worker.

A port asked of the kernel (``bind(0)``) is free when asked but is released before the
server binds it: under ``pytest -n auto`` another worker asking at that moment may be handed
the same one (the kernel reuses ephemeral ports freely), and a second PostgreSQL or
nats-server then fails to start. So each worker (``PYTEST_XDIST_WORKER``, ``gw0``, ``gw1``...)
takes its ports from a block of its own, below the kernel's ephemeral range (Linux hands those
out from 32768 up, for outgoing connections as much as for ``bind(0)``), and checks each by
binding it. Outside xdist the kernel's ``bind(0)`` is used, as before. A server that can
report the port it took (``--port 0``: the console, ``dirk serve``) needs none of this.
"""

from __future__ import annotations

import itertools
import os
import socket

_FIRST = 10_000
"""Where the workers' blocks start: above the well-known and most registered ports."""
_BLOCK = 1_000
"""Ports per worker: 22 workers fit below the ephemeral range."""
_WORKERS = (32_768 - _FIRST) // _BLOCK

_next = itertools.count()
"""The offset of the next candidate in this worker's block (never one handed out before)."""


def worker_index() -> int | None:
    """This xdist worker's number (``gw3`` is 3), or None outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    digits = name.removeprefix("gw")
    return int(digits) if digits.isdigit() else None


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A 127.0.0.1 port no one listens on now, and no other worker of this run will be given.

    Each call in a worker moves on through its block (a port handed out once, to a server
    since stopped, may still be in TIME_WAIT), skipping ports something else holds.
    """
    index = worker_index()
    if index is None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])
    start = _FIRST + (index % _WORKERS) * _BLOCK
    # A different starting point per process: a run of the suite beside another (or a worker
    # restarted by xdist) does not walk the same ports in the same order.
    base = os.getpid() % _BLOCK
    for _ in range(_BLOCK):
        port = start + (base + next(_next)) % _BLOCK
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port in worker {index}'s block {start}-{start + _BLOCK - 1}")
