"""The kernel the fail-mode tests run: a read-only kind, a write kind, a tenant, a spool.

Used in process by the tests and in a subprocess by ``outage_worker.py``.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from kernel import Decision, Kernel, KernelConfig, Manifest, open_kernel
from kernel.adapters import ExecutionIntent, Receipt
from kernel.config import Ports, Storage
from kernel.core.events import (
    FailMode,
    Member,
    Principal,
    TenantPolicy,
    TenantSpec,
)
from kernel.policy import PolicyKind, PolicyPack
from kernel.testing import ManualClock, SeededIds

AGENT = "clerk"
TENANT = "acme"
USER = "ana"


class Lookup(PolicyKind, tag="fm.lookup"):
    """Reads a balance: the pack marks it read-only, so a fail-open tenant may run it."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "desk"
    read_only: ClassVar[bool] = True

    account: str


class Pay(PolicyKind, tag="fm.pay"):
    """Moves money: never run without the journal."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "desk"

    account: str
    amount_cents: int


PACK = PolicyPack(name="fm", version="1.0.0", kinds=(Lookup, Pay))


class Desk:
    """The system the calls reach: it counts what it was asked to do."""

    def __init__(self) -> None:
        self.calls: list[ExecutionIntent] = []
        self._ids = itertools.count(1)

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        self.calls.append(intent)
        return Receipt(external_id=f"d-{next(self._ids)}", detail={})


@contextlib.asynccontextmanager
async def fail_mode_kernel(
    url: str,
    spool: str,
    desk: Desk,
    *,
    grace_s: float = 0.0,
    probe_s: float = 1.0,
    seed: int = 5,
) -> AsyncIterator[Kernel]:
    """A kernel on ``url`` acting for ana at acme, its spool at ``spool``, the clerk's session."""
    config = KernelConfig(
        ports=Ports(clock=ManualClock(), ids=SeededIds(seed)),
        storage=Storage(outage_grace_s=grace_s, outage_probe_s=probe_s, spool=spool),
        principal=Principal(tenant=TENANT, user=USER, scopes=None),
    )
    async with open_kernel(
        url, packs=[PACK], adapters={"desk": desk}, allow=[AGENT], config=config
    ) as kernel:
        await kernel.handshake(
            Manifest(
                agent_id=AGENT,
                version="1.0.0",
                capabilities=["fm.lookup", "fm.pay"],
                subscriptions=["fm"],
            )
        )
        yield kernel


async def declare(kernel: Kernel, fail_mode: str) -> None:
    """Declare acme with ana a member and ``fail_mode`` (recorded as the host would)."""
    spec = TenantSpec(
        id=TENANT,
        members={USER: Member(scopes=[])},
        policy=TenantPolicy(fail_mode=FailMode(fail_mode)),
    )
    await kernel.declare_tenant(spec, reason="the fail-mode tests")


async def lookup(kernel: Kernel, account: str = "acc-1") -> Decision:
    return await kernel.propose(
        AGENT, "fm.lookup", {"account": account}, explain="read it", confidence=0.9
    )


async def pay(kernel: Kernel, amount: int = 100) -> Decision:
    params: dict[str, Any] = {"account": "acc-1", "amount_cents": amount}
    return await kernel.propose(AGENT, "fm.pay", params, explain="pay it", confidence=0.9)
