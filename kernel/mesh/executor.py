"""``python -m kernel.mesh.executor --bus URL --adapter NAME module:factory``: run an executor.

``factory()`` returns the real adapter (anything with ``async execute(intent) ->
Receipt`` that deduplicates on ``intent.key``). The process takes the
adapter's intents from ``dirk.intents.NAME`` and publishes their results; the
kernel uses ``kernel.mesh.RemoteAdapter(URL, NAME)`` in place of the adapter.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

import anyio

from kernel.mesh._executor import _load, serve_executor


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernel.mesh.executor", description=__doc__)
    parser.add_argument("--bus", default=os.environ.get("DIRK_BUS"), help="the NATS URL")
    parser.add_argument("--adapter", required=True, help="the adapter's name in the kernel")
    parser.add_argument(
        "--ack-wait", type=float, default=30.0, help="seconds before a held intent is redelivered"
    )
    parser.add_argument("factory", metavar="module:factory")
    args = parser.parse_args(argv)
    if not args.bus:
        parser.error("--bus (or DIRK_BUS) names the kernel's NATS server")
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    adapter = _load(args.factory)

    async def run() -> None:
        ready = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: serve_executor(
                    args.bus, args.adapter, adapter, ack_wait_s=args.ack_wait, ready=ready
                )
            )
            await ready.wait()
            print("READY", flush=True)

    anyio.run(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
