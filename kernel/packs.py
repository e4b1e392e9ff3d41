"""Policy kinds and policy packs: the contracts agents propose against.

A policy kind is a msgspec Struct tagged with its kind name (the ``kind``
field on the wire) and carrying a ``version`` and the name of the adapter
that executes it. A policy pack groups the kinds of one domain under a name,
a version and a content hash; every verdict can then say which rules decided.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any, ClassVar

import msgspec

from kernel.events import PackRef, canonical
from kernel.reasons import ReasonCode


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


class PackError(Exception):
    """A policy pack that cannot be loaded; the kernel refuses to start on it."""


@dataclass(frozen=True)
class PolicyPack:
    """The policy kinds of one domain, under a name, a version and a content hash.

    Args:
        name: the pack's name, e.g. ``"trading"``.
        version: the pack's semver.
        kinds: the policy kinds it defines.
        escalate_below_confidence: proposals less confident than this go to a human.
    """

    name: str
    version: str
    kinds: Sequence[type[PolicyKind]]
    escalate_below_confidence: float = 0.5
    extra: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def by_name(self) -> dict[str, type[PolicyKind]]:
        """The pack's kinds by wire name."""
        return {kind_name(k): k for k in self.kinds}

    @cached_property
    def hash(self) -> str:
        """A hash of everything that decides: kinds, their schemas, versions and settings."""
        content = {
            "name": self.name,
            "version": self.version,
            "escalate_below_confidence": repr(self.escalate_below_confidence),
            "kinds": {
                kind_name(k): {
                    "version": k.version,
                    "adapter": k.adapter,
                    "impact": str(k.impact),
                    "schema": msgspec.json.schema(k),
                    "source": _source(k),
                }
                for k in self.kinds
            },
        }
        return hashlib.sha256(canonical(content)).hexdigest()

    @property
    def ref(self) -> PackRef:
        """The pack as recorded in events."""
        return PackRef(name=self.name, version=self.version, hash=self.hash)


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


@dataclass(frozen=True)
class PolicyCatalog:
    """Every policy kind of every loaded pack, validated together."""

    packs: Sequence[PolicyPack]

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for pack in self.packs:
            if not pack.name or not pack.version:
                raise PackError(f"pack {pack!r}: a pack needs a name and a version")
            for kind in pack.kinds:
                if not (isinstance(kind, type) and issubclass(kind, PolicyKind)):
                    raise PackError(f"pack {pack.name}: {kind!r} is not a PolicyKind subclass")
                name = kind_name(kind)
                if name in seen:
                    raise PackError(
                        f"policy kind {name!r} is defined by both pack {seen[name]!r}"
                        f" and pack {pack.name!r}"
                    )
                if kind.impact not in tuple(Impact):
                    raise PackError(
                        f"pack {pack.name}: policy kind {name!r} declares an unknown impact"
                        f" {kind.impact!r}"
                    )
                if not kind.adapter:
                    raise PackError(
                        f"pack {pack.name}: policy kind {name!r} names no adapter to execute it"
                    )
                seen[name] = pack.name

    @cached_property
    def kinds(self) -> dict[str, type[PolicyKind]]:
        """Every kind by wire name."""
        return {name: kind for pack in self.packs for name, kind in pack.by_name.items()}

    @cached_property
    def pack_of(self) -> dict[str, PolicyPack]:
        """The pack that defines each kind."""
        return {name: pack for pack in self.packs for name in pack.by_name}

    @cached_property
    def schemas(self) -> dict[str, dict[str, Any]]:
        """The JSON Schema of each kind, generated from its msgspec type."""
        return {name: msgspec.json.schema(kind) for name, kind in self.kinds.items()}

    def refs(self) -> list[PackRef]:
        """The loaded packs as recorded in events."""
        return [pack.ref for pack in self.packs]

    def adapters_needed(self) -> Iterable[str]:
        """The adapter names the kinds execute through."""
        return sorted({kind.adapter for kind in self.kinds.values()})
