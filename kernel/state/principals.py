"""On whose behalf: tenants, delegations, and the calls each user made, as a domain.

The principals domain folds what the DIM's principal layer (kernel.dim._principal)
judges against, from recorded events only (docs/identity.md):

- the tenants as declared (TenantDeclared replaces a tenant's whole spec) and as
  changed one policy layer at a time (TenantPolicyChanged; its ``scopes`` replaces
  one member's scopes);
- the delegations (Delegated), and for each (tenant, user, agent) the latest one
  handed to that agent: a later call by it acts under that one unless it names another;
- whom each open flow acts for (``FlowCreated.on_behalf``), so the layer and the rate
  window find it by DFID; a flow that ends leaves;
- the accepted calls per (tenant, user, tier) within the last 60 seconds, at the times
  their ProposalAccepted was recorded: the sliding rate window. Refusals never count.

Every field is left out of the digest while empty, so a journal that never used
principals (every journal before them) keeps its checkpoints' hashes.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any, cast

import msgspec

from kernel.core.events import (
    Delegated,
    Event,
    FlowAborted,
    FlowClosed,
    FlowCompensated,
    FlowCreated,
    Layer,
    Member,
    OnBehalf,
    Payload,
    ProposalAccepted,
    TenantDeclared,
    TenantPolicyChanged,
    TenantSpec,
)
from kernel.state.domain import OMIT, Domain, Fold, Saved, State

WINDOW_NS = 60 * 1_000_000_000
"""The rate window: 60 seconds on the kernel's clock."""

_SEP = "\x1f"


def key_of(*parts: str) -> str:
    """The key of a (tenant, user[, tier or agent]) in the saved state's maps."""
    return _SEP.join(parts)


def tenant_of(projections: State, dfid: str) -> str:
    """Return the tenant open flow ``dfid`` acts for ("" for none, or a flow not open)."""
    domain = projections.domain(Principals)
    behalf = domain.on_behalf.get(dfid) or domain.staging.get(dfid)
    return behalf.principal.tenant if behalf is not None else ""


def memory_tenant(projections: State, dfid: str) -> str:
    """Return the tenant whose memory open flow ``dfid`` writes ("": shared memory).

    A declared tenant's flows write its own; a flow for no tenant, or for one nobody
    declared (a host embedding the kernel for its one user), writes shared memory.
    """
    tenant = tenant_of(projections, dfid)
    return tenant if tenant in projections.domain(Principals).tenants else ""


def rate_key(on_behalf: OnBehalf) -> str:
    """The key of a flow's rate window: its (tenant, user, tier)."""
    who = on_behalf.principal
    return key_of(who.tenant, who.user, on_behalf.tier)


class PrincipalsState(msgspec.Struct, frozen=True, kw_only=True):
    """What the domain keeps (plain data: a snapshot stores it as is)."""

    tenants: dict[str, TenantSpec] = {}
    delegations: dict[str, Delegated] = {}
    latest: dict[str, str] = {}
    """key_of(tenant, user, agent) -> the latest delegation handed to that agent."""
    behalf: dict[str, OnBehalf] = {}
    """Open flows' DFID -> whom they act for."""
    calls: dict[str, list[int]] = {}
    """key_of(tenant, user, tier) -> the times of accepted calls within the window."""


def copied(state: PrincipalsState) -> PrincipalsState:
    """Return a copy later folds leave alone (the records are frozen; the maps are not)."""
    return PrincipalsState(
        tenants=dict(state.tenants),
        delegations=dict(state.delegations),
        latest=dict(state.latest),
        behalf=dict(state.behalf),
        calls={key: list(times) for key, times in state.calls.items()},
    )


