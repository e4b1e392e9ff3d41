"""On whose behalf a call is made, at the API: the principal a flow records, delegations.

:func:`on_behalf_of` builds what a flow opened by ``Kernel.propose`` records
(``FlowCreated.on_behalf``): the call's own principal or else the one the host vouches
for (``KernelConfig.principal``), the agent's tier, and the delegation the agent acts
under (the one the call names, else the latest handed to this agent for this tenant
and user) with its chain. Nothing is judged here: the DIM's principal layer judges
the recorded flow (kernel.dim._principal), so replay judges alike.

:class:`Delegations` records ``Delegated``: an agent hands a task to another for one
principal, with the scopes it hands on; a delegation names the one its ``from_agent``
acts under (its parent), so a chain of any depth is recorded hop by hop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import msgspec

from kernel.core import wall
from kernel.core.events import Delegated, OnBehalf, Principal, Tier
from kernel.core.ports import IdSource
from kernel.core.reasons import ReasonCode
from kernel.core.wall import InputInvalid
from kernel.state.principals import Principals
from kernel.state.projections import Projections

_TIERS = frozenset(t.value for t in Tier)


class DelegationInvalid(Exception):
    """A delegation the kernel refused (nothing recorded), with its reason code."""

    def __init__(self, detail: str, reason_code: ReasonCode = ReasonCode.DELEGATION_INVALID):
        super().__init__(f"{reason_code}: {detail}")
        self.reason_code = reason_code
        self.detail = detail


def checked_principal(principal: object, field: str = "principal") -> Principal:
    """Return ``principal`` if it is one, or raise InputInvalid (PRINCIPAL_INVALID)."""
    if not isinstance(principal, Principal):
        raise _invalid_principal(field, "a principal is a kernel.core.events.Principal")
    if not principal.tenant or not principal.user:
        raise _invalid_principal(field, "a principal names a tenant and a user")
    try:  # text the journal can hold (no lone surrogate, bounded), as every door's input
        wall.check_value(msgspec.to_builtins(principal), field)
    except InputInvalid as exc:
        raise _invalid_principal(exc.field, exc.detail) from None
    return principal


def _invalid_principal(field: str, detail: str) -> InputInvalid:
    exc = InputInvalid(field, detail)
    exc.reason_code = ReasonCode.PRINCIPAL_INVALID
    return exc


def on_behalf_of(
    projections: Projections,
    default: Principal | None,
    agent_id: str,
    principal: object = None,
    tier: object = Tier.INTERACTIVE,
    delegation: object = None,
) -> OnBehalf | None:
    """Return what a flow of ``agent_id`` records of whom it acts for (None: nobody).

    Raises:
        InputInvalid: the principal, tier or delegation is not of its type.
    """
    _check_call(tier, delegation)
    who = checked_principal(principal) if principal is not None else default
    if who is None:
        return None
    domain = projections.domain(Principals)
    chosen = (
        delegation
        if isinstance(delegation, str)
        else domain.latest_for(who.tenant, who.user, agent_id)
    )
    hop = domain.delegations.get(chosen) if chosen else None
    chain = list(hop.chain) if hop is not None else []
    return OnBehalf(principal=who, tier=str(tier), chain=chain, delegation=chosen or "")


def _check_call(tier: object, delegation: object) -> None:
    if not isinstance(tier, str) or tier not in _TIERS:
        raise InputInvalid("tier", f"a tier is one of {', '.join(sorted(_TIERS))}")
    if delegation is not None and not isinstance(delegation, str):
        raise InputInvalid("delegation", "a delegation is named by its id")


class Delegations:
    """Records delegations (``Kernel.delegate``).

    Args:
        record: records ``Delegated`` (through the DIM, in order with its verdicts).
        projections: the delegations recorded so far (a parent is checked there).
        ids: a delegation's id.
    """

    def __init__(
        self,
        record: Callable[[Delegated], Awaitable[object]],
        projections: Projections,
        ids: IdSource,
    ) -> None:
        self._record = record
        self._projections = projections
        self._ids = ids

    async def delegate(
        self,
        principal: object,
        *,
        from_agent: str,
        to_agent: str,
        task: str = "",
        scopes: Iterable[str] = (),
        parent: str | None = None,
    ) -> str:
        """Record that ``from_agent`` hands a task to ``to_agent`` for ``principal``.

        ``parent`` is the delegation ``from_agent`` acts under; None: the latest one
        handed to ``from_agent`` for this tenant and user, if any (a direct delegation
        otherwise). The scopes a call under it gets are the principal's, intersected
        with every hop's ``scopes`` (the DIM computes them when it judges).

        Returns:
            The delegation's id.

        Raises:
            InputInvalid: a field of the wrong type.
            DelegationInvalid: DELEGATION_INVALID (the parent is unknown, another
                principal's, or was not handed to ``from_agent``), CROSS_TENANT (the
                parent was made in another tenant).
        """
        who = checked_principal(principal)
        handed = _checked_handing(from_agent, to_agent, task, scopes)
        domain = self._projections.domain(Principals)
        if parent is None:
            parent = domain.latest_for(who.tenant, who.user, from_agent)
        chain = [from_agent, to_agent]
        if parent:
            above = _check_parent(domain.delegations.get(parent), parent, who, from_agent)
            chain = [*above.chain, to_agent]
        delegation = f"dlg-{self._ids.new_dfid()}"
        recorded = Delegated(
            delegation=delegation,
            principal=who,
            from_agent=from_agent,
            to_agent=to_agent,
            task=task,
            scopes=sorted(set(handed)),
            parent=parent or "",
            chain=chain,
        )
        await self._record(recorded)
        return delegation


def _checked_handing(
    from_agent: object, to_agent: object, task: object, scopes: object
) -> list[str]:
    """Return the scopes handed on, once the delegation's fields are of their types."""
    for field, value in (("from_agent", from_agent), ("to_agent", to_agent), ("task", task)):
        if not isinstance(value, str) or (field != "task" and not value):
            raise InputInvalid(field, "a non-empty string" if field != "task" else "a string")
    handed = [scopes] if isinstance(scopes, str) else list(scopes)  # type: ignore[call-overload]
    if not all(isinstance(s, str) and s for s in handed):
        raise InputInvalid("scopes", "scopes are non-empty strings")
    return handed


def _check_parent(
    above: Delegated | None, parent: str, who: Principal, from_agent: str
) -> Delegated:
    if above is None:
        raise DelegationInvalid(f"no delegation {parent!r} is recorded")
    if above.principal.tenant != who.tenant:
        raise DelegationInvalid(
            f"delegation {parent!r} was made in tenant {above.principal.tenant!r}",
            ReasonCode.CROSS_TENANT,
        )
    if above.principal.user != who.user:
        raise DelegationInvalid(f"delegation {parent!r} was made for another user")
    if above.to_agent != from_agent:
        raise DelegationInvalid(
            f"delegation {parent!r} was handed to {above.to_agent}, not {from_agent}"
        )
    return above
