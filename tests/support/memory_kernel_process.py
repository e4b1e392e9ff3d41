"""A kernel with the memory pack in its own process: ``-m tests.support.memory_kernel_process DB``.

It allows the agent ``ide``, polls the operator inbox every 50 ms on the system
clock, prints ``ready`` once open, and stops when its stdin closes.
"""

from __future__ import annotations

import sys

import anyio

from kernel import MEMORY_PACK, open_kernel
from kernel.config import KernelConfig, Supervision
from tests.support.principals import LOCAL


async def run(db: str) -> None:
    config = KernelConfig(principal=LOCAL, supervision=Supervision(inbox_poll_s=0.05))
    async with open_kernel(db, packs=[MEMORY_PACK], adapters={}, allow=["ide"], config=config):
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)


if __name__ == "__main__":
    anyio.run(run, sys.argv[1])
