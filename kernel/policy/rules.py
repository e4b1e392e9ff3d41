"""Rules and invariants: what a policy pack says about its policy kinds.

A rule is a pure Python function of a read-only :class:`View` (the proposal's
parameters as the typed policy kind, the agent's visible state, the time and
the agent's limits) that returns a :class:`RuleVerdict`. An invariant is the
same kind of check written as data: :class:`Range`, :class:`OneOf` and
:class:`StateMatch` (a parameter within a drift envelope, in basis points, of
a value in the state snapshot).

Everything here fails closed: a rule that raises or returns anything but a
RuleVerdict yields a KERNEL_FAULT verdict naming the rule (:func:`run_rule`).
A rule's purity is checked when its pack loads (:func:`impurity`): calls that
read the clock, randomness, ids or the environment are refused, with the file
and line of the call.

A verdict is a function of recorded inputs only, so no verdict depends on how
long a rule took: under load the same rule may take ten times as long, and
replay must judge as the live kernel did. A rule's time budget is measured
beside the verdict by a :class:`Stopwatch` the DIM hands the pipeline; a rule
past its budget is an :class:`Overrun`, which the DIM records as a finding that
flags the flow NEEDS_REVIEW and names the rule and its pack for their author
(Python cannot pre-empt a synchronous function, so a slow rule is reported,
neither interrupted nor rejected).
"""

from __future__ import annotations

import ast
import builtins
import datetime as _datetime
import inspect
import re
import string
import textwrap
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from types import MappingProxyType, ModuleType
from typing import Annotated, Any

import msgspec

from kernel.core.reasons import ReasonCode


