"""Policy kinds: the typed proposals agents make, with their impact and when they need a human.

A policy kind is a msgspec Struct tagged with its kind name (the ``kind``
field on the wire) and carrying a ``version`` and the name of the adapter
that executes it. Packs (:mod:`kernel.policy.packs`) group kinds by domain.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import ClassVar, dataclass_transform

import msgspec

from kernel.core.reasons import ReasonCode


class Impact(StrEnum):
    """How much an escalated action can hurt: declared by the pack, never by the agent."""

    LOW_IMPACT = "LOW_IMPACT"
    """Reversible or informational: approving it takes one decision."""
    HIGH_IMPACT = "HIGH_IMPACT"
    """Financial or irreversible: approving it takes typing the action's short hash."""


class NeedsHuman(msgspec.Struct, frozen=True, kw_only=True):
    """What a policy kind's rule says when an otherwise valid proposal needs a human."""

    reason_code: ReasonCode
    detail: str


# msgspec makes a subclass of a frozen Struct frozen too; this tells type checkers so, so a
# kind needs no ``frozen=True`` of its own (which would change its source, hence its pack hash).
@dataclass_transform(frozen_default=True, field_specifiers=(msgspec.field,))
class PolicyKind(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", forbid_unknown_fields=True
):
    """Base of every policy kind: subclass it with ``tag="domain.action"``.

    Money and quantities are integer minor units or decimal strings, never floats.
    """

    version: ClassVar[str] = "1.0"
    adapter: ClassVar[str] = ""
    impact: ClassVar[Impact] = Impact.HIGH_IMPACT
    """Fail closed: a kind that declares nothing is HIGH_IMPACT."""
    personal: ClassVar[Mapping[str, str]] = MappingProxyType({})
    """Personal fields (string fields holding a person's data), each with the field that
    names its data subject: sealed under the subject's key before anything judges or
    records them, and erasable (kernel.proofs.erasure). Rules may not read them."""
    retention_s: ClassVar[float | None] = None
    """How long a subject's personal fields are kept after their last use (None: until
    erased): ``dirk erase --expired`` erases subjects past it."""
    scopes: ClassVar[tuple[str, ...]] = ()
    """The scopes a principal needs for this kind, all of them (docs/identity.md): checked
    by the DIM against the principal's scopes in its tenant, narrowed along a delegation."""
    read_only: ClassVar[bool] = False
    """Whether the kind only reads (changes nothing in the world): a tenant that fails open
    lets such calls proceed while the journal's store is away (docs/identity.md)."""

    def needs_human(self) -> NeedsHuman | None:
        """Return why this (valid) action needs a human, or None: the pack's escalation rule.

        Override it for an authority threshold (e.g. RISK_LIMIT_EXCEEDED above a
        notional limit) or to report ambiguity (AMBIGUOUS). It must be pure: the
        DIM calls it with nothing but the parameters.
        """
        return None


def kind_name(kind: type[PolicyKind]) -> str:
    """Return the wire name of a policy kind."""
    tag = kind.__struct_config__.tag
    return tag if isinstance(tag, str) else kind.__name__
