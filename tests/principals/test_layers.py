"""Layered policy: user x kind > user > kind > tier default; a named tier above ``*``."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from kernel.core.events import Layer, TenantPolicy
from kernel.core.reasons import ReasonCode
from kernel.dim._principal import layers, most_specific
from tests.principals.kit import ACME, ANN, BOB, call, people

R = ReasonCode
LEVELS = ("user_kinds", "users", "kinds", "tiers")
TIERS = ("interactive", "*")


def _policy(set_at: dict[tuple[str, str], str]) -> TenantPolicy:
    """A policy whose permission is set at the given (level, tier) places."""
    tiers: dict[str, Layer] = {}
    kinds: dict[str, dict[str, Layer]] = {}
    users: dict[str, dict[str, Layer]] = {}
    user_kinds: dict[str, dict[str, dict[str, Layer]]] = {}
    for (level, tier), value in set_at.items():
        layer = Layer(permission=value)
        if level == "tiers":
            tiers[tier] = layer
        elif level == "kinds":
            kinds.setdefault("k", {})[tier] = layer
        elif level == "users":
            users.setdefault("u", {})[tier] = layer
        else:
            user_kinds.setdefault("u", {}).setdefault("k", {})[tier] = layer
    return TenantPolicy(tiers=tiers, kinds=kinds, users=users, user_kinds=user_kinds)


@given(
    st.dictionaries(
        st.tuples(st.sampled_from(LEVELS), st.sampled_from(TIERS)),
        st.sampled_from(["allow", "flag", "deny"]),
    )
)
def test_the_most_specific_place_that_sets_a_value_wins(
    set_at: dict[tuple[str, str], str],
) -> None:
    _, got = most_specific(layers(_policy(set_at), "u", "k", "interactive"), "permission")
    order = [(level, tier) for level in LEVELS for tier in TIERS]
    expected = next((set_at[p] for p in order if p in set_at), None)
    assert got == expected
    # Another user, kind or tier never reads the layers it is not named in.
    _, other = most_specific(layers(_policy(set_at), "v", "j", "api"), "permission")
    assert other == set_at.get(("tiers", "*"))


def test_permission_and_rate_are_resolved_apart() -> None:
    policy = TenantPolicy(
        tiers={"*": Layer(permission="deny", rate_per_minute=5)},
        users={"u": {"*": Layer(permission="allow")}},
    )
    found = layers(policy, "u", "k", "api")
    assert most_specific(found, "permission") == ("user u, tier *", "allow")
    assert most_specific(found, "rate_per_minute") == ("tier default, tier *", 5)


async def test_layers_end_to_end(tmp_path: Path) -> None:
    async with people(tmp_path / "j.db") as kernel:
        await kernel.declare_tenant(ACME)
        await kernel.change_tenant_policy("acme", kind="people.look", permission="deny")
        denied = await call(kernel, "people.look", ANN)
        assert denied.reason_code is R.POLICY_DENIED and "kind people.look" in denied.detail
        # Ann's own layer on the kind is more specific than the kind's.
        await kernel.change_tenant_policy(
            "acme", user="ann", kind="people.look", permission="allow"
        )
        assert (await call(kernel, "people.look", ANN)).reason_code is None
        assert (await call(kernel, "people.look", BOB)).reason_code is R.POLICY_DENIED
        # A named tier is above ``*`` at the same level.
        await kernel.change_tenant_policy(
            "acme", tier="api", kind="people.look", permission="allow"
        )
        assert (await call(kernel, "people.look", BOB, tier="api")).reason_code is None
        # A flag escalates to a human, as any APPROVAL_REQUIRED does.
        await kernel.change_tenant_policy("acme", user="bob", permission="flag")
        flagged = await call(kernel, "people.look", BOB)
        assert str(flagged.verdict) == "ESCALATED"
        assert flagged.reason_code is R.APPROVAL_REQUIRED
