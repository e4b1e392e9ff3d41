"""The checks a policy pack passes when loaded (:class:`kernel.policy.packs.PolicyCatalog`).

Each part of a pack has one named step (a kind, a rule, an invariant, a consume, a threshold,
a guard, a limit, a cost, a budget, a quorum); :func:`check_pack` runs them in the order the
parts are declared and raises :class:`PackError` naming the first problem and where it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn, Protocol

import msgspec
import msgspec.inspect

from kernel.core.text import id_problem
from kernel.core.wall import clip
from kernel.policy.guards import Guard
from kernel.policy.kinds import Impact, PolicyKind, kind_name
from kernel.policy.money import CURRENCY, SCOPES, Budget, Cost
from kernel.policy.quorums import Quorum
from kernel.policy.rules import (
    MAX_BUDGET_US,
    OneOf,
    Range,
    Rule,
    StateMatch,
    attributes_read,
    decimal_of,
    impurity,
    source_of,
    template_fields,
)


class PolicyPack(Protocol):
    """The parts of a pack (kernel.policy.packs.PolicyPack) its load checks read.

    A protocol rather than the class itself: packs.py imports these checks, and a
    check module that imported packs.py back would close an import circle.
    """

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def kinds(self) -> Sequence[type[PolicyKind]]: ...
    @property
    def rules(self) -> Sequence[Rule]: ...
    @property
    def invariants(self) -> Sequence[Any]: ...
    @property
    def consumes(self) -> Sequence[Any]: ...
    @property
    def capacities(self) -> Mapping[str, int]: ...
    @property
    def thresholds(self) -> Sequence[Any]: ...
    @property
    def limits(self) -> Mapping[str, Any]: ...
    @property
    def guards(self) -> Sequence[Guard]: ...
    @property
    def quorums(self) -> Sequence[Quorum]: ...
    @property
    def grant_quorum(self) -> Quorum | None: ...
    @property
    def costs(self) -> Sequence[Cost]: ...
    @property
    def budgets(self) -> Sequence[Budget]: ...
    @property
    def on_superseded(self) -> str: ...


class PackError(Exception):
    """A policy pack that cannot be loaded; the kernel refuses to start on it."""


def name_of(kind: Any) -> str:
    """Return a kind's wire name, or the repr of what stands where a kind should."""
    return (
        kind_name(kind) if isinstance(kind, type) and issubclass(kind, PolicyKind) else repr(kind)
    )


def check_pack(pack: PolicyPack, seen: dict[str, str]) -> None:
    """Raise PackError naming the first problem of ``pack`` (and where it is).

    ``seen`` maps each kind name already defined to its pack; this pack's kinds join it.
    """
    if not pack.name or not pack.version:
        raise PackError(f"pack {pack!r}: a pack needs a name and a version")
    _check_names(pack)
    check = _PackCheck(pack)
    for kind in pack.kinds:
        check.kind(kind, seen)
    quorums = (*pack.quorums, *([pack.grant_quorum] if pack.grant_quorum else []))
    steps: tuple[tuple[Iterable[Any], Callable[[Any], None]], ...] = (
        (pack.rules, check.rule),
        (pack.invariants, check.invariant),
        (pack.consumes, check.consume),
        (pack.thresholds, check.threshold),
        (pack.guards, check.guard),
        (pack.limits.items(), check.limit),
        (pack.costs, check.cost),
        (pack.budgets, check.budget),
        (quorums, check.quorum),
    )
    for parts, step in steps:
        for part in parts:
            step(part)
    if pack.on_superseded not in ("refuse", "escalate"):
        raise PackError(f"pack {pack.name}: on_superseded is refuse or escalate")


def _decimal_field(kind: type[PolicyKind]) -> str | None:
    """The first field of ``kind`` whose type holds a Decimal anywhere inside it, else None."""

    def holds(t: Any, seen: set[type]) -> bool:
        if isinstance(t, msgspec.inspect.DecimalType):
            return True
        if isinstance(t, msgspec.inspect.StructType | msgspec.inspect.DataclassType):
            if t.cls in seen:
                return False
            seen.add(t.cls)
            return any(holds(f.type, seen) for f in t.fields)
        inner: list[Any] = []
        for attr in ("type", "types", "item_type", "item_types", "key_type", "value_type"):
            value = getattr(t, attr, None)
            inner.extend(value if isinstance(value, tuple) else [value] if value else [])
        return any(holds(i, seen) for i in inner)

    info = msgspec.inspect.type_info(kind)
    assert isinstance(info, msgspec.inspect.StructType)
    return next((f.name for f in info.fields if holds(f.type, {kind})), None)


def _check_names(pack: PolicyPack) -> None:
    """Refuse a pack whose names could not be recorded or printed: every one is an id.

    A lone surrogate cannot be written to the journal (KernelStarted names the packs),
    and a control character would be obeyed by the terminal that shows it.
    """
    for what, name in _names_of(pack):
        problem = id_problem(name)
        if problem is not None:
            shown = clip(name, 80)
            raise PackError(f"pack {clip(pack.name, 80)}: {what} '{shown}' is no id: {problem}")


