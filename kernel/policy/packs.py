"""Policy packs: what a domain says about its policy kinds (:mod:`kernel.policy.kinds`).

A policy pack groups the kinds of one domain under a name,
a version and a content hash, with what it says about them: rules (pure
functions), invariants (checks as data), the resources each kind consumes,
escalation thresholds and amendable limits. Every verdict records the pack's
hash, so replay knows which rules decided.

Packs are validated when loaded (:class:`PolicyCatalog`); the kernel refuses
to start on a pack that names a field its kind does not have, defines a kind
twice, calls something non-deterministic in a rule, or gives a rule a budget
that is not a whole number of microseconds in (0, 1 s], and the
:class:`PackError` points at the rule's file and line.

A pack is immutable once built: its parts are tuples and read-only mappings, so
the hash a verdict records is the hash of what judged it, and the loaded rules
cannot be swapped in memory behind the journal's back. A new version goes
through ``Kernel.load_pack``, which records PackLoaded. (Python gives no
isolation inside a process: code that reaches for ``object.__setattr__`` or a
function's ``__code__`` is trusted code; ``dirk verify --verdicts`` is what
catches a pack that judged otherwise than its recorded hash says.)
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property
from types import MappingProxyType
from typing import Any, Literal

import msgspec
import msgspec.inspect

from kernel.core.events import PackRef, canonical
from kernel.policy._checks import PackError as PackError  # re-exported: its old home
from kernel.policy._checks import check_pack, name_of
from kernel.policy._schema import hashed_schema
from kernel.policy.escalations import EscalationBudget
from kernel.policy.guards import Guard
from kernel.policy.kinds import PolicyKind, kind_name
from kernel.policy.money import Budget, Cost
from kernel.policy.monitors import Monitor
from kernel.policy.quorums import Quorum
from kernel.policy.rules import (
    Invariant,
    OneOf,
    Range,
    Rule,
    StateMatch,
    decimal_of,
)

Amount = str | Callable[[Any], int | Decimal | str]
"""A field of the kind, or a pure function of the typed parameters returning an amount."""


@dataclass(frozen=True)
class Consume:
    """A policy kind consumes ``amount`` (integer units) of ``pool`` while its flow is open.

    ``pool`` may name fields of the kind in braces, e.g. ``"inventory:{sku}"``.
    """

    kind: type[PolicyKind]
    pool: str
    amount: Amount


@dataclass(frozen=True)
class Threshold:
    """Escalate a kind to a human above an amount, or below a confidence.

    Args:
        kind: the policy kind.
        amount: what is compared with ``above`` (a field or a pure function of the params).
        above: the amount past which a human approves (APPROVAL_REQUIRED).
        confidence_below: the confidence under which a human decides (LOW_CONFIDENCE).
        currency: the amount is money, minor units of this ISO 4217 code: the escalation
            reads "30,000.00 USD is above 25,000.00 USD", not raw minor units.
    """

    kind: type[PolicyKind]
    amount: Amount = ""
    above: int | str | None = None
    confidence_below: float | None = None
    currency: str = ""


@dataclass(frozen=True)
class LimitSpec:
    """A limit agents get by default, and the floor and ceiling an operator may amend it to."""

    default: int | str
    floor: int | str
    ceiling: int | str


@dataclass(frozen=True)
class PolicyPack:
    """The policy kinds of one domain, under a name, a version and a content hash.

    Args:
        name: the pack's name, e.g. ``"trading"``.
        version: the pack's semver.
        kinds: the policy kinds it defines.
        escalate_below_confidence: proposals less confident than this go to a human.
        rules: pure rules (see :func:`kernel.policy.rules.rule`), run in order.
        invariants: checks as data (Range, OneOf, StateMatch), run before the rules.
        consumes: the resources each kind holds while its flow is open.
        capacities: each pool's capacity in integer units (a ``"prefix:*"`` key covers a
            family of pools); a ``capacity.<pool>`` fact in the state overrides it.
        thresholds: escalation thresholds per kind.
        limits: limits rules read from ``view.limits``, amendable within floor and ceiling.
        guards: soft guards (kernel.policy.guards): they flag flows NEEDS_REVIEW off the blocking
            path; a pure one with ``emergency_above`` may reject (GUARD_EMERGENCY).
        self_approval: whether the proposer of a flow of this pack's kinds may decide on it
            as an operator (recorded ``self_approved``); by default the escalation desk
            refuses it (SELF_APPROVAL_FORBIDDEN): four eyes. Never where a quorum applies.
        synonyms: groups of phrases that mean the same to memory constraints (kernel.state
            .meaning): ``("book", "reserve", "reservation")``. A constraint added while the
            pack is loaded records the groups that share a word with it, and matches by them.
        escalate_refusals: reason codes a domain's check refuses this pack's kinds with that
            go to a human instead (ESCALATED, with the refusal's detail): the memory pack
            may send CONSTRAINT_CONFLICT to an operator rather than refuse it.
        quorums: escalations that need more than one operator (kernel.policy.quorums); the
            first that applies to an escalation is recorded with it.
        grant_quorum: the quorum a standing grant for this pack's kinds needs before it is
            live (None: the issuing operator alone).
        costs: what each kind costs in money (kernel.policy.money), for budgets and grants.
        budgets: ceilings on spending, reserved before acceptance (BUDGET_EXHAUSTED).
        on_superseded: what happens to an approved (or granted, or queued) action that no
            longer passes when it is judged again just before it executes: ``refuse``
            (APPROVAL_SUPERSEDED) or ``escalate`` (a new approval).
        escalation_budget: how often an agent may escalate this pack's kinds before it is
            demoted to PASSIVE (kernel.policy.escalations); None: the kernel's budget.
        monitors: drift monitors (kernel.policy.monitors) over rolling windows of the
            journal; evaluated by kernel.state.drift.
    """

    name: str
    version: str
    kinds: Sequence[type[PolicyKind]]
    escalate_below_confidence: float = 0.5
    extra: Mapping[str, Any] = field(default_factory=dict)
    rules: Sequence[Rule] = ()
    invariants: Sequence[Invariant] = ()
    consumes: Sequence[Consume] = ()
    capacities: Mapping[str, int] = field(default_factory=dict)
    thresholds: Sequence[Threshold] = ()
    limits: Mapping[str, LimitSpec] = field(default_factory=dict)
    guards: Sequence[Guard] = ()
    self_approval: bool = False
    synonyms: Sequence[Sequence[str]] = ()
    escalate_refusals: Sequence[str] = ()
    quorums: Sequence[Quorum] = ()
    grant_quorum: Quorum | None = None
    costs: Sequence[Cost] = ()
    budgets: Sequence[Budget] = ()
    on_superseded: Literal["refuse", "escalate"] = "refuse"
    escalation_budget: EscalationBudget | None = None
    monitors: Sequence[Monitor] = ()

    def __post_init__(self) -> None:
        # Copies the caller cannot reach, read-only: what judges stays what the hash covers.
        for part in _SEQUENCES:
            value = getattr(self, part)
            if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
                raise PackError(f"pack {self.name}: {part} must be a sequence, not {value!r}")
            object.__setattr__(self, part, tuple(value))
        for part in _MAPPINGS:
            value = getattr(self, part)
            if not isinstance(value, Mapping):
                raise PackError(f"pack {self.name}: {part} must be a mapping, not {value!r}")
            object.__setattr__(self, part, MappingProxyType(dict(value)))
        self._own_synonyms()
        self._own_codes()

    def _own_synonyms(self) -> None:
        """Take the synonyms as tuples of phrases, or refuse them."""
        groups = self.synonyms
        if isinstance(groups, str | bytes) or not all(
            isinstance(g, Sequence)
            and not isinstance(g, str)
            and all(isinstance(p, str) for p in g)
            for g in groups
        ):
            raise PackError(f"pack {self.name}: synonyms are groups (sequences) of phrases")
        object.__setattr__(self, "synonyms", tuple(tuple(g) for g in groups))

    def _own_codes(self) -> None:
        """Take the refusal codes that escalate as a tuple of strings, or refuse them."""
        codes = self.escalate_refusals
        if isinstance(codes, str) or not all(isinstance(c, str) for c in codes):
            raise PackError(f"pack {self.name}: escalate_refusals is a sequence of reason codes")
        object.__setattr__(self, "escalate_refusals", tuple(str(c) for c in codes))

    @cached_property
    def by_name(self) -> Mapping[str, type[PolicyKind]]:
        """The pack's kinds by wire name."""
        return MappingProxyType({kind_name(k): k for k in self.kinds})

    @cached_property
    def hash(self) -> str:
        """A hash of everything that decides: kinds, schemas, rules, invariants and settings."""
        content: dict[str, Any] = {
            "name": self.name,
            "version": self.version,
            "escalate_below_confidence": repr(self.escalate_below_confidence),
            "kinds": {
                kind_name(k): {
                    "version": k.version,
                    "adapter": k.adapter,
                    "impact": str(k.impact),
                    "schema": hashed_schema(k),
                    "source": _source(k),
                    **_principal_marks(k),
                }
                for k in self.kinds
            },
            "rules": [[name_of(r.kind), _source(r.fn), r.fields, r.budget_us] for r in self.rules],
            "invariants": [_described(i) for i in self.invariants],
            "consumes": [[name_of(c.kind), c.pool, _described(c.amount)] for c in self.consumes],
            "capacities": dict(self.capacities),
            "thresholds": [
                # A currency joins the entry only when set: older packs keep their hashes.
                [name_of(t.kind), _described(t.amount), str(t.above), repr(t.confidence_below)]
                + ([t.currency] if t.currency else [])
                for t in self.thresholds
            ],
            "limits": {
                k: [str(v.default), str(v.floor), str(v.ceiling)] for k, v in self.limits.items()
            },
        }
        content.update(self._optional_content())
        content.update(self._approval_content())
        return hashlib.sha256(canonical(content)).hexdigest()

    def _optional_content(self) -> dict[str, Any]:
        """Guards, synonyms, refusals escalated and monitors, for the hash: each absent while
        unset, so a pack that sets none keeps the hash it had before they existed."""
        content: dict[str, Any] = {}
        if self.guards:
            content["guards"] = [
                [name_of(g.kind), g.name, _described(g.check), repr(g.flag_above),
                 repr(g.emergency_above)]
                for g in self.guards
            ]  # fmt: skip
        if self.self_approval:
            content["self_approval"] = True
        if self.synonyms:
            content["synonyms"] = [list(group) for group in self.synonyms]
        if self.escalate_refusals:
            content["escalate_refusals"] = sorted(self.escalate_refusals)
        if self.monitors:
            content["monitors"] = [m.hashed() for m in self.monitors]
        return content

    def _approval_content(self) -> dict[str, Any]:
        """Quorums, grants, money and re-judging, for the hash: each absent while unset."""
        content: dict[str, Any] = {}
        if self.quorums:
            content["quorums"] = [_quorum(q) for q in self.quorums]
        if self.grant_quorum is not None:
            content["grant_quorum"] = _quorum(self.grant_quorum)
        if self.costs:
            content["costs"] = [
                [name_of(c.kind), _described(c.amount), c.currency] for c in self.costs
            ]
        if self.budgets:
            content["budgets"] = [
                [b.name, b.ceiling, b.currency, b.per, b.window_s, b.over,
                 [name_of(k) for k in b.kinds], b.reasoning]
                for b in self.budgets
            ]  # fmt: skip
        if self.on_superseded != "refuse":
            content["on_superseded"] = self.on_superseded
        if self.escalation_budget is not None:  # absent from older hashes, as quorums are
            budget = self.escalation_budget
            content["escalation_budget"] = [budget.capacity, repr(budget.period_s)]
        return content

    @property
    def ref(self) -> PackRef:
        """The pack as recorded in events."""
        return PackRef(name=self.name, version=self.version, hash=self.hash)


_SEQUENCES = (
    "kinds", "rules", "invariants", "consumes", "thresholds", "guards", "quorums", "costs",
    "budgets", "monitors",
)  # fmt: skip
_MAPPINGS = ("extra", "capacities", "limits")


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _quorum(q: Quorum) -> list[Any]:
    return [
        q.required, list(q.roles), q.distinct, q.on_reject, q.vote_ttl_s,
        name_of(q.kind) if q.kind is not None else None, [str(r) for r in q.reasons],
        str(q.impact) if q.impact is not None else None, _described(q.amount), str(q.above),
        q.name,
    ]  # fmt: skip


def _described(obj: Any) -> str:
    """A stable description of a piece of a pack, for its hash (functions by their source)."""
    if callable(obj) and not isinstance(obj, type):
        return _source(obj) or repr(obj)
    if isinstance(obj, Range | OneOf | StateMatch):
        fields = {k: v for k, v in vars(obj).items() if k != "kind"}
        if isinstance(obj, OneOf):
            fields["values"] = sorted(map(str, obj.values))
        return f"{type(obj).__name__}({name_of(obj.kind)}, {sorted(fields.items())!r})"
    return repr(obj)


class PolicyCatalog:
    """Every policy kind of every loaded pack, validated together.

    Readers cannot change it: its packs are a tuple behind a read-only property and
    its tables read-only views. One method does, :meth:`adopt`, once the DIM has
    staged PackLoaded for a new version: every actor holds this catalog (and some
    hold its tables), so the new version is taken where they look rather than handed
    to each of them. Nothing else changes a catalog: use ``Kernel.load_pack``, which
    records the new version.

    Raises:
        PackError: A pack is invalid, or two packs define one kind.
    """

    def __init__(self, packs: Sequence[PolicyPack]) -> None:
        taken = tuple(packs)
        seen: dict[str, str] = {}
        for pack in taken:
            check_pack(pack, seen)
        self._packs = taken
        # The tables built so far, by name: adopt() refills them where they are.
        self._tables: dict[str, dict[str, Any]] = {}

    def __repr__(self) -> str:
        return f"PolicyCatalog({', '.join(f'{p.name} {p.version}' for p in self._packs)})"

    @property
    def packs(self) -> tuple[PolicyPack, ...]:
        """The loaded packs, in the order given."""
        return self._packs

    def _table(self, name: str, table: dict[str, Any]) -> Mapping[str, Any]:
        """Keep ``table`` for :meth:`adopt` to refill, and hand out a read-only view of it."""
        self._tables[name] = table
        return MappingProxyType(table)

    @cached_property
    def kinds(self) -> Mapping[str, type[PolicyKind]]:
        """Every kind by wire name."""
        return self._table(
            "kinds", {name: kind for pack in self.packs for name, kind in pack.by_name.items()}
        )

    @cached_property
    def reads_only(self) -> Mapping[str, bool]:
        """Whether each kind only reads (``PolicyKind.read_only``): its calls change nothing."""
        return self._table(
            "reads_only", {name: kind.read_only is True for name, kind in self.kinds.items()}
        )

    @cached_property
    def pack_of(self) -> Mapping[str, PolicyPack]:
        """The pack that defines each kind."""
        return self._table("pack_of", {name: pack for pack in self.packs for name in pack.by_name})

    @cached_property
    def schemas(self) -> Mapping[str, dict[str, Any]]:
        """The JSON Schema of each kind, generated from its msgspec type."""
        return self._table(
            "schemas", {name: msgspec.json.schema(kind) for name, kind in self.kinds.items()}
        )

    @cached_property
    def rules_of(self) -> Mapping[str, tuple[Rule, ...]]:
        """Each kind's rules, in the pack's order."""
        return self._table("rules_of", _by_kind(r for p in self.packs for r in p.rules))

    @cached_property
    def invariants_of(self) -> Mapping[str, tuple[Invariant, ...]]:
        """Each kind's invariants, in the pack's order."""
        return self._table("invariants_of", _by_kind(i for p in self.packs for i in p.invariants))

    @cached_property
    def consumes_of(self) -> Mapping[str, tuple[Consume, ...]]:
        """The resources each kind consumes."""
        return self._table("consumes_of", _by_kind(c for p in self.packs for c in p.consumes))

    @cached_property
    def thresholds_of(self) -> Mapping[str, tuple[Threshold, ...]]:
        """Each kind's escalation thresholds."""
        return self._table("thresholds_of", _by_kind(t for p in self.packs for t in p.thresholds))

    @cached_property
    def costs_of(self) -> Mapping[str, tuple[Cost, ...]]:
        """What each kind costs in money (one Cost per currency at most)."""
        return self._table("costs_of", _by_kind(c for p in self.packs for c in p.costs))

    @cached_property
    def quorums_of(self) -> Mapping[str, tuple[Quorum, ...]]:
        """The quorums that may apply to each kind's escalations, in its pack's order."""
        return self._table(
            "quorums_of",
            {
                name: tuple(q for q in pack.quorums if q.kind is None or kind_name(q.kind) == name)
                for pack in self.packs
                for name in pack.by_name
            },
        )

    @cached_property
    def budgets_of(self) -> Mapping[str, tuple[Budget, ...]]:
        """The money budgets each kind's cost counts against (those of its own pack)."""
        table: dict[str, tuple[Budget, ...]] = {}
        for pack in self.packs:
            for name in pack.by_name:
                currencies = {c.currency for c in pack.costs if kind_name(c.kind) == name}
                # A budget that counts reasoning covers its kinds whatever they cost:
                # thought spent past its ceiling refuses what it led to.
                table[name] = tuple(
                    b
                    for b in pack.budgets
                    if (b.currency in currencies or b.reasoning)
                    and (not b.kinds or name in {kind_name(k) for k in b.kinds})
                )
        return self._table("budgets_of", table)

    @cached_property
    def reasoning_budgets(self) -> Mapping[str, tuple[Budget, ...]]:
        """Every budget that counts the price of reasoning, by its pack's name."""
        return self._table(
            "reasoning_budgets",
            {p.name: tuple(b for b in p.budgets if b.reasoning) for p in self.packs},
        )

    def adopt(self, other: PolicyCatalog) -> None:
        """Take ``other``'s packs in place: the DIM's, once PackLoaded is staged.

        Tables already handed out are refilled where they are (a view of one sees the
        new version); those not built yet are built from the new packs when asked.
        """
        self._packs = other.packs
        for name, table in self._tables.items():
            getattr(other, name)  # builds other's table of that name
            table.clear()
            table.update(other._tables[name])

    @cached_property
    def guards_of(self) -> Mapping[str, tuple[Guard, ...]]:
        """Each kind's soft guards."""
        return self._table("guards_of", _by_kind(g for p in self.packs for g in p.guards))

    @cached_property
    def emergencies_of(self) -> Mapping[str, tuple[Guard, ...]]:
        """Each kind's emergency rules: the guards that may reject, run inline by the DIM."""
        return self._table(
            "emergencies_of",
            _by_kind(g for p in self.packs for g in p.guards if g.emergency_above is not None),
        )

    def refs(self) -> list[PackRef]:
        """The loaded packs as recorded in events."""
        return [pack.ref for pack in self.packs]

    def adapters_needed(self) -> Iterable[str]:
        """The adapter names the kinds execute through."""
        return sorted({kind.adapter for kind in self.kinds.values()})


def _by_kind(items: Iterable[Any]) -> dict[str, tuple[Any, ...]]:
    grouped: dict[str, list[Any]] = {}
    for item in items:
        grouped.setdefault(kind_name(item.kind), []).append(item)
    return {kind: tuple(group) for kind, group in grouped.items()}


def amount_of(amount: Amount, params: Any) -> Decimal | None:
    """Evaluate an amount declaration (a field or a pure function) on typed parameters."""
    value = getattr(params, amount) if isinstance(amount, str) else amount(params)
    return decimal_of(value)


def _principal_marks(kind: type[Any]) -> dict[str, Any]:
    """A kind's scopes and read-only mark, only when set: older packs keep their hashes."""
    marks: dict[str, Any] = {}
    scopes = getattr(kind, "scopes", ())
    if scopes:
        marks["scopes"] = list(scopes)
    if getattr(kind, "read_only", False):
        marks["read_only"] = True
    return marks
