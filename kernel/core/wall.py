"""The wall's types: every value that enters the kernel is checked by type on the way in.

Agents, embedding code and operators hand the kernel plain Python values. Built
with bare constructors, a msgspec Struct checks nothing, so a ``None`` where a
list belongs, a ``nan`` confidence or an integer past 64 bits would reach an
event and, from there, the journal (JSON writes ``nan`` as ``null``, which no
longer decodes; msgpack, which hashes finished flows and snapshots, cannot hold
an integer past 64 bits). So each entry point turns what it was given into
builtins and *decodes* it into one of the specs below with ``strict=True``:
integers within 64 bits, finite floats, strings capped in length, operators'
names and reasons required and non-blank. Whatever sits in a free-form value
(``params``, trigger facts, manifest limits) is walked with the same bounds.

A refusal is :class:`InputInvalid` with SCHEMA_INVALID and the field it found;
the entry point records it where there is a flow or a principal to name. The
journal keeps its own last line of defence (``seal`` in kernel.journal.sealing): an
event whose canonical bytes do not decode back to an equal event is never
written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta

from kernel.core.reasons import ReasonCode
from kernel.core.text import ID_PATTERN, NAME_PATTERN, REASON_PATTERN, TEXT_PATTERN

T = TypeVar("T")

INT_MIN = -(2**63)
INT_MAX = 2**63 - 1
"""Every integer that enters lies within 64 signed bits (what msgpack and SQLite hold)."""

MAX_ID = 256
"""The longest id, name, kind, topic, version or hash the kernel records."""
MAX_REASON = 4096
"""The longest reason an operator gives for an act."""
MAX_TEXT = 32 * 1024
"""The longest free text (an agent's explanation) the kernel records."""
MAX_VALUE_CHARS = 64 * 1024
"""The longest string inside a free-form value (params, facts, limits)."""
MAX_DEPTH = 32
"""The deepest nesting of a free-form value."""
MAX_NODES = 10_000
"""The most values (scalars, lists, maps) one input may hold in all."""
MAX_CHARS = 1_000_000
"""The most characters of strings (keys included) one input may hold in all."""
MAX_TTL_S = 10 * 366 * 24 * 3600
"""The longest an amendment may last: ten years, well inside 64-bit nanoseconds."""
MAX_DETAIL = 1000
"""How much of a value a refusal quotes back."""

# What a field's text may hold is one rule, kept in kernel.core.text: every string
# encodes as UTF-8; ids and names take no control character; free text keeps tabs and
# line breaks only. The specs below hold it as msgspec patterns.

Int64 = Annotated[int, Meta(ge=INT_MIN, le=INT_MAX)]
Id = Annotated[str, Meta(max_length=MAX_ID, pattern=ID_PATTERN)]
Name = Annotated[str, Meta(min_length=1, max_length=MAX_ID, pattern=NAME_PATTERN)]
"""An id that must be given: an operator's name, an agent, a flow."""
Reason = Annotated[str, Meta(min_length=1, max_length=MAX_REASON, pattern=REASON_PATTERN)]
Text = Annotated[str, Meta(max_length=MAX_TEXT, pattern=TEXT_PATTERN)]
Confidence = Annotated[float, Meta(ge=0.0, le=1.0)]
Seconds = Annotated[float, Meta(gt=0.0, le=MAX_TTL_S)]
Tokens = Annotated[int, Meta(ge=0, le=INT_MAX)]


class InputInvalid(ValueError):
    """Input refused at the kernel's boundary: wrongly typed, out of range or oversized.

    ``reason_code`` is SCHEMA_INVALID; ``field`` names what was wrong (``$`` for the whole).
    """

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"SCHEMA_INVALID: {field}: {detail}")
        self.reason_code = ReasonCode.SCHEMA_INVALID
        self.field = field
        self.detail = detail


# --- the specs: one per struct that crosses the API or the inbox ---------------------


