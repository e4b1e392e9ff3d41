"""The domains a Projections folds, as registered: registering one is adding it to DOMAINS.

See :mod:`kernel.state.domain` for what a domain is; :class:`kernel.state.projections.Projections`
builds each in this order, and refuses two that save one field or serve one adapter.
"""

from __future__ import annotations

from collections.abc import Sequence

from kernel.state.artifacts import Artifacts
from kernel.state.beliefs.domain import Beliefs
from kernel.state.budgets import Budgets
from kernel.state.domain import Domain, DomainType, Saved
from kernel.state.drift import Drift
from kernel.state.grants import Grants
from kernel.state.memory import Memory, Rules
from kernel.state.principals import Principals
from kernel.state.quorums import Quorums
from kernel.state.reservations import Reservations
from kernel.state.roadmap.domain import Roadmap
from kernel.state.shadows import Shadows

DOMAINS: tuple[DomainType, ...] = (
    Reservations,
    Memory,
    Rules,
    Beliefs,
    Artifacts,
    Roadmap,
    Quorums,
    Grants,
    Budgets,
    Principals,
    Drift,
    Shadows,
)
"""The registered domains, in order: every Projections folds them, the DIM runs their
checks in this order, the kernel builds their executors. Registering one is adding it here."""


def unique(*shares: Sequence[Saved]) -> tuple[Saved, ...]:
    """Return the saved fields of every share, refusing a name saved twice."""
    fields = tuple(field for share in shares for field in share)
    names = [field.name for field in fields]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"saved-state fields declared twice: {', '.join(twice)}")
    return fields


def one_executor_each(domains: Sequence[Domain]) -> None:
    """Refuse two domains that provide an executor for the same adapter."""
    names = [adapter for domain in domains for adapter in domain.executors()]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"adapters provided by two domains: {', '.join(twice)}")
