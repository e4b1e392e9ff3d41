"""A kernel that answers calls through an outage, then is SIGKILLed before the store returns.

Usage: ``outage_worker.py URL SPOOL COUNT``. Prints ``ready`` once its tenant is
declared (fail-open), waits until the journal's store is unreachable (the test stops
the server), makes COUNT calls (read-only and write kinds, alternately) and prints
each as a JSON line, then ``spooled``, and kills itself with SIGKILL: the spool holds
the calls and the journal none of them.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import anyio

from kernel.journal.outage import StoreState
from tests.failmode.kernels import Desk, declare, fail_mode_kernel, lookup, pay


async def main(url: str, spool: str, count: int) -> None:
    async with fail_mode_kernel(url, spool, Desk(), seed=21) as kernel:
        await declare(kernel, "open")
        print("ready", flush=True)
        await kernel.journal.store.until(StoreState.UNREACHABLE)
        for i in range(count):
            decision = await (lookup(kernel, f"acc-{i}") if i % 2 == 0 else pay(kernel, i + 1))
            print(json.dumps({"dfid": decision.dfid, "verdict": decision.verdict}), flush=True)
        print("spooled", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
