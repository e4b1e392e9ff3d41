"""Delegation only narrows: along a chain of any depth, no hop widens what a call may do."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.core.events import Delegated, Member, OnBehalf, Principal, TenantSpec
from kernel.core.reasons import ReasonCode
from kernel.dim._judgement import Behalf
from kernel.dim._principal import effective_scopes, on_behalf_refusal
from tests.principals.kit import ACME, ANN, call, people

R = ReasonCode
SCOPES = ("a", "b", "c", "d", "e")
scope_sets = st.lists(st.sampled_from(SCOPES), unique=True)


def _chain(who: Principal, hops: list[list[str]]) -> dict[str, Delegated]:
    """Delegations ag0 -> ag1 -> ... handing on ``hops[i]`` at hop i."""
    delegations: dict[str, Delegated] = {}
    parent = ""
    for i, scopes in enumerate(hops):
        key = f"d{i}"
        delegations[key] = Delegated(
            delegation=key,
            principal=who,
            from_agent=f"ag{i}",
            to_agent=f"ag{i + 1}",
            scopes=scopes,
            parent=parent,
            chain=[f"ag{j}" for j in range(i + 2)],
        )
        parent = key
    return delegations


@settings(max_examples=300)
@given(
    member=scope_sets,
    claimed=st.none() | scope_sets,
    hops=st.lists(scope_sets, min_size=1, max_size=8),
    required=scope_sets,
)
def test_no_hop_widens_and_the_intersection_is_exact(
    member: list[str], claimed: list[str] | None, hops: list[list[str]], required: list[str]
) -> None:
    who = Principal(tenant="t", user="u", scopes=claimed)
    delegations = _chain(who, hops)
    tenant = TenantSpec(id="t", members={"u": Member(scopes=member)})
    chain = list(delegations.values())
    got = effective_scopes(member, claimed, chain)
    expected = set(member) & (set(claimed) if claimed is not None else set(SCOPES))
    for scopes in hops:
        expected &= set(scopes)
    assert got == frozenset(expected)
    # Never wider than any hop, than the member's grant, than the door's claim.
    assert got is not None
    assert all(got <= set(h) for h in hops) and got <= set(member)
    assert claimed is None or got <= set(claimed)
    # The layer allows exactly the kinds whose every scope is in the intersection.
    last = f"d{len(hops) - 1}"
    behalf = Behalf(
        on_behalf=OnBehalf(principal=who, tier="subagent", delegation=last),
        agent_id=f"ag{len(hops)}",
        tenants={"t": tenant},
        delegations=delegations,
    )
    refused = on_behalf_refusal("k", required, behalf)
    assert (refused is None) == set(required).issubset(expected)
    if refused is not None:
        assert refused.layer == "principal"
        assert refused.reason_code in (R.SCOPE_MISSING, R.SCOPE_NOT_DELEGATED)
        missing_own = not set(required) <= (
            set(member) & (set(claimed) if claimed is not None else set(SCOPES))
        )
        assert (refused.reason_code is R.SCOPE_MISSING) == missing_own


@given(hops=st.lists(scope_sets, min_size=1, max_size=5), cut=st.integers(0, 4))
def test_a_chain_not_handed_to_the_calling_agent_is_refused(
    hops: list[list[str]], cut: int
) -> None:
    who = Principal(tenant="t", user="u")
    delegations = _chain(who, hops)
    last = f"d{min(cut, len(hops) - 1)}"
    behalf = Behalf(
        on_behalf=OnBehalf(principal=who, delegation=last),
        agent_id="somebody-else",
        tenants={},
        delegations=delegations,
    )
    refused = on_behalf_refusal("k", (), behalf)
    assert refused is not None and refused.reason_code is R.DELEGATION_INVALID


async def test_a_three_hop_chain_end_to_end(tmp_path: Path) -> None:
    async with people(tmp_path / "j.db") as kernel:
        await kernel.declare_tenant(ACME)  # ann: pay, read
        await kernel.delegate(ANN, from_agent="front", to_agent="helper", scopes=["pay", "read"])
        # helper hands on; the parent is found (the latest handed to helper for ann).
        await kernel.delegate(ANN, from_agent="helper", to_agent="worker", scopes=["read", "x"])
        third = await kernel.delegate(
            ANN, from_agent="worker", to_agent="other", scopes=["pay", "read"]
        )
        # worker had only ``read``: other gets no ``pay`` whatever third hands on.
        pay = await call(kernel, "people.pay", ANN, agent="other", tier="subagent")
        assert pay.reason_code is R.SCOPE_NOT_DELEGATED and "worker" in pay.detail
        look = await call(kernel, "people.look", ANN, agent="other", tier="subagent")
        assert look.reason_code is None
        [created] = [
            e for e in await kernel.journal.read(types=["FlowCreated"]) if e.dfid == look.dfid
        ]
        on_behalf = created.payload.on_behalf  # type: ignore[union-attr]
        assert on_behalf is not None
        assert on_behalf.delegation == third
        assert on_behalf.chain == ["front", "helper", "worker", "other"]
