"""The principals tests' small domain: kinds that need scopes, agents, one call."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

from kernel import Kernel
from kernel.api.decisions import Decision
from kernel.core.events import Member, Principal, TenantSpec
from kernel.policy import PolicyKind, PolicyPack
from kernel.testing import ManualClock
from tests.support.helpers import ScriptedAgent, kernel_for


class Pay(PolicyKind, tag="people.pay"):
    """A payment: needs ``pay`` and ``read``."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "bank"
    scopes: ClassVar[tuple[str, ...]] = ("pay", "read")

    account: str
    amount_cents: int


class Look(PolicyKind, tag="people.look"):
    """A read: needs ``read``."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "bank"
    scopes: ClassVar[tuple[str, ...]] = ("read",)
    read_only: ClassVar[bool] = True

    account: str


class Ping(PolicyKind, tag="people.ping"):
    """Needs no scope at all."""

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "bank"

    n: int


PEOPLE = PolicyPack(name="people", version="1.0.0", kinds=(Pay, Look, Ping))
KINDS = ("people.pay", "people.look", "people.ping")
AGENTS = ("front", "helper", "worker", "other")

ANN = Principal(tenant="acme", user="ann", email="ann@acme.test")
BOB = Principal(tenant="acme", user="bob")
EVE = Principal(tenant="globex", user="eve")

ACME = TenantSpec(
    id="acme",
    members={
        "ann": Member(email="ann@acme.test", scopes=["pay", "read"]),
        "bob": Member(scopes=["read"]),
    },
)
GLOBEX = TenantSpec(id="globex", members={"eve": Member(scopes=["pay", "read"])})

_n = itertools.count(1)


@asynccontextmanager
async def people(
    path: Path, *, clock: ManualClock | None = None, **kw: Any
) -> AsyncIterator[Kernel]:
    """A kernel with the people pack, vouching for nobody, its agents registered."""
    async with kernel_for(
        path, packs=[PEOPLE], allow=AGENTS, clock=clock or ManualClock(), principal=None, **kw
    ) as kernel:
        for agent in AGENTS:
            await kernel.register(ScriptedAgent(agent, capabilities=KINDS))
        yield kernel


async def call(
    kernel: Kernel,
    kind: str = "people.pay",
    principal: Principal | None = None,
    *,
    agent: str = "front",
    **kw: Any,
) -> Decision:
    """Propose one ``kind`` as ``agent`` for ``principal``; fresh parameters each time."""
    n = next(_n)
    choices: dict[str, dict[str, Any]] = {
        "people.pay": {"account": f"acc-{n}", "amount_cents": n},
        "people.look": {"account": f"acc-{n}"},
        "people.ping": {"n": n},
    }
    params = choices[kind]
    return await kernel.propose(
        agent, kind, params, explain="test", confidence=0.9, principal=principal, **kw
    )


def codes(decisions: Sequence[Decision]) -> list[str | None]:
    """The reason codes of ``decisions`` (None: executed)."""
    return [str(d.reason_code) if d.reason_code is not None else None for d in decisions]