class RuleVerdict(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """What one rule says: ``ok``, or why not (code, detail, field and limit)."""

    ok: bool
    reason_code: ReasonCode | None = None
    detail: str = ""
    field: str = ""
    limit: str = ""


ALLOW = RuleVerdict(ok=True)
"""The verdict of a rule that has nothing against the proposal."""


def deny(
    detail: str,
    *,
    code: ReasonCode = ReasonCode.RISK_LIMIT_EXCEEDED,
    field: str = "",
    limit: Any = "",
) -> RuleVerdict:
    """Return the verdict of a rule the proposal breaks."""
    return RuleVerdict(ok=False, reason_code=code, detail=detail, field=field, limit=str(limit))


class View:
    """The read-only view a rule judges: parameters, state, time and limits.

    Attributes:
        params: the proposal's parameters as the typed (frozen) policy kind.
        state: the state snapshot the agent reasoned on (read-only mapping).
        now_ns: the kernel's time of the verdict.
        agent_id: who proposes.
        limits: the agent's limits: the pack's defaults, its manifest, approved amendments.
        confidence: the agent's own confidence.
        tenant: the tenant the proposal is made for ("" for none).
    """

    __slots__ = ("agent_id", "confidence", "limits", "now_ns", "params", "state", "tenant")

    def __init__(
        self,
        params: Any,
        state: Mapping[str, Any],
        now_ns: int,
        agent_id: str = "",
        limits: Mapping[str, Any] | None = None,
        confidence: float = 1.0,
        tenant: str = "",
    ) -> None:
        self.params = params
        # No copy: the caller hands a fresh mapping; the proxy keeps rules from writing it.
        self.state = state if isinstance(state, MappingProxyType) else MappingProxyType(state)
        self.now_ns = now_ns
        self.agent_id = agent_id
        self.limits = MappingProxyType(limits if limits is not None else {})
        self.confidence = confidence
        self.tenant = tenant


RuleFn = Callable[[View], RuleVerdict]


@dataclass(frozen=True)
class Rule:
    """A rule of a pack, bound to one policy kind.

    Args:
        kind: the policy kind it judges.
        fn: the pure function ``View -> RuleVerdict``.
        fields: the kind's fields it reads (checked against the kind at load).
        budget_us: the time it may take, in microseconds (at most :data:`MAX_BUDGET_US`);
            past it, the flow is flagged NEEDS_REVIEW and the verdict stands.
    """

    kind: type[Any]
    fn: RuleFn
    fields: tuple[str, ...] = ()
    budget_us: int = 10_000

    def __post_init__(self) -> None:
        # Immutable once built: a list given here could be changed after the pack's hash.
        object.__setattr__(self, "fields", tuple(self.fields))

    @property
    def name(self) -> str:
        """The rule's name as feedback reports it."""
        return self.fn.__name__


def rule(
    kind: type[Any], *, fields: tuple[str, ...] = (), budget_us: int = 10_000
) -> Callable[[RuleFn], Rule]:
    """Declare a function as a rule of ``kind`` (use as a decorator)."""

    def wrap(fn: RuleFn) -> Rule:
        return Rule(kind=kind, fn=fn, fields=fields, budget_us=budget_us)

    return wrap


def fault(name: str, detail: str) -> RuleVerdict:
    """Return the verdict of a check that could not be carried out: never an allow."""
    return RuleVerdict(ok=False, reason_code=ReasonCode.KERNEL_FAULT, detail=f"{name}: {detail}")


MAX_BUDGET_US = 1_000_000
"""The most a rule may declare: the DIM judges one proposal at a time, so one second is a lot."""


def run_rule(r: Rule, view: View) -> RuleVerdict:
    """Run one rule, failing closed on an exception or a wrong answer; never read a clock."""
    try:
        result = r.fn(view)
    except Exception as exc:
        return fault(f"rule {r.name}", f"raised {type(exc).__name__}: {exc}"[:300])
    if not isinstance(result, RuleVerdict):
        return fault(f"rule {r.name}", f"returned {type(result).__name__}, not a RuleVerdict")
    if not result.ok and result.reason_code is None:
        return fault(f"rule {r.name}", "denied without a reason code")
    return result


class Overrun(msgspec.Struct, frozen=True, kw_only=True):
    """A rule that took longer than its budget: a recorded fact, never an input of a verdict."""

    rule: str
    budget_us: int
    took_us: int


class Stopwatch:
    """Time each rule the pipeline runs, beside the verdict, and keep the overruns.

    The verdict is :func:`run_rule`'s whatever the time: the stopwatch only
    watches. Its clock is real monotonic time (a measurement of this process,
    like the supervisor's restart intensity), which is why nothing it measures
    may decide anything; the DIM records what it found (kernel.dim._actor).
    """

    __slots__ = ("_clock", "overruns")

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self._clock = clock
        self.overruns: list[Overrun] = []

    def run(self, r: Rule, view: View) -> RuleVerdict:
        """Run ``r`` on ``view`` (see :func:`run_rule`), noting an overrun of its budget."""
        start = self._clock()
        verdict = run_rule(r, view)
        took_ns = self._clock() - start
        if took_ns > r.budget_us * 1_000:
            self.overruns.append(
                Overrun(rule=r.name, budget_us=r.budget_us, took_us=took_ns // 1_000)
            )
        return verdict


# --- invariants: checks as data ------------------------------------------------


DECIMAL_PATTERN = r"^(?!-0(\.0+)?$)-?(0|[1-9][0-9]{0,17})(\.[0-9]{1,9})?$(?!\n)"
"""The one spelling of a decimal the kernel accepts: what :data:`DecimalStr` matches.

ASCII digits, an optional leading ``-`` and an optional point followed by digits;
no ``+``, no leading zeros, no negative zero, no exponent, no spaces, underscores or
other scripts' digits. At most 18 digits before the point and 9 after it, so every
value is exact in the default decimal context (28 digits). Each (value, scale) pair
has exactly one spelling, so the string is never normalised: ``"100.00"`` and
``"100.0"`` are both accepted (the scale is the author's) and each is recorded,
judged and executed as written. The trailing ``(?!\n)`` keeps Python's ``$`` from
accepting a final newline; in a JSON Schema (ECMA-262) it is a no-op.
"""

_DECIMAL = re.compile(DECIMAL_PATTERN)

DecimalStr = Annotated[
    str,
    msgspec.Meta(
        pattern=DECIMAL_PATTERN,
        description="a decimal as a string: ASCII digits, optional '-' and '.', e.g. '100.25'",
    ),
]
"""The type of a money or quantity field that is a decimal string (see :data:`DECIMAL_PATTERN`).

The DIM's schema layer rejects any other string (SCHEMA_INVALID, naming the
field), so rules may call ``Decimal()`` on such a field without a guard, and the
adapter receives exactly the string the DIM judged.
"""


def is_decimal(text: str) -> bool:
    """Return whether ``text`` is a decimal string in the one accepted spelling."""
    return _DECIMAL.search(text) is not None


def decimal_of(value: Any) -> Decimal | None:
    """Return ``value`` (an int or a decimal string) as a Decimal, or None; never a float.

    Strings are parsed strictly (:data:`DECIMAL_PATTERN`): ``"1_0_0"``, ``" 100 "``,
    full-width digits, ``"1e3"`` and ``"NaN"`` are None, although ``Decimal()`` reads them.
    """
    if isinstance(value, bool) or isinstance(value, float):
        return None
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, Decimal):
        return value if value.is_finite() else None
    if isinstance(value, str) and is_decimal(value):
        return Decimal(value)
    return None


@dataclass(frozen=True)
class Range:
    """``field`` lies in ``[min, max]`` (either bound may be None); ints or decimal strings."""

    kind: type[Any]
    field: str
    min: int | str | None = None
    max: int | str | None = None
    code: ReasonCode = ReasonCode.RISK_LIMIT_EXCEEDED

    @property
    def name(self) -> str:
        return f"range({self.field})"

    def check(self, view: View) -> RuleVerdict:
        value = decimal_of(getattr(view.params, self.field))
        if value is None:
            return deny(f"{self.field} is not a number", code=self.code, field=self.field)
        if self.min is not None and value < Decimal(self.min):
            return deny(
                f"{self.field} {value} is below {self.min}",
                code=self.code,
                field=self.field,
                limit=self.min,
            )
        if self.max is not None and value > Decimal(self.max):
            return deny(
                f"{self.field} {value} is above {self.max}",
                code=self.code,
                field=self.field,
                limit=self.max,
            )
        return ALLOW


@dataclass(frozen=True)
class OneOf:
    """``field`` is one of ``values``."""

    kind: type[Any]
    field: str
    values: frozenset[Any]
    code: ReasonCode = ReasonCode.CONSTRAINT_VIOLATION

    def __post_init__(self) -> None:
        # A set given here could grow after the pack's hash was taken.
        object.__setattr__(self, "values", frozenset(self.values))

    @property
    def name(self) -> str:
        return f"one_of({self.field})"

    def check(self, view: View) -> RuleVerdict:
        value = getattr(view.params, self.field)
        if value in self.values:
            return ALLOW
        allowed = ",".join(sorted(map(str, self.values)))
        return deny(
            f"{self.field} {value!r} is not one of {allowed}",
            code=self.code,
            field=self.field,
            limit=allowed,
        )


@dataclass(frozen=True)
class StateMatch:
    """``field`` lies within ``max_drift_bps`` of the state value at ``state_key``.

    ``state_key`` may name fields of the kind in braces, e.g. ``"market.{symbol}.price"``.
    A missing or non-numeric reference value fails closed.
    """

    kind: type[Any]
    field: str
    state_key: str
    max_drift_bps: int
    code: ReasonCode = ReasonCode.RISK_LIMIT_EXCEEDED

    @property
    def name(self) -> str:
        return f"state_match({self.field})"

    def check(self, view: View) -> RuleVerdict:
        key = self.state_key.format_map(_FieldsOf(view.params))
        value = decimal_of(getattr(view.params, self.field))
        reference = decimal_of(view.state.get(key))
        if value is None or reference is None or reference == 0:
            return deny(
                f"cannot compare {self.field} with {key}: no numeric reference in the snapshot",
                code=self.code,
                field=self.field,
            )
        drift_bps = abs(value - reference) * 10_000 / reference
        if drift_bps > self.max_drift_bps:
            return deny(
                f"{self.field} {value} is {drift_bps:.1f} bps from {key} {reference}",
                code=self.code,
                field=self.field,
                limit=f"{self.max_drift_bps} bps",
            )
        return ALLOW


Invariant = Range | OneOf | StateMatch


class _FieldsOf(dict[str, Any]):
    def __init__(self, params: Any) -> None:
        super().__init__()
        self._params = params

    def __missing__(self, key: str) -> Any:
        return getattr(self._params, key)


def template_fields(template: str) -> list[str]:
    """Return the field names a ``{field}`` template refers to."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


# --- purity, checked at load ---------------------------------------------------

_IMPURE_MODULES = frozenset({"random", "secrets", "uuid", "time", "socket", "subprocess"})
_IMPURE_CALLS = frozenset(
    {
        "os.urandom",
        "os.getrandom",
        "os.getenv",
        "os.times",
        "os.getpid",
        "datetime.now",
        "datetime.utcnow",
        "datetime.today",
        "date.today",
        "datetime.datetime.now",
        "datetime.datetime.utcnow",
        "datetime.datetime.today",
        "datetime.date.today",
    }
)
_IMPURE_BUILTINS = frozenset({"open", "input", "exec", "eval", "__import__"})


def _dotted(node: ast.expr) -> list[str]:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return []


def _impure_call(parts: list[str], scope: Mapping[str, Any]) -> bool:
    head = scope.get(parts[0])
    if isinstance(head, ModuleType) or head in (_datetime.datetime, _datetime.date):
        parts = [head.__name__, *parts[1:]]
    elif len(parts) == 1 and callable(head) and _from_impure_module(head):
        return True
    name = ".".join(parts)
    return (
        parts[0] in _IMPURE_MODULES
        or name in _IMPURE_CALLS
        or (len(parts) == 1 and parts[0] in _IMPURE_BUILTINS)
    )


def _from_impure_module(fn: Callable[..., Any]) -> bool:
    """Whether a bare name calls a function of an impure module (``from time import time``)."""
    module = getattr(fn, "__module__", None) or ""
    owner = getattr(fn, "__self__", None)
    if not module and owner is not None:
        module = type(owner).__module__
    return module.split(".")[0] in _IMPURE_MODULES


def source_of(fn: Callable[..., Any]) -> tuple[str, int]:
    """Return ``file:line`` of a function's definition and its first line number."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return "<unknown>", 0
    return f"{code.co_filename}:{code.co_firstlineno}", code.co_firstlineno


def parse(fn: Callable[..., Any]) -> ast.AST | None:
    """Return the AST of a function's source, or None when the source is not available."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    return ast.parse(source)


def impurity(fn: Callable[..., Any]) -> str | None:
    """Return where ``fn`` calls something non-deterministic (``file:line: call``), or None."""
    tree = parse(fn)
    if tree is None:
        return None
    code = getattr(fn, "__code__", None)
    scope: dict[str, Any] = dict(vars(builtins))
    scope.update(getattr(fn, "__globals__", {}))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (parts := _dotted(node.func)):
            if _impure_call(parts, scope):
                line = (code.co_firstlineno + node.lineno - 1) if code else node.lineno
                where = code.co_filename if code else "<unknown>"
                return f"{where}:{line}: calls {'.'.join(parts)}(), which is not deterministic"
    return None


def attributes_read(fn: Callable[..., Any], root: str = "params") -> list[tuple[str, int]]:
    """Return the ``<view>.params.<field>`` names a rule reads, with their line numbers.

    Aliases (``p = view.params``) are followed one level, which covers how rules are written.
    """
    tree = parse(fn)
    code = getattr(fn, "__code__", None)
    if tree is None or code is None:
        return []
    aliases = _aliases(tree, root)
    return [
        (node.attr, code.co_firstlineno + node.lineno - 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and _reads_root(node.value, root, aliases)
    ]


def _aliases(tree: ast.AST, root: str) -> set[str]:
    """``root`` and the names assigned ``<view>.<root>`` (``p = view.params``)."""
    aliases = {root}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == root
        ):
            aliases.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return aliases


def _reads_root(base: ast.expr, root: str, aliases: set[str]) -> bool:
    """Whether an attribute read on ``base`` is one of ``root``'s fields."""
    if isinstance(base, ast.Attribute):
        return base.attr == root
    return isinstance(base, ast.Name) and base.id in aliases and base.id != root