def _names_of(pack: PolicyPack) -> list[tuple[str, Any]]:
    """Every name a pack declares, with what it names."""
    names: list[tuple[str, Any]] = [("name", pack.name), ("version", pack.version)]
    names += _part_names(pack)
    names += [("limit", key) for key in pack.limits]
    names += [("resource", key) for key in pack.capacities]
    return names


def _part_names(pack: PolicyPack) -> list[tuple[str, Any]]:
    names: list[tuple[str, Any]] = []
    names += [("policy kind", kind_name(k)) for k in pack.kinds if isinstance(k, type)]
    names += [("rule", r.name) for r in pack.rules if isinstance(r, Rule)]
    names += [("invariant", i.name) for i in pack.invariants if hasattr(i, "name")]
    names += [("guard", g.name) for g in pack.guards if isinstance(g, Guard)]
    return names


def _whole(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _no_code(currency: Any) -> bool:
    return not isinstance(currency, str) or not CURRENCY.match(currency)


class _PackCheck:
    """The steps of one pack's check; each raises PackError on the first problem it sees."""

    def __init__(self, pack: PolicyPack) -> None:
        self.pack = pack
        self.own = set(pack.kinds)
        self.currencies: dict[str, set[str]] = {}
        self.budget_names: set[str] = set()

    def fail(self, problem: str) -> NoReturn:
        raise PackError(f"pack {self.pack.name}: {problem}")

    # --- what every step asks of the kinds a part names -------------------------------------

    def fields_of(self, part: str, kind: Any) -> tuple[str, ...]:
        if kind not in self.own:
            self.fail(f"{part} is about {name_of(kind)}, not a kind of this pack")
        return tuple(kind.__struct_fields__)

    def need(self, part: str, kind: Any, names: Iterable[str], where: str = "") -> None:
        fields = self.fields_of(part, kind)
        for f in names:
            if f not in fields:
                at = f" ({where})" if where else ""
                self.fail(
                    f"{part}{at} names field {f!r},"
                    f" which {name_of(kind)} does not have (it has {', '.join(fields)})"
                )

    def pure(self, part: str, fn: Callable[..., Any]) -> None:
        problem = impurity(fn)
        if problem is not None:
            self.fail(f"{part} is not deterministic: {problem}")

    def amount(self, part: str, kind: Any, amount: Any) -> None:
        """An amount is a field of the kind or a pure function of its parameters."""
        if isinstance(amount, str):
            self.need(part, kind, [amount])
        else:
            self.fields_of(part, kind)
            self.pure(part, amount)

    # --- one step per part of a pack ---------------------------------------------------------

    def kind(self, kind: Any, seen: dict[str, str]) -> None:
        if not (isinstance(kind, type) and issubclass(kind, PolicyKind)):
            self.fail(f"{kind!r} is not a PolicyKind subclass")
        name = kind_name(kind)
        if name in seen:
            raise PackError(
                f"policy kind {name!r} is defined by both pack {seen[name]!r}"
                f" and pack {self.pack.name!r}"
            )
        if not kind.adapter:
            self.fail(f"policy kind {name!r} names no adapter to execute it")
        lenient = _decimal_field(kind)
        if lenient is not None:
            self.fail(
                f"policy kind {name!r} types field {lenient!r} as Decimal,"
                " which reads '1_0_0', ' 100 ', full-width digits and 'NaN' and re-spells them;"
                " type it kernel.DecimalStr (the string the DIM judges is the one executed)"
            )
        if kind.impact not in tuple(Impact):
            self.fail(f"policy kind {name!r} declares an unknown impact {kind.impact!r}")
        seen[name] = self.pack.name

    def rule(self, r: Any) -> None:
        if not isinstance(r, Rule):
            self.fail(f"{r!r} is not a Rule (declare it with @rule)")
        where, _ = source_of(r.fn)
        part = f"rule {r.name}"
        budget = r.budget_us
        if (
            isinstance(budget, bool)
            or not isinstance(budget, int)
            or not 0 < budget <= MAX_BUDGET_US
        ):
            self.fail(
                f"{part} ({where}): budget_us must be a whole number of"
                f" microseconds in [1, {MAX_BUDGET_US}], not {budget!r}"
            )
        self.need(part, r.kind, r.fields, where)
        for f, line in attributes_read(r.fn):
            self.need(part, r.kind, [f], f"{where.rsplit(':', 1)[0]}:{line}")
        self.pure(part, r.fn)

    def invariant(self, inv: Any) -> None:
        if not isinstance(inv, Range | OneOf | StateMatch):
            self.fail(f"{inv!r} is not an invariant")
        self.need(f"invariant {inv.name}", inv.kind, [inv.field])
        if isinstance(inv, StateMatch):
            self.need(f"invariant {inv.name}", inv.kind, template_fields(inv.state_key))
        if isinstance(inv, Range):
            for bound in (inv.min, inv.max):
                if bound is not None and decimal_of(bound) is None:
                    self.fail(f"invariant {inv.name}: bad bound {bound!r}")

    def consume(self, c: Any) -> None:
        part = f"resource {c.pool}"
        if c.pool.startswith("money:"):
            self.fail(f"{part}: money: pools are the budgets' (Budget)")
        self.need(part, c.kind, template_fields(c.pool))
        self.amount(part, c.kind, c.amount)

    def threshold(self, t: Any) -> None:
        part = f"threshold of {name_of(t.kind)}"
        if t.above is not None:
            self.amount(part, t.kind, t.amount)
            if decimal_of(t.above) is None:
                self.fail(f"{part}: bad amount {t.above!r}")
        if t.currency and _no_code(t.currency):
            self.fail(f"{part}: {t.currency!r} is no ISO 4217 code")
        self.fields_of(part, t.kind)

    def guard(self, g: Any) -> None:
        if not isinstance(g, Guard):
            self.fail(f"{g!r} is not a Guard")
        part = f"guard {g.name}"
        self.fields_of(part, g.kind)
        if not 0.0 <= g.flag_above <= 1.0:
            self.fail(f"{part}: flag_above must lie in [0, 1]")
        if g.emergency_above is not None:
            if not g.deterministic:
                self.fail(
                    f"{part}: an emergency rule must be a pure function,"
                    " not an async guard (its verdict must replay)"
                )
            if not g.flag_above <= g.emergency_above <= 1.0:
                self.fail(f"{part}: emergency_above must lie in [flag_above, 1]")
        if g.deterministic:
            self.pure(part, g.check)
        elif not callable(g.check):
            self.fail(f"{part}: the check is not callable")

    def limit(self, item: tuple[str, Any]) -> None:
        key, spec = item
        low, default, high = (decimal_of(v) for v in (spec.floor, spec.default, spec.ceiling))
        if low is None or default is None or high is None or not low <= default <= high:
            self.fail(f"limit {key!r} needs floor <= default <= ceiling")

    def cost(self, c: Any) -> None:
        """Refuse a cost that could not be judged exactly, or one declared twice."""
        if not isinstance(c, Cost):
            self.fail(f"{c!r} is not a Cost")
        part = f"cost of {name_of(c.kind)}"
        if _no_code(c.currency):
            self.fail(f"{part}: {c.currency!r} is no ISO 4217 code")
        self.amount(part, c.kind, c.amount)
        held = self.currencies.setdefault(name_of(c.kind), set())
        if c.currency in held:
            self.fail(f"{part} is declared twice in {c.currency}")
        held.add(c.currency)

    def budget(self, b: Any) -> None:
        """Refuse a budget that could not be judged exactly."""
        if not isinstance(b, Budget):
            self.fail(f"{b!r} is not a Budget")
        part = f"budget {b.name!r}"
        self.budget_name(part, b)
        if _no_code(b.currency):
            self.fail(f"{part}: {b.currency!r} is no ISO 4217 code")
        if not _whole(b.ceiling):
            self.fail(f"{part}: the ceiling is whole minor units >= 0")
        if b.per not in SCOPES or b.over not in ("refuse", "escalate"):
            self.fail(f"{part}: per is one of {', '.join(SCOPES)}, over is refuse or escalate")
        if b.window_s is not None and not _whole(b.window_s, 1):
            self.fail(f"{part}: window_s is whole seconds >= 1, or None")
        for kind in b.kinds:
            self.fields_of(part, kind)

    def budget_name(self, part: str, b: Any) -> None:
        problem = id_problem(b.name) if isinstance(b.name, str) and b.name else "empty"
        if problem is not None or ":" in b.name or "@" in b.name or b.name in self.budget_names:
            self.fail(f"{part}: a budget needs a unique id without ':' or '@'")
        self.budget_names.add(b.name)

    def quorum(self, q: Any) -> None:
        """Refuse a quorum that could never be met, or not be judged."""
        if not isinstance(q, Quorum):
            self.fail(f"{q!r} is not a Quorum")
        part = f"quorum {q.name or q.required}"
        if not _whole(q.required, 1):
            self.fail(f"{part}: required is a whole number >= 1")
        self.quorum_roles(part, q)
        if q.on_reject not in ("end", "vote"):
            self.fail(f"{part}: on_reject is end or vote")
        if q.vote_ttl_s is not None and not _whole(q.vote_ttl_s, 1):
            self.fail(f"{part}: vote_ttl_s is whole seconds >= 1, or None")
        self.quorum_amount(part, q)

    def quorum_roles(self, part: str, q: Any) -> None:
        for role in q.roles:
            if not isinstance(role, str) or id_problem(role) is not None or not role:
                self.fail(f"{part}: role {role!r} is no id")
        if q.distinct and q.roles and q.required > len(q.roles):
            self.fail(
                f"{part}: {q.required} distinct roles needed, only"
                f" {len(q.roles)} named: it could never be met"
            )

    def quorum_amount(self, part: str, q: Any) -> None:
        if q.kind is not None:
            self.fields_of(part, q.kind)
        if q.above is not None:
            if q.kind is None:
                self.fail(f"{part}: an amount needs its kind")
            if isinstance(q.amount, str):
                self.need(part, q.kind, [q.amount])
            else:
                self.pure(part, q.amount)
            if decimal_of(q.above) is None:
                self.fail(f"{part}: bad amount {q.above!r}")
