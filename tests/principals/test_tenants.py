"""Who a call is for, end to end: no principal, membership, scopes, tenants kept apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel.api.principals import DelegationInvalid
from kernel.core.events import FlowCreated, Member, Principal, TenantSpec
from kernel.core.reasons import ReasonCode
from tests.principals.kit import (
    ACME,
    AGENTS,
    ANN,
    BOB,
    EVE,
    GLOBEX,
    KINDS,
    PEOPLE,
    call,
    codes,
    people,
)
from tests.support.helpers import ScriptedAgent, kernel_for

R = ReasonCode


async def _on_behalf(kernel: object, dfid: str) -> object:
    events = await kernel.journal.read(types=["FlowCreated"])  # type: ignore[attr-defined]
    [created] = [e for e in events if e.dfid == dfid]
    assert isinstance(created.payload, FlowCreated)
    return created.payload.on_behalf


async def test_a_call_for_nobody_is_refused_on_record(tmp_path: Path) -> None:
    async with people(tmp_path / "j.db") as kernel:
        refused = await call(kernel, "people.ping")
        assert refused.reason_code is R.PRINCIPAL_MISSING
        assert "nobody" in refused.detail
        assert await _on_behalf(kernel, refused.dfid) is None
        # The same call for someone runs (no tenant declared: the vouched principal alone).
        assert (await call(kernel, "people.ping", ANN)).reason_code is None


async def test_the_flow_records_whom_it_acts_for(tmp_path: Path) -> None:
    async with people(tmp_path / "j.db") as kernel:
        done = await call(kernel, "people.ping", ANN, tier="api")
        behalf = await _on_behalf(kernel, done.dfid)
        assert behalf is not None
        assert behalf.principal == ANN and behalf.tier == "api"  # type: ignore[attr-defined]
        assert behalf.chain == [] and behalf.delegation == ""  # type: ignore[attr-defined]


async def test_the_host_principal_acts_for_a_call_that_names_none(tmp_path: Path) -> None:
    host = Principal(tenant="local", user="me", scopes=["read"])
    async with kernel_for(
        tmp_path / "j.db", packs=[PEOPLE], allow=AGENTS, principal=host
    ) as kernel:
        await kernel.register(ScriptedAgent("front", capabilities=KINDS))
        # Its claimed scopes are all it gets while no tenant is declared.
        assert (await call(kernel, "people.look")).reason_code is None
        missing = await call(kernel, "people.pay")
        assert missing.reason_code is R.SCOPE_MISSING and "'pay'" in missing.detail


async def test_a_bad_principal_or_tier_is_refused_at_the_wall(tmp_path: Path) -> None:
    async with people(tmp_path / "j.db") as kernel:
        bad = await call(kernel, "people.ping", "ann")  # type: ignore[arg-type]
        assert bad.reason_code is R.PRINCIPAL_INVALID and bad.field == "principal"
        nameless = await call(kernel, "people.ping", Principal(tenant="acme", user=""))
        assert nameless.reason_code is R.PRINCIPAL_INVALID
        tier = await call(kernel, "people.ping", ANN, tier="boss")
        assert tier.reason_code is R.SCHEMA_INVALID and tier.field == "tier"


async def test_members_and_non_members(tmp_path: Path) -> None:
    async with people(tmp_path / "j.db") as kernel:
        await kernel.declare_tenant(ACME, reason="onboarding")
        assert (await call(kernel, "people.pay", ANN)).reason_code is None
        stranger = await call(kernel, "people.ping", Principal(tenant="acme", user="mallory"))
        assert stranger.reason_code is R.TENANT_NOT_MEMBER and "mallory" in stranger.detail
        # A tenant nobody declared, once some tenant is: not a member of anything.
        assert (await call(kernel, "people.ping", EVE)).reason_code is R.TENANT_NOT_MEMBER
        # Bob is a member, but his tenant does not grant him ``pay``.
        bob = await call(kernel, "people.pay", BOB)
        assert bob.reason_code is R.SCOPE_MISSING
        # A user naming a tenant it is not a member of (ann in globex) is refused.
        await kernel.declare_tenant(GLOBEX)
        ann_in_globex = Principal(tenant="globex", user="ann")
        assert (await call(kernel, "people.ping", ann_in_globex)).reason_code is (
            R.TENANT_NOT_MEMBER
        )
        assert (await call(kernel, "people.pay", EVE)).reason_code is None


async def test_the_door_claims_narrow_the_tenant_grant(tmp_path: Path) -> None:
    async with people(tmp_path / "j.db") as kernel:
        await kernel.declare_tenant(ACME)
        narrow = Principal(tenant="acme", user="ann", scopes=["read"])
        assert (await call(kernel, "people.look", narrow)).reason_code is None
        refused = await call(kernel, "people.pay", narrow)
        assert refused.reason_code is R.SCOPE_MISSING and "door claims" in refused.detail
        # Claiming more than the tenant grants gets nothing more.
        wide = Principal(tenant="acme", user="bob", scopes=["pay", "read"])
        assert (await call(kernel, "people.pay", wide)).reason_code is R.SCOPE_MISSING


async def test_a_revocation_applies_at_the_next_call(tmp_path: Path) -> None:
    async with people(tmp_path / "j.db") as kernel:
        await kernel.declare_tenant(ACME)
        assert (await call(kernel, "people.pay", ANN)).reason_code is None
        await kernel.change_tenant_policy("acme", user="ann", scopes=["read"], reason="revoke")
        assert (await call(kernel, "people.pay", ANN)).reason_code is R.SCOPE_MISSING
        assert (await call(kernel, "people.look", ANN)).reason_code is None


async def test_same_agent_names_under_different_users_stay_apart(tmp_path: Path) -> None:
    both = TenantSpec(
        id="acme",
        members={"ann": Member(scopes=["pay", "read"]), "bob": Member(scopes=["pay", "read"])},
    )
    bob = Principal(tenant="acme", user="bob")
    async with people(tmp_path / "j.db") as kernel:
        await kernel.declare_tenant(both)
        # Ann hands ``helper`` only ``read``; Bob hands it ``pay`` and ``read``.
        await kernel.delegate(ANN, from_agent="front", to_agent="helper", scopes=["read"])
        await kernel.delegate(bob, from_agent="front", to_agent="helper", scopes=["pay", "read"])
        for_ann = await call(kernel, "people.pay", ANN, agent="helper")
        for_bob = await call(kernel, "people.pay", bob, agent="helper")
        assert codes([for_ann, for_bob]) == ["SCOPE_NOT_DELEGATED", None]
        ann_flow = await _on_behalf(kernel, for_ann.dfid)
        bob_flow = await _on_behalf(kernel, for_bob.dfid)
        assert ann_flow.delegation != bob_flow.delegation  # type: ignore[attr-defined]
        assert ann_flow.chain == bob_flow.chain == ["front", "helper"]  # type: ignore[attr-defined]


async def test_a_delegation_is_checked_before_it_is_recorded(tmp_path: Path) -> None:
    async with people(tmp_path / "j.db") as kernel:
        await kernel.declare_tenant(ACME)
        await kernel.declare_tenant(GLOBEX)
        first = await kernel.delegate(ANN, from_agent="front", to_agent="helper", scopes=["read"])
        before = kernel.journal.head_seq
        with pytest.raises(DelegationInvalid) as wrong_agent:
            await kernel.delegate(ANN, from_agent="worker", to_agent="other", parent=first)
        assert wrong_agent.value.reason_code is R.DELEGATION_INVALID
        with pytest.raises(DelegationInvalid) as other_user:
            await kernel.delegate(BOB, from_agent="helper", to_agent="other", parent=first)
        assert other_user.value.reason_code is R.DELEGATION_INVALID
        with pytest.raises(DelegationInvalid) as other_tenant:
            await kernel.delegate(EVE, from_agent="helper", to_agent="other", parent=first)
        assert other_tenant.value.reason_code is R.CROSS_TENANT
        with pytest.raises(DelegationInvalid):
            await kernel.delegate(ANN, from_agent="helper", to_agent="other", parent="dlg-x")
        assert kernel.journal.head_seq == before  # nothing recorded


async def test_a_call_naming_another_agents_delegation_is_refused(tmp_path: Path) -> None:
    async with people(tmp_path / "j.db") as kernel:
        await kernel.declare_tenant(ACME)
        handed = await kernel.delegate(ANN, from_agent="front", to_agent="helper", scopes=["read"])
        refused = await call(kernel, "people.look", ANN, agent="worker", delegation=handed)
        assert refused.reason_code is R.DELEGATION_INVALID
        bob = await call(kernel, "people.look", BOB, agent="helper", delegation=handed)
        assert bob.reason_code is R.DELEGATION_INVALID