class _Spec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class ProposalSpec(_Spec, frozen=True):
    kind: Id
    params: dict[Id, Any] = {}
    version: Id = ""
    explain: Text = ""
    confidence: Confidence = 1.0
    valid_until_ns: Int64 | None = None
    context_ref: Id = ""


class ManifestSpec(_Spec, frozen=True):
    agent_id: Name
    version: Id
    capabilities: list[Id] = []
    subscriptions: list[Id] = []
    limits: dict[Id, Any] = {}
    max_attempts: Annotated[int, Meta(ge=1, le=1000)] = 3
    agent_version: Id = ""


TraceParent = Annotated[
    str, Meta(pattern=r"^$|^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
]
"""A W3C ``traceparent`` (version-trace id-span id-flags, lower-case hex), or empty."""


class TriggerSpec(_Spec, frozen=True):
    topic: Name
    facts: dict[Id, Any] = {}
    source: Id = ""
    parent: Id | None = None
    traceparent: TraceParent = ""


class DecisionSpec(_Spec, frozen=True):
    dfid: Name
    decision: Annotated[str, Meta(max_length=32)]
    operator: Name
    reason: Reason
    params: dict[Id, Any] | None = None
    action_hash: Id | None = None


class AmendmentSpec(_Spec, frozen=True):
    agent_id: Name
    limit: Name
    value: Int64 | Annotated[str, Meta(min_length=1, max_length=64)]
    ttl_s: Seconds
    operator: Name
    reason: Reason


class AgentStatusSpec(_Spec, frozen=True):
    agent_id: Name
    status: Annotated[str, Meta(max_length=32)]
    operator: Name
    reason: Reason


class RuleDecisionSpec(_Spec, frozen=True):
    proposal_seq: Annotated[int, Meta(ge=1, le=INT_MAX)]
    decision: Annotated[str, Meta(max_length=32)]
    operator: Name
    reason: Reason


class RuleProposalSpec(_Spec, frozen=True):
    rule: Name
    title: Text
    content: Text
    operator: Name
    reason: Reason
    labels: list[Id] = []
    base_version: Annotated[int, Meta(ge=0, le=INT_MAX)] = 0
    ns: Name = "default"
    input_event: Id = ""


class RuleRetractionSpec(_Spec, frozen=True):
    rule: Name
    operator: Name
    reason: Reason
    ns: Name = "default"


MAX_SUMMARY = 1000
"""The longest summary of an artifact (what a context shows beside its reference)."""


class ArtifactSpec(_Spec, frozen=True):
    """What is recorded of an artifact put in the store (the bytes are checked apart)."""

    media_type: Annotated[str, Meta(min_length=1, max_length=128, pattern=NAME_PATTERN)]
    summary: Annotated[str, Meta(max_length=MAX_SUMMARY, pattern=TEXT_PATTERN)] = ""
    by: Id = ""
    name: Id = ""


class SubmissionSpec(_Spec, frozen=True):
    """What names a submission before its proposal is read: the session token and the flow."""

    token: Id
    dfid: Name


class HumanActSpec(_Spec, frozen=True):
    operator: Name
    reason: Reason


class AgentSpec(_Spec, frozen=True):
    agent_id: Name


class UsageSpec(_Spec, frozen=True):
    tokens: Tokens
    model: Id = ""


# --- admitting a value -------------------------------------------------------------


def admit(value: Any, spec: type[T]) -> T:
    """Decode ``value`` (a Struct, a mapping, builtins) into ``spec``, strictly.

    Raises:
        InputInvalid: naming the first field that is wrongly typed, out of range or too long.
    """
    try:
        builtins = msgspec.to_builtins(value)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise InputInvalid("$", f"not plain data: {exc}"[:MAX_DETAIL]) from None
    check_value(builtins)
    try:
        return msgspec.convert(builtins, spec, strict=True)
    except msgspec.ValidationError as exc:
        field = _field_of(exc)
        raise InputInvalid(field, _explained(exc, builtins, field)[:MAX_DETAIL]) from None


def who_and_why(operator: Any, reason: Any) -> str | None:
    """Return why an operator's name and reason cannot be recorded for a human act, or None."""
    try:
        admit({"operator": operator, "reason": reason}, HumanActSpec)
    except InputInvalid as exc:
        return (
            f"a human act names its --operator (up to {MAX_ID} characters) and a --reason"
            f" (up to {MAX_REASON}), neither blank: {exc.field}: {exc.detail}"
        )
    return None


def fields(**values: Any) -> dict[str, Any]:
    """Return keyword arguments as a mapping to :func:`admit` (reads better at call sites)."""
    return values


def check_value(value: Any, path: str = "$") -> None:
    """Check a free-form value: JSON types only, 64-bit ints, finite floats, bounded size.

    Raises:
        InputInvalid: naming the path of the first value out of bounds.
    """
    # A value's path is kept as (its parent's path, its key or index) and spelled out
    # only when the value is refused: most values pass, and most paths are never read.
    stack: list[tuple[Any, Any, int]] = [(value, path, 0)]
    nodes = chars = 0
    while stack:
        item, where, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise InputInvalid("$", f"more than {MAX_NODES} values in all")
        if depth > MAX_DEPTH:
            raise InputInvalid(_spelled(where), f"nested deeper than {MAX_DEPTH} levels")
        if item is None or item is True or item is False:
            continue
        kind: type | None = type(item)
        if kind not in _PLAIN:
            kind = _plain_kind(item)
        if kind is int:
            if not INT_MIN <= item <= INT_MAX:
                raise InputInvalid(_spelled(where), "an integer outside 64 bits")
        elif kind is float:
            if not math.isfinite(item):
                raise InputInvalid(_spelled(where), f"{item} is not a finite number")
        elif kind is str:
            chars = _text(item, where, chars)
        elif kind is list:
            stack.extend((v, (where, i), depth + 1) for i, v in enumerate(item))
        elif kind is dict:
            chars = _members(item, where, depth, stack, chars)
        else:
            raise InputInvalid(_spelled(where), f"a {type(item).__name__} is not plain data")


_PLAIN = frozenset({int, float, str, list, dict})


def _text(item: str, where: Any, chars: int) -> int:
    """Check one string of a value; return the characters counted so far with it."""
    if not item.isascii():
        _check_utf8(item, where)
    chars += len(item)
    if chars > MAX_CHARS:
        raise InputInvalid("$", f"more than {MAX_CHARS} characters of text in all")
    if len(item) > MAX_VALUE_CHARS:
        raise InputInvalid(
            _spelled(where), f"a string of {len(item)} characters, over {MAX_VALUE_CHARS}"
        )
    return chars


def _members(
    item: Mapping[Any, Any], where: Any, depth: int, stack: list[tuple[Any, Any, int]], chars: int
) -> int:
    """Check a mapping's keys and queue its values; return the characters counted so far."""
    for key, v in item.items():
        if not isinstance(key, str):
            raise InputInvalid(_spelled(where), f"a key that is not a string: {key!r}"[:200])
        if not key.isascii():
            _check_utf8(key, where, "a key")
        chars += len(key)
        stack.append((v, (where, key), depth + 1))
    return chars


def _check_utf8(text: str, where: Any, what: str = "text") -> None:
    """Refuse a string that does not encode as UTF-8: it holds a lone surrogate.

    Python strings may (``"\\ud800"``, or ``"\\udcff"`` from an argument byte that is
    not UTF-8 under ``surrogateescape``), JSON text and the journal may not: such a
    string is refused here, naming the character, never at the journal's seal.
    """
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise InputInvalid(
            _spelled(where),
            f"{what} with a lone surrogate U+{ord(text[exc.start]):04X} at character"
            f" {exc.start}: not UTF-8 text",
        ) from None


def _plain_kind(item: Any) -> type | None:
    """Return which plain type a subclass counts as (int, float, str, list, dict), or None."""
    for kind in (int, float, str, list):
        if isinstance(item, kind):
            return kind
    return dict if isinstance(item, Mapping) else None


def _spelled(where: Any) -> str:
    """Spell out a path kept as nested (parent, key or index) pairs, as the field to name."""
    parts: list[str] = []
    while isinstance(where, tuple):
        where, step = where
        parts.append(f"[{step}]" if isinstance(step, int) else f".{step[:64]}")
    parts.append(where)
    return _bare("".join(reversed(parts)))


def visible(text: str) -> str:
    """Return ``text`` with every character that is not printable shown as an escape.

    C0 and C1 controls, DEL, lone surrogates, format characters (bidirectional
    overrides) and separators other than the space become ``\\x1b``, ``\\x9b``,
    ``\\udcff``, ``\\u202e``: what a terminal would obey, or a journal could not hold,
    is shown instead. Printable text (any script) is returned as it is. ``dirk``'s
    printers show every recorded string through this; refusals record through
    :func:`clip`, which uses it too.
    """
    if text.isprintable():
        return text
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in text
    )


