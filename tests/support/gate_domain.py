"""A small shop domain for the DIM's pipeline tests: one kind, every layer in use."""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from kernel import AgentStatus, Manifest
from kernel.core.events import ProposalRecord
from kernel.policy import PolicyKind, PolicyPack
from kernel.policy.packs import Consume, LimitSpec, Threshold
from kernel.policy.rules import ALLOW, OneOf, RuleVerdict, StateMatch, View, deny, rule
from kernel.state.projections import AgentView


class Buy(PolicyKind, tag="shop.buy"):
    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = "shop"

    sku: str
    qty: int
    price: str


@rule(Buy, fields=("qty",))
def qty_cap(view: View) -> RuleVerdict:
    """No more than the agent's ``max_qty`` units per order."""
    limit = int(view.limits["max_qty"])
    if view.params.qty > limit:
        return deny(f"qty {view.params.qty} is above {limit}", field="qty", limit=limit)
    return ALLOW


SHOP = PolicyPack(
    name="shop",
    version="1.0.0",
    kinds=(Buy,),
    escalate_below_confidence=0.5,
    invariants=(
        OneOf(Buy, "sku", frozenset({"A", "B", "C"})),
        StateMatch(Buy, "price", "shop.{sku}.price", max_drift_bps=50),
    ),
    rules=(qty_cap,),
    consumes=(Consume(Buy, "inventory:{sku}", "qty"),),
    capacities={"inventory:*": 10},
    thresholds=(Threshold(Buy, amount="qty", above=8),),
    limits={"max_qty": LimitSpec(default=9, floor=0, ceiling=20)},
)

NOW = 1_000
STATE = {"shop.A.price": "10.00", "shop.B.price": "20.00", "shop.D.price": "1.00"}


def agent(
    status: AgentStatus = AgentStatus.ACTIVE,
    capabilities: tuple[str, ...] = ("shop.buy",),
    limits: dict[str, Any] | None = None,
) -> AgentView:
    manifest = Manifest(
        agent_id="buyer", version="1.0", capabilities=list(capabilities), limits=limits or {}
    )
    return AgentView(manifest=manifest, status=status, session_hash="s", registered_seq=1)


def proposal(**changes: Any) -> ProposalRecord:
    params = {"sku": "A", "qty": 2, "price": "10.00"}
    params.update(changes.pop("params", {}))
    base = ProposalRecord(
        kind="shop.buy",
        params=params,
        version="1.0",
        confidence=0.9,
        valid_until_ns=2_000,
        context_ref="ref",
    )
    return msgspec.structs.replace(base, **changes)
