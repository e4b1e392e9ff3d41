"""``python -m kernel.mesh.executor --bus URL --adapter NAME --key KEY module:factory``.

``factory()`` returns the real adapter (anything with ``async execute(intent) ->
Receipt`` that deduplicates on ``intent.key``). The process takes the
adapter's intents from ``dirk.intents.NAME`` and publishes their results, each
signed with the executors' key (``--key`` or ``DIRK_EXECUTOR_KEY``: a PEM file only
its owner may read, made by ``python -m kernel.mesh.config key PATH``); the kernel uses
``kernel.mesh.RemoteAdapter(URL, NAME, executor_key=PUBLIC)`` in place of the adapter.
``--ca`` (or ``DIRK_BUS_CA``) names the CA file of a server that speaks TLS.
"""

from __future__ import annotations

import argparse
import logging
import os
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio

from kernel.core.keys import KeyUnusable, load_private_key
from kernel.mesh._executor import _load, serve_executor


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernel.mesh.executor", description=__doc__)
    parser.add_argument("--bus", default=os.environ.get("DIRK_BUS"), help="the NATS URL")
    parser.add_argument("--adapter", required=True, help="the adapter's name in the kernel")
    parser.add_argument(
        "--ack-wait", type=float, default=30.0, help="seconds before a held intent is redelivered"
    )
    parser.add_argument(
        "--key", default=os.environ.get("DIRK_EXECUTOR_KEY"), help="the executors' key file"
    )
    parser.add_argument("--ca", default=os.environ.get("DIRK_BUS_CA"), help="the bus's CA file")
    parser.add_argument("factory", metavar="module:factory")
    args = parser.parse_args(argv)
    if not args.bus:
        parser.error("--bus (or DIRK_BUS) names the kernel's NATS server")
    if not args.key:
        parser.error("--key (or DIRK_EXECUTOR_KEY) names the executors' key file")
    try:
        key = load_private_key(Path(args.key))
    except KeyUnusable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tls = ssl.create_default_context(cafile=args.ca) if args.ca else None
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    adapter = _load(args.factory)

    async def run() -> None:
        ready = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: serve_executor(
                    args.bus,
                    args.adapter,
                    adapter,
                    key=key,
                    tls=tls,
                    ack_wait_s=args.ack_wait,
                    ready=ready,
                )
            )
            await ready.wait()
            print("READY", flush=True)

    anyio.run(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