def clip(text: Any, limit: int = MAX_ID) -> str:
    """Return ``text`` as a string of at most ``limit`` characters, saying so when it was cut.

    What is not printable is shown as an escape (:func:`visible`): a refusal quotes
    what it refused, and must be recordable whatever that was.
    """
    shown: str = visible(text) if isinstance(text, str) else visible(_repr(text))
    if len(shown) <= limit:
        return shown
    note = f"... ({len(shown)} chars, cut)"
    return shown[: max(0, limit - len(note))] + note


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:  # a hostile __repr__ (or one too deep) still gets a record
        return f"<{type(value).__name__}: repr failed: {type(exc).__name__}>"


_PATTERNS = {
    ID_PATTERN: ("an id or name", "takes no control character (C0, C1 or DEL)", ""),
    NAME_PATTERN: ("a name", "is not blank and takes no control character (C0, C1 or DEL)", ""),
    TEXT_PATTERN: ("free text", "keeps tabs and line breaks, no other control", "\t\n\r"),
    REASON_PATTERN: (
        "a reason",
        "is not blank and keeps tabs and line breaks, no other control",
        "\t\n\r",
    ),
}


def _explained(exc: msgspec.ValidationError, value: Any, field: str) -> str:
    """Say in words what a field's text pattern refused (msgspec names only the regex)."""
    text = str(exc)
    for pattern, (what, rule, kept) in _PATTERNS.items():
        if f"matching regex {pattern!r}" not in text:
            continue
        if "` in `" in text:
            return f"a key of this map is {what} that {rule}"
        found = _at(value, field)
        if not isinstance(found, str):
            return f"{what} {rule}"
        for where, char in enumerate(found):
            code = ord(char)
            if (code < 0x20 or 0x7F <= code <= 0x9F) and char not in kept:
                return f"{what} {rule}: U+{code:04X} at character {where}"
        return f"{what} {rule}: this one is blank"
    return text


def _at(value: Any, field: str) -> Any:
    """Return the value at a field as :func:`_field_of` names it (``a.b[2]``), or None."""
    for part in field.replace("[", ".[").split("."):
        if not part:
            continue
        if part.startswith("[") and part.endswith("]") and part[1:-1].isdigit():
            index = int(part[1:-1])
            value = value[index] if isinstance(value, list) and index < len(value) else None
        else:
            value = value.get(part) if isinstance(value, dict) else None
    return value


def _bare(path: str) -> str:
    return path.removeprefix("$.").removeprefix("$") or "$"


def _field_of(exc: msgspec.ValidationError) -> str:
    text = str(exc)
    if "` in `" in text:
        # A key of a map was refused ("... - at `key` in `$.params`"): name the map.
        return _bare(text.rsplit("` in `", 1)[1].rstrip("`"))
    if " - at `" in text:
        return _bare(text.rsplit(" - at `", 1)[1].rstrip("`"))
    for marker in ("unknown field `", "missing required field `"):
        if marker in text:
            return text.split(marker, 1)[1].split("`", 1)[0]
    return "$"
