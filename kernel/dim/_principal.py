"""The DIM's principal layer: on whose behalf a proposal is made, and may it be.

Runs right after ``schema`` (kernel.dim._gate) on journals whose fold rules know
principals (``KernelStarted.fold`` >= 3; older journals re-judge without it, as their
kernels did). It refuses, in this order (docs/identity.md):

1. PRINCIPAL_MISSING: the flow acts for nobody (``FlowCreated.on_behalf`` is None);
   PRINCIPAL_INVALID: it names no tenant or no user;
2. TENANT_NOT_MEMBER: the user is not a member of its declared tenant, or its tenant is
   not declared while some tenant is; DELEGATION_INVALID / CROSS_TENANT: the delegation
   the flow acts under is not this agent's, this user's, or this tenant's;
3. SCOPE_MISSING: a scope the kind requires is not the principal's (its membership in
   the tenant, intersected with the scopes its door claims); SCOPE_NOT_DELEGATED: a hop
   of the delegation chain did not hand it on;
4. POLICY_DENIED: the most specific policy layer that sets a permission denies (one that
   flags sends the call to a human: APPROVAL_REQUIRED, an escalation);
5. RATE_LIMITED: the most specific layer that sets a rate allows that many accepted calls
   per (tenant, user, tier) within any 60 s on the kernel's clock, and that many were.

Pure: a function of the recorded state (:class:`Behalf`), so replay judges alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kernel.core.events import (
    Delegated,
    Feedback,
    Layer,
    OnBehalf,
    Permission,
    Principal,
    TenantPolicy,
    TenantSpec,
)
from kernel.core.reasons import ReasonCode
from kernel.dim._judgement import Behalf, reject

LAYER = "principal"
_NO_POLICY = TenantPolicy()
"""The policy of a principal whose tenant is not declared: no layer (frozen, so shared)."""
MAX_DEPTH = 64
"""The longest delegation chain followed (a longer one is refused DELEGATION_INVALID)."""


def on_behalf_refusal(
    kind: str, scopes: Sequence[str], behalf: Behalf, *, rate: bool = True
) -> Feedback | None:
    """Return the layer's refusal, its escalation (APPROVAL_REQUIRED), or None.

    Args:
        kind: the policy kind proposed.
        scopes: the scopes the kind requires, all of them.
        behalf: what the flow acts under.
        rate: whether the rate window is checked (not on a recheck of a call already
            judged: it may be counted already).
    """
    on_behalf = behalf.on_behalf
    if on_behalf is None:
        return reject(
            LAYER,
            ReasonCode.PRINCIPAL_MISSING,
            "the flow acts on behalf of nobody: pass principal= or configure"
            " KernelConfig.principal",
            "on_behalf",
        )
    principal = on_behalf.principal
    if not principal.tenant or not principal.user:
        return reject(
            LAYER,
            ReasonCode.PRINCIPAL_INVALID,
            "a principal names a tenant and a user",
            "principal",
        )
    tenant = behalf.tenants.get(principal.tenant)
    refused = _membership(principal, tenant, behalf.tenants)
    if refused is not None:
        return refused
    hops = chain_of(on_behalf, behalf.agent_id, behalf.delegations)
    if isinstance(hops, Feedback):
        return hops
    member = tenant.members[principal.user].scopes if tenant is not None else None
    refused = _scopes(scopes, principal, member, hops)
    if refused is not None:
        return refused
    policy = tenant.policy if tenant is not None else TenantPolicy()
    return _policy(policy, principal.user, kind, on_behalf.tier, behalf.accepted, rate)


def _membership(
    principal: Principal, tenant: TenantSpec | None, tenants: Mapping[str, TenantSpec]
) -> Feedback | None:
    if tenant is None:
        if not tenants:
            return None  # no tenant declared: the host's vouched principal stands alone
        return reject(
            LAYER,
            ReasonCode.TENANT_NOT_MEMBER,
            f"tenant {principal.tenant!r} is not declared",
            "principal.tenant",
        )
    if principal.user not in tenant.members:
        return reject(
            LAYER,
            ReasonCode.TENANT_NOT_MEMBER,
            f"user {principal.user!r} is not a member of tenant {principal.tenant!r}",
            "principal.user",
        )
    return None


def chain_of(
    on_behalf: OnBehalf, agent_id: str, delegations: Mapping[str, Delegated]
) -> list[Delegated] | Feedback:
    """Return the delegations a flow acts under, first hop first; or why they do not hold."""
    hops: list[Delegated] = []
    wanted, to_agent = on_behalf.delegation, agent_id
    principal = on_behalf.principal
    while wanted:
        hop = delegations.get(wanted)
        if hop is None or len(hops) >= MAX_DEPTH or hop in hops:
            return _invalid(f"delegation {wanted!r} is not recorded (or its chain loops)")
        if hop.principal.tenant != principal.tenant:
            return reject(
                LAYER,
                ReasonCode.CROSS_TENANT,
                f"delegation {wanted!r} was made in tenant {hop.principal.tenant!r},"
                f" not {principal.tenant!r}",
                "on_behalf.delegation",
            )
        if hop.principal.user != principal.user:
            return _invalid(f"delegation {wanted!r} was made for another user")
        if hop.to_agent != to_agent:
            return _invalid(f"delegation {wanted!r} was handed to {hop.to_agent}, not {to_agent}")
        hops.append(hop)
        wanted, to_agent = hop.parent, hop.from_agent
    hops.reverse()
    return hops


def _invalid(detail: str) -> Feedback:
    return reject(LAYER, ReasonCode.DELEGATION_INVALID, detail, "on_behalf.delegation")


def effective_scopes(
    member: Iterable[str] | None, claimed: Iterable[str] | None, hops: Sequence[Delegated]
) -> frozenset[str] | None:
    """The scopes a call gets: the member's, the claimed ones and every hop's, intersected.

    None: unrestricted (no tenant declared, the door claims none and no delegation).
    """
    scopes = None if member is None else frozenset(member)
    for narrower in ([claimed] if claimed is not None else []) + [h.scopes for h in hops]:
        scopes = frozenset(narrower) if scopes is None else scopes & frozenset(narrower)
    return scopes


def _scopes(
    required: Sequence[str],
    principal: Principal,
    member: Sequence[str] | None,
    hops: Sequence[Delegated],
) -> Feedback | None:
    """SCOPE_MISSING for a scope the principal lacks (any of them), before any hop's."""
    own = effective_scopes(member, principal.scopes, ())
    for scope in required:
        if own is not None and scope not in own:
            lacking = member is not None and scope not in member
            whose = "its tenant grants it" if lacking else "its door claims"
            return reject(
                LAYER,
                ReasonCode.SCOPE_MISSING,
                f"user {principal.user!r} lacks scope {scope!r}: not among the scopes {whose}",
                "principal.scopes",
                limit=scope,
            )
    for hop in hops:
        for scope in required:
            if scope not in hop.scopes:
                return reject(
                    LAYER,
                    ReasonCode.SCOPE_NOT_DELEGATED,
                    f"scope {scope!r} was not handed on by delegation {hop.delegation!r}"
                    f" ({hop.from_agent} -> {hop.to_agent})",
                    "on_behalf.delegation",
                    hop.delegation,
                    scope,
                )
    return None


