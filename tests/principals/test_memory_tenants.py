"""Memory is per tenant: a tenant's facts and constraints are its own; shared ones bind all.

What a flow writes to memory carries the tenant it acts for (``FactAdded.tenant``,
``ConstraintAdded.tenant``); a constraint binds that tenant's proposals only, a fact is
shown to that tenant's flows only, and memory written for no tenant stays shared.
Replays judge the same.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec

from kernel import DecisionVerdict, Kernel, ReasonCode
from kernel.audit import open_journal
from kernel.audit.reverify import rejudge
from kernel.core.events import ConstraintAdded, FactAdded, Principal
from kernel.memory import MEMORY_PACK
from kernel.state.constraints import ConstraintRecord
from kernel.state.memory import FactRecord
from kernel.testing import ManualClock
from tests.principals.kit import ACME, ANN, EVE, GLOBEX, KINDS, PEOPLE
from tests.support.helpers import ScriptedAgent, kernel_for

MEMORY_KINDS = ("memory.add_fact", "memory.add_constraint", "memory.query")


@asynccontextmanager
async def remembering(path: Path) -> AsyncIterator[Kernel]:
    """The people pack and memory, two tenants declared, vouching for nobody."""
    async with kernel_for(
        path, packs=[PEOPLE, MEMORY_PACK], allow=["front"], clock=ManualClock(), principal=None
    ) as kernel:
        await kernel.register(ScriptedAgent("front", capabilities=(*KINDS, *MEMORY_KINDS)))
        await kernel.declare_tenant(ACME)
        await kernel.declare_tenant(GLOBEX)
        yield kernel


async def act(kernel: Kernel, who: Principal | None, kind: str, **params: Any) -> Any:
    return await kernel.propose(
        "front", kind, params, explain="the test", confidence=0.9, principal=who
    )


async def pay(kernel: Kernel, who: Principal, account: str) -> Any:
    return await act(kernel, who, "people.pay", account=account, amount_cents=5)


async def test_a_tenants_constraint_binds_its_own_proposals_only(tmp_path: Path) -> None:
    async with remembering(tmp_path / "j.db") as kernel:
        added = await act(kernel, ANN, "memory.add_constraint", text="avoid acc-frozen")
        assert added.verdict is DecisionVerdict.EXECUTED
        [event] = await kernel.journal.read(types=["ConstraintAdded"])
        assert isinstance(event.payload, ConstraintAdded) and event.payload.tenant == "acme"
        refused = await pay(kernel, ANN, "acc-frozen")
        assert refused.reason_code is ReasonCode.CONSTRAINT_VIOLATION
        other = await pay(kernel, EVE, "acc-frozen")
        assert other.verdict is DecisionVerdict.EXECUTED


async def test_a_tenants_facts_are_seen_by_its_flows_only(tmp_path: Path) -> None:
    async with remembering(tmp_path / "j.db") as kernel:
        await act(kernel, ANN, "memory.add_fact", name="vip", value="acme pays first")
        await act(kernel, EVE, "memory.add_fact", name="vip", value="globex pays last")
        memory = kernel.projections.memory
        assert {n: f.value for n, f in memory.facts_of("acme").items()} == {
            "vip": "acme pays first"
        }
        assert {n: f.value for n, f in memory.facts_of("globex").items()} == {
            "vip": "globex pays last"
        }
        assert memory.facts_of("") == {}  # nobody's flow sees no tenant's fact
        assert memory.view()["facts"] == {}  # nor does a view for no tenant
        found = await act(kernel, EVE, "memory.query", topic="vip")
        assert found.verdict is DecisionVerdict.EXECUTED
        [queried] = await kernel.journal.read(types=["MemoryQueried"])
        assert queried.payload.facts == ["vip"]  # type: ignore[union-attr]
        facts = await kernel.journal.read(types=["FactAdded"])
        assert [e.payload.tenant for e in facts if isinstance(e.payload, FactAdded)] == [
            "acme",
            "globex",
        ]


async def test_memory_written_for_no_tenant_is_shared(tmp_path: Path) -> None:
    async with kernel_for(
        tmp_path / "j.db", packs=[PEOPLE, MEMORY_PACK], allow=["front"], clock=ManualClock()
    ) as kernel:  # the host vouches for its one local user, in a tenant nobody declared
        await kernel.register(ScriptedAgent("front", capabilities=(*KINDS, *MEMORY_KINDS)))
        await act(kernel, None, "memory.add_fact", name="desk", value="open")
        [event] = await kernel.journal.read(types=["FactAdded"])
        assert isinstance(event.payload, FactAdded) and event.payload.tenant == ""
        for tenant in ("", "local", "acme"):
            assert kernel.projections.memory.facts_of(tenant)["desk"].value == "open"


async def test_tenant_memory_rejudges_as_recorded(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with remembering(db) as kernel:
        await act(kernel, ANN, "memory.add_constraint", text="avoid acc-frozen")
        await act(kernel, EVE, "memory.add_constraint", text="avoid acc-cold")
        for who in (ANN, EVE):
            for account in ("acc-frozen", "acc-cold"):
                await pay(kernel, who, account)
    async with open_journal(db, readonly=True) as journal:
        result = await rejudge(journal, [PEOPLE, MEMORY_PACK])
        rejected = await journal.read(types=["ProposalRejected"])
    assert len(rejected) == 2
    assert result.changes == [] and result.mismatches == []


def test_old_memory_digests_are_unchanged() -> None:
    # A fact and a constraint of no tenant encode as before tenants existed.
    fact = FactRecord(value="v", confidence="1", seq=1, agent_id="a", correlation_id="")
    rule = ConstraintRecord(
        seq=2, text="never x", priority="required", triggered_by=None, agent_id="a",
        correlation_id="",
    )  # fmt: skip
    assert "tenant" not in msgspec.to_builtins(fact)
    assert "tenant" not in msgspec.to_builtins(rule)
