"""Keys and journals for the proof tests: a log key, a witness key, a kernel that signs."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from kernel import FlowStatus, Kernel
from kernel.core.keys import public_text, write_private_key
from kernel.core.ports import ManualClock, SeededIds
from kernel.proofs.signing import Signing
from tests.support.helpers import ScriptedAgent, kernel_for, transfer

_seeds = itertools.count(100)


class KeyFiles:
    """A private key file (mode 0600) and its public key in a file of its own."""

    def __init__(self, folder: Path, name: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.private = folder / f"{name}.pem"
        self.key = write_private_key(self.private)
        self.public_text = public_text(self.key)
        self.public = folder / f"{name}.pub"
        self.public.write_text(self.public_text + "\n")
        self.pem = self.private.read_text()


@asynccontextmanager
async def signing_kernel(
    path: Path, key: KeyFiles, *, clock: ManualClock | None = None, **kw: Any
) -> AsyncIterator[Kernel]:
    """A kernel on ``path`` that signs checkpoints with ``key`` (every 1 s of its clock)."""
    signing = kw.pop("signing", Signing(key_file=str(key.private)))
    # Fresh flow ids each run: a journal reopened (or regrown) never meets its own DFIDs.
    kw.setdefault("ids", SeededIds(next(_seeds)))
    async with kernel_for(path, clock=clock or ManualClock(), signing=signing, **kw) as kernel:
        yield kernel


async def run_flows(kernel: Kernel, amounts: list[int]) -> list[str]:
    """Close one transfer flow per amount; return their DFIDs."""
    await kernel.register(
        ScriptedAgent("clerk", [transfer(a) for a in amounts], subscriptions=["bank"])
    )
    dfids = []
    for _ in amounts:
        [dfid] = await kernel.trigger("bank.invoice")
        await kernel.wait_quiet()
        flow = kernel.flow(dfid)
        assert flow is not None and flow.status == FlowStatus.CLOSED
        dfids.append(dfid)
    return dfids