def layers(policy: TenantPolicy, user: str, kind: str, tier: str) -> list[tuple[str, Layer]]:
    """The policy layers that apply to a call, most specific first, each with its name."""
    if not (policy.tiers or policy.kinds or policy.users or policy.user_kinds):
        return []  # no layer at all (an undeclared tenant's): no name to build
    of_user_kind = policy.user_kinds.get(user, {}).get(kind, {})
    levels = (
        (f"user {user} x kind {kind}", of_user_kind),
        (f"user {user}", policy.users.get(user, {})),
        (f"kind {kind}", policy.kinds.get(kind, {})),
        ("tier default", policy.tiers),
    )
    found: list[tuple[str, Layer]] = []
    for name, by_tier in levels:
        for t in (tier, "*"):
            layer = by_tier.get(t)
            if layer is not None:
                found.append((f"{name}, tier {t}", layer))
    return found


def most_specific(found: Sequence[tuple[str, Layer]], field: str) -> tuple[str, Any]:
    """The first layer of ``found`` that sets ``field``, and its value (("", None): none)."""
    for name, layer in found:
        value = getattr(layer, field)
        if value is not None:
            return name, value
    return "", None


def _policy(
    policy: TenantPolicy, user: str, kind: str, tier: str, accepted: int, rate: bool
) -> Feedback | None:
    found = layers(policy, user, kind, tier)
    where, permission = most_specific(found, "permission")
    if permission == Permission.DENY or (
        permission is not None and permission not in set(Permission)
    ):
        return reject(
            LAYER,
            ReasonCode.POLICY_DENIED,
            f"{kind} is denied for user {user!r} by the policy layer {where}",
            "kind",
            where,
            permission,
        )
    limit_at, limit = most_specific(found, "rate_per_minute")
    if rate and limit is not None and accepted >= limit:
        return reject(
            LAYER,
            ReasonCode.RATE_LIMITED,
            f"user {user!r} made {accepted} accepted call(s) as {tier} within 60 s;"
            f" the limit is {limit} per minute (policy layer {limit_at})",
            "",
            limit_at,
            limit,
        )
    if permission == Permission.FLAG:
        return reject(
            LAYER,
            ReasonCode.APPROVAL_REQUIRED,
            f"{kind} for user {user!r} needs a human's approval (policy layer {where})",
            "kind",
            where,
            permission,
        )
    return None