class Principals(Domain):
    """Tenants, delegations, flows' principals and rate windows (saved as ``principals``)."""

    name = "principals"

    def __init__(self, projections: State | None = None) -> None:
        self.state = PrincipalsState()
        self._unsorted: set[str] = set()
        """Rate windows whose times are not in order (a clock set back): counted by a scan.
        The others are sorted, so a window is cut and counted by bisection, not a scan of
        every call in it (derived from the state, never saved)."""
        self.staging: dict[str, OnBehalf] = {}
        """Whom flows act for that the DIM judges in the append that opens them (a call's
        one commit, a synchronous agent's carried batch), until their FlowCreated is folded:
        a domain's check sees the tenant replay sees. Never saved; the DIM sets it."""

    def folds(self) -> Mapping[type[Payload], Fold]:
        return {
            TenantDeclared: self._declared,
            TenantPolicyChanged: self._changed,
            Delegated: self._delegated,
            FlowCreated: self._created,
            ProposalAccepted: self._accepted,
            FlowClosed: self._ended,
            FlowAborted: self._ended,
            FlowCompensated: self._ended,
        }

    def saved(self) -> Sequence[Saved]:
        return (
            Saved(
                name="principals",
                type=PrincipalsState,
                get=lambda: self.state,
                load=self._load,
                copy=copied,
                canonical=_unless_empty,
                default=PrincipalsState(),
            ),
        )

    def _load(self, state: PrincipalsState) -> None:
        self.state = copied(state)
        self._unsorted = {key for key, times in self.state.calls.items() if not _in_order(times)}

    # --- reading ----------------------------------------------------------------

    @property
    def on_behalf(self) -> dict[str, OnBehalf]:
        """Open flows' DFID -> whom they act for."""
        return self.state.behalf

    @property
    def tenants(self) -> dict[str, TenantSpec]:
        """The declared tenants, by id."""
        return self.state.tenants

    @property
    def delegations(self) -> dict[str, Delegated]:
        """Every recorded delegation, by id."""
        return self.state.delegations

    def accepted_within(self, key: str, now_ns: int) -> int:
        """Return the accepted calls of rate window ``key`` within 60 s before ``now_ns``."""
        return self.count(key, now_ns)

    def count(self, key: str, now_ns: int) -> int:
        """Return the accepted calls of ``key`` within the window ending at ``now_ns``."""
        since = now_ns - WINDOW_NS
        times = self.state.calls.get(key, ())
        if key in self._unsorted:
            return sum(1 for ts in times if ts > since)
        return len(times) - bisect_right(times, since)

    def latest_for(self, tenant: str, user: str, agent: str) -> str:
        """Return the latest delegation handed to ``agent`` for (tenant, user), or ""."""
        return self.state.latest.get(key_of(tenant, user, agent), "")

    # --- folding ----------------------------------------------------------------

    def fold_payload(self, payload: Payload) -> None:
        """Fold a principals act that needs no event around it (a staged copy's)."""
        match payload:
            case TenantDeclared():
                self.state.tenants[payload.tenant.id] = payload.tenant
            case TenantPolicyChanged():
                spec = self.state.tenants.get(payload.tenant, TenantSpec(id=payload.tenant))
                self.state.tenants[payload.tenant] = changed(spec, payload)
            case Delegated():
                self.state.delegations[payload.delegation] = payload
                who = payload.principal
                self.state.latest[key_of(who.tenant, who.user, payload.to_agent)] = (
                    payload.delegation
                )

    def _declared(self, event: Event) -> None:
        self.fold_payload(event.payload)

    def _changed(self, event: Event) -> None:
        self.fold_payload(event.payload)

    def _delegated(self, event: Event) -> None:
        self.fold_payload(event.payload)

    def _created(self, event: Event) -> None:
        behalf = cast(FlowCreated, event.payload).on_behalf
        if event.dfid:
            self.staging.pop(event.dfid, None)
        if behalf is not None and event.dfid:
            self.state.behalf[event.dfid] = behalf

    def _accepted(self, event: Event) -> None:
        behalf = self.state.behalf.get(event.dfid or "")
        if behalf is None:
            return
        who = behalf.principal
        key = key_of(who.tenant, who.user, behalf.tier)
        since = event.ts - WINDOW_NS
        times = self._window(key, since)
        if times and event.ts < times[-1]:
            self._unsorted.add(key)
        times.append(event.ts)
        calls = self.state.calls
        calls[key] = times
        if len(calls) > 1:  # this key's last call is now: only another's may have lapsed
            for other in [k for k, v in calls.items() if v and v[-1] <= since]:
                del calls[other]

    def _window(self, key: str, since: int) -> list[int]:
        """The calls of ``key`` after ``since``, in the order they came: in a sorted window
        a suffix (cut in place), in another the ones a scan keeps."""
        times = self.state.calls.get(key, [])
        if key not in self._unsorted:
            del times[: bisect_right(times, since)]
            return times
        kept = [ts for ts in times if ts > since]
        if _in_order(kept):
            self._unsorted.discard(key)
        return kept

    def _ended(self, event: Event) -> None:
        self.state.behalf.pop(event.dfid or "", None)


def _in_order(times: Sequence[int]) -> bool:
    return all(a <= b for a, b in itertools.pairwise(times))


def changed(spec: TenantSpec, change: TenantPolicyChanged) -> TenantSpec:
    """Return ``spec`` with the one layer ``change`` names set (and a member's scopes)."""
    policy = spec.policy
    tiers, kinds = dict(policy.tiers), dict(policy.kinds)
    users, user_kinds = dict(policy.users), dict(policy.user_kinds)
    tier = change.tier or "*"
    if change.user and change.kind:
        by_kind = dict(user_kinds.get(change.user, {}))
        by_kind[change.kind] = _set(by_kind.get(change.kind, {}), tier, change)
        user_kinds[change.user] = by_kind
    elif change.user:
        users[change.user] = _set(users.get(change.user, {}), tier, change)
    elif change.kind:
        kinds[change.kind] = _set(kinds.get(change.kind, {}), tier, change)
    else:
        tiers = _set(tiers, tier, change)
    members = spec.members
    if change.scopes is not None and change.user:
        members = dict(members)
        member = members.get(change.user, Member())
        members[change.user] = msgspec.structs.replace(member, scopes=list(change.scopes))
    new_policy = msgspec.structs.replace(
        policy, tiers=tiers, kinds=kinds, users=users, user_kinds=user_kinds
    )
    return msgspec.structs.replace(spec, members=members, policy=new_policy)


def _set(layers: Mapping[str, Layer], tier: str, change: TenantPolicyChanged) -> dict[str, Layer]:
    out = dict(layers)
    layer = out.get(tier, Layer())
    if change.permission is not None:
        layer = msgspec.structs.replace(layer, permission=change.permission)
    if change.rate_per_minute is not None:
        layer = msgspec.structs.replace(layer, rate_per_minute=change.rate_per_minute)
    out[tier] = layer
    return out


def _unless_empty(state: PrincipalsState) -> Any:
    if not (state.tenants or state.delegations or state.behalf or state.calls):
        return OMIT
    return msgspec.to_builtins(
        {
            "tenants": dict(sorted(state.tenants.items())),
            "delegations": dict(sorted(state.delegations.items())),
            "latest": dict(sorted(state.latest.items())),
            "behalf": dict(sorted(state.behalf.items())),
            "calls": dict(sorted(state.calls.items())),
        }
    )
