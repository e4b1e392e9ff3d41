"""Sealing and checking rows: what makes an event a journal row, the same in every store.

:func:`seal` numbers, stamps and chains a caller's drafts into rows (seq, type,
dfid, canonical body, hash); :func:`check_row` is its inverse, used when a
journal is opened, followed, verified or copied. Neither touches a database,
so a row sealed for SQLite and one sealed for PostgreSQL are the same bytes.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from msgspec import inspect as mi

from kernel.core.events import Draft, Event, canonical, chain, decode_body, event_type, stamp
from kernel.journal.codec import unpack
from kernel.journal.head import Row


class EventUnreadable(ValueError):
    """An event refused before it was written: it has no canonical bytes (text that is not
    UTF-8, an object JSON cannot hold), or they do not decode back to it."""


def seal(
    drafts: Sequence[Draft], seq: int, prev: bytes, ts: int, key: bytes | None = None
) -> tuple[list[Row], list[Event]]:
    """Number, stamp and chain one caller's drafts after event ``seq``, whose hash is ``prev``.

    A negative ``caused_by`` (-k: the event k places before, in this append) becomes a seq
    here. With a chain ``key`` each hash is an HMAC (see :func:`kernel.core.events.chain`).
    """
    rows: list[Row] = []
    events: list[Event] = []
    prev_hex = prev.hex()
    for position, draft in enumerate(drafts):
        seq += 1
        # A cause that is not an integer at all is the event's own fault: the round-trip
        # check refuses it below, rather than a comparison failing here with a TypeError.
        if isinstance(draft.caused_by, int) and draft.caused_by < 0:
            if -draft.caused_by > position:
                raise ValueError(f"caused_by={draft.caused_by} reaches outside its append")
            draft = msgspec.structs.replace(draft, caused_by=seq + draft.caused_by)
        event = stamp(draft, seq, ts)
        try:
            body = canonical(event)
        except (TypeError, ValueError, OverflowError) as exc:
            # A lone surrogate (UnicodeEncodeError), an object JSON has no form for, an
            # integer past 64 bits: refused as the event's own fault, never the journal's.
            name = event_type(draft.payload)
            raise EventUnreadable(f"{name} cannot be written: {exc}") from None
        _check_round_trip(event, body)
        hash_ = chain(prev, body, key)
        hash_hex = hash_.hex()
        rows.append((seq, event_type(draft.payload), draft.dfid, body, hash_))
        events.append(msgspec.structs.replace(event, prev_hash=prev_hex, hash=hash_hex))
        prev, prev_hex = hash_, hash_hex
    return rows, events


def _check_round_trip(event: Event, body: bytes) -> None:
    """Refuse an event whose stored bytes would not read back as the same event.

    JSON writes ``nan`` as ``null`` and a tuple as a list; msgpack, which hashes the
    projections and stores snapshots, cannot hold an integer outside 64 bits. Any of
    these would leave a journal the next open cannot read, so the append fails instead
    (only its own caller: see ``Journal._commit``).

    An event whose every value is of exactly its field's type and provably survives both
    codecs (:func:`reads_back`) skips the decode and compare: the verdict is the same,
    since the full check runs for every other event and decides.

    Raises:
        EventUnreadable: the event does not survive encode, decode, compare.
    """
    if not reads_back(event):
        _full_round_trip(event, body)


def _full_round_trip(event: Event, body: bytes) -> None:
    """Decode ``body`` back into an Event, msgpack-encode its payload, compare: the check
    itself, which decides every event :func:`reads_back` cannot vouch for.

    Raises:
        EventUnreadable: the event does not survive encode, decode, compare.
    """
    try:
        back = _round_trip_decoder.decode(body)
        _msgpack_probe.encode(event.payload)
    except (msgspec.DecodeError, OverflowError, TypeError, ValueError) as exc:
        raise EventUnreadable(f"{event_type(event.payload)} would not read back: {exc}") from None
    if back != event:
        raise EventUnreadable(
            f"{event_type(event.payload)} would read back as another event"
            " (a non-finite float, a tuple or another type JSON does not keep)"
        )


_round_trip_decoder = _decoder = msgspec.json.Decoder(Event)
_msgpack_probe = msgspec.msgpack.Encoder()


def row_problem(
    row: Any, expected_seq: int, prev: bytes, key: bytes | None = None, hashes_checked: bool = True
) -> str:
    """Return what is wrong with a row; "" if it is event ``expected_seq`` chained to ``prev``.

    ``key`` is the chain key of a keyed journal; ``hashes_checked`` False skips the
    hash (a keyed journal read without its key).
    """
    return check_row(row, expected_seq, prev, key, hashes_checked)[0]


def check_row(
    row: Any,
    expected_seq: int,
    prev: bytes,
    key: bytes | None,
    hashes_checked: bool,
    with_hashes: bool = True,
    with_columns: bool = True,
) -> tuple[str, Event | None]:
    """Return ("", the event) if the row is event ``expected_seq`` chained to ``prev``,
    else (what is wrong, None).

    ``with_hashes`` False leaves the event's ``prev_hash`` and ``hash`` empty (a check
    that only needs to know the row is sound skips writing them out in hex);
    ``with_columns`` False skips comparing the type and dfid columns with the body (a
    read that did not fetch them compares what it asked for itself).
    """
    seq, type_, dfid, body, hash_ = row
    if seq != expected_seq:
        if seq > expected_seq:
            return f"event {expected_seq} is missing (the next row is event {seq})", None
        return f"unexpected row with seq {seq}", None
    if not isinstance(body, bytes) or not isinstance(hash_, bytes):
        return f"event {seq} is not stored as bytes", None
    try:
        # The stored body may be compressed; the hash is over the canonical bytes.
        body = unpack(body)
        event = decode_body(body, prev, hash_) if with_hashes else _decoder.decode(body)
    except (ValueError, TypeError) as exc:
        # msgspec.DecodeError, or UnicodeDecodeError for bytes that are not UTF-8.
        return f"event {seq} does not decode ({exc})", None
    if event.seq != seq:
        return f"event {seq} records seq {event.seq} in its body", None
    if hashes_checked and hash_ != chain(prev, body, key):
        return f"event {seq} does not match its hash: its body or hash was altered", None
    if with_columns and (type_ != event.type or dfid != event.dfid):
        return f"event {seq} has type or dfid columns that differ from its body", None
    return "", event


def check_rows(
    rows: Sequence[Any], expected_seq: int, prev: bytes, key: bytes | None, hashes_checked: bool
) -> tuple[list[Event], str]:
    """Check consecutive rows from event ``expected_seq`` on, chained to ``prev``.

    Returns:
        The events of the rows that checked out, in order, without their chain hashes
        (``prev_hash`` and ``hash`` empty), and what is wrong with the next row ("" when
        every row checked out).

    The same checks as :func:`check_row` row by row, in a loop that replay and verify
    run for every event: a row that is not plainly sound is handed to
    :func:`check_row`, which says what is wrong with it, so both give one verdict.
    """
    events: list[Event] = []
    append = events.append
    decode = _decoder.decode
    sha256 = hashlib.sha256
    fast_hash = hashes_checked and key is None
    for row in rows:
        seq, type_, dfid, body, hash_ = row
        try:
            if seq != expected_seq or type(body) is not bytes or type(hash_) is not bytes:
                raise _Unsound
            body = unpack(body)
            event = decode(body)
            if (
                event.seq != seq
                or (
                    hash_ != sha256(prev + body).digest()
                    if fast_hash
                    else hashes_checked and hash_ != chain(prev, body, key)
                )
                or type_ != type(event.payload).__name__
                or dfid != event.dfid
            ):
                raise _Unsound
        except (_Unsound, ValueError, TypeError):
            problem, event_ = check_row(row, expected_seq, prev, key, hashes_checked, False)
            if event_ is None:
                return events, problem
            event = event_
        append(event)
        expected_seq, prev = expected_seq + 1, hash_
    return events, ""


class _Unsound(Exception):
    """A row :func:`check_rows` leaves to :func:`check_row` to judge."""


# The round-trip check only where it can fail. Most payloads hold only text, bools,
# enum members, integers and structs of those: for them the decode and compare can only
# fail if a value is not of its field's type (a struct does not check the types it is
# built with), an integer is past 64 bits, or a free-form value (``Any``) is not plain
# JSON. :func:`reads_back` answers exactly that, in code generated once per struct type
# from msgspec's type information; anything it cannot prove (a declared tuple, a
# constrained field, a union JSON cannot tell apart, a subclass, a tuple or a set where
# JSON keeps a list, ``nan``) goes to the full check, which decides.

_INT_LOW, _INT_END = -(2**63), 2**64
"""The integers msgpack can hold (int64 and uint64); JSON reads back all of them."""
_PLAIN_DEPTH = 32
"""How deep :func:`_plain` follows lists and dicts before it leaves a value to the full
check (which meets msgspec's own limits and Python's stack far deeper)."""
_STR = frozenset({str})
_SCALARS = frozenset({str, bool, type(None)})
_NUMBERS = _SCALARS | {int, float}


def _plain(value: Any, depth: int = 0) -> bool:
    """Tell whether a value of a field typed ``Any`` reads back equal from JSON and encodes
    to msgpack: text, a bool, None, a 64-bit integer, a finite float, and lists and dicts
    with text keys of those, each of exactly that type (JSON reads a subclass back as its
    base, a tuple or a set as a list, ``nan`` and ``inf`` as ``null``)."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        number: int = value
        return _INT_LOW <= number < _INT_END
    if kind is float:
        return math.isfinite(value)
    if depth >= _PLAIN_DEPTH:
        return False
    if kind is list:
        for item in value:
            if not _plain(item, depth + 1):
                return False
        return True
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or not _plain(item, depth + 1):
                return False
        return True
    return False


def _plain_dict(value: dict[Any, Any]) -> bool:
    """:func:`_plain` for a ``dict[str, Any]`` field (facts, state, params, details), whose
    keys and values are mostly text: judged by their types in one pass each."""
    if not value:
        return True
    if not set(map(type, value)) <= _STR:
        return False
    kinds = set(map(type, value.values()))
    if kinds <= _SCALARS:
        return True
    if kinds <= _NUMBERS:
        # Quantities and amounts: judged in this loop, with no call per value.
        for item in value.values():
            if type(item) is int:
                if not _INT_LOW <= item < _INT_END:
                    return False
            elif type(item) is float and not math.isfinite(item):
                return False
        return True
    return all(_plain(item, 1) for item in value.values())


def _refuse(value: object) -> bool:
    """The proof for a struct type not proven: leave the value to the full check."""
    return False


class _Unprovable(Exception):
    """A type whose values :class:`_ProofWriter` cannot vouch for; the full check decides."""


class _ProofWriter:
    """Write, from msgspec's type information, one Python function per struct type that
    says whether a struct of that type provably survives encode, decode and compare.

    Generated source rather than closures: the proof runs for every sealed event, and a
    chain of small closures costs more than the decode it replaces (measured: 1.3-2.9 us
    an event against 0.7-2.2 for the full check; the generated functions 0.1-1.3).
    """

    def __init__(self) -> None:
        self.names: dict[str, Any] = {
            "_INT_LOW": _INT_LOW,
            "_INT_END": _INT_END,
            "_STR": _STR,
            "_plain": _plain,
            "_plain_dict": _plain_dict,
            "_refuse": _refuse,
            "_isfinite": math.isfinite,
        }
        self.functions: list[str] = []
        self.tables: list[str] = []
        self.structs: dict[type, str] = {}
        self.writing: set[type] = set()

    def constant(self, value: object) -> str:
        """Name ``value`` in the generated code's namespace."""
        name = f"_c{len(self.names)}"
        self.names[name] = value
        return name

    def expression(self, t: mi.Type, var: str, depth: int) -> str:
        """Return a Python expression true when ``var``, declared as ``t``, provably reads back.

        Raises:
            _Unprovable: no such expression (the full check decides every value of ``t``).
        """
        if isinstance(t, mi.StrType | mi.IntType | mi.FloatType | mi.ListType | mi.DictType):
            # A constraint (a length, a pattern, a bound) is checked on decode: not proven.
            constraints = set(t.__struct_fields__) - {"item_type", "key_type", "value_type"}
            if any(getattr(t, name) is not None for name in constraints):
                raise _Unprovable(t)
        match t:
            case mi.StrType():
                return f"type({var}) is str"
            case mi.BoolType():
                return f"type({var}) is bool"
            case mi.NoneType():
                return f"{var} is None"
            case mi.IntType():
                return f"(type({var}) is int and _INT_LOW <= {var} < _INT_END)"
            case mi.FloatType():
                # Every finite float is written in the digits that read back as itself.
                return f"(type({var}) is float and _isfinite({var}))"
            case mi.EnumType() if not issubclass(t.cls, enum.Flag):
                # A member is written as its value and read back as itself; only a Flag
                # has values that are not members.
                return f"type({var}) is {self.constant(t.cls)}"
            case mi.AnyType():
                return f"_plain({var})"
            case mi.StructType():
                return f"{self.struct(t)}({var})"
            case mi.ListType():
                return self.sequence(t.item_type, var, depth)
            case mi.DictType() if isinstance(t.key_type, mi.StrType):
                self.expression(t.key_type, "_", depth)  # a key with a constraint
                if isinstance(t.value_type, mi.AnyType):
                    return f"(type({var}) is dict and _plain_dict({var}))"
                item = f"_v{depth}"
                values = self.expression(t.value_type, item, depth + 1)
                return (
                    f"(type({var}) is dict and (not {var} or set(map(type, {var})) <= _STR"
                    f" and all({values} for {item} in {var}.values())))"
                )
            case mi.UnionType():
                return self.union(t, var, depth)
        raise _Unprovable(t)

    def sequence(self, item_type: mi.Type, var: str, depth: int) -> str:
        """Return the expression for a list of ``item_type``."""
        if isinstance(item_type, mi.StrType):
            self.expression(item_type, "_", depth)  # a constraint
            return f"(type({var}) is list and (not {var} or set(map(type, {var})) <= _STR))"
        item = f"_v{depth}"
        items = self.expression(item_type, item, depth + 1)
        # Most lists are empty: not even a generator is made for them.
        return f"(type({var}) is list and (not {var} or all({items} for {item} in {var})))"

    def union(self, t: mi.UnionType, var: str, depth: int) -> str:
        """Return the expression for a union: each member is told apart by its Python type
        and read back as the member of its JSON kind, which must be one member's alone."""
        kinds = [_json_kind(member) for member in t.types]
        objects = [kind for kind in kinds if kind[0] == "object"]
        if len(set(kinds)) < len(kinds) or (len(objects) > 1 and ("object", None) in objects):
            raise _Unprovable(t)
        parts = []
        structs: dict[type, Any] = {}
        for member in t.types:
            if isinstance(member, mi.StructType):
                try:
                    structs[member.cls] = self.struct(member)
                except _Unprovable:
                    pass  # its values go to the full check; the others' need not
            else:
                parts.append(self.expression(member, var, depth))
        if structs:
            # Tagged structs (the payloads): one look-up by type, not a test per member.
            table = f"_table{len(self.tables)}"
            entries = ", ".join(f"{self.constant(c)}: {f}" for c, f in structs.items())
            self.tables.append(f"{table} = {{{entries}}}")
            parts.append(f"{table}.get(type({var}), _refuse)({var})")
        if not parts:
            raise _Unprovable(t)
        return "(" + " or ".join(parts) + ")"

    def struct(self, t: mi.StructType) -> str:
        """Return the name of the function proving a struct of type ``t``, writing it once.

        Raises:
            _Unprovable: the struct's own equality or ``__post_init__`` decides what reads
                back, it is recursive, or one of its fields cannot be proven.
        """
        cls = t.cls
        if cls in self.structs:
            return self.structs[cls]
        if (
            cls in self.writing
            or hasattr(cls, "__post_init__")
            or cls.__eq__ is not msgspec.Struct.__eq__
            or not cls.__struct_config__.eq
        ):
            raise _Unprovable(cls)
        self.writing.add(cls)
        try:
            lines = [f"    if type(v) is not {self.constant(cls)}:", "        return False"]
            for field in t.fields:
                lines.append(f"    x = v.{field.name}")
                lines.append(f"    if not {self.expression(field.type, 'x', 0)}:")
                lines.append("        return False")
        finally:
            self.writing.discard(cls)
        name = f"_proof_{len(self.structs)}_{cls.__name__}"
        self.functions.append("\n".join([f"def {name}(v):", *lines, "    return True"]))
        self.structs[cls] = name
        return name

    def build(self, t: mi.StructType) -> Callable[[Any], bool]:
        """Return the compiled proof of struct type ``t``.

        Raises:
            _Unprovable: ``t`` itself cannot be proven.
        """
        name = self.struct(t)
        source = "\n\n".join([*self.functions, *self.tables])
        namespace = dict(self.names)
        exec(compile(source, "<dirk round-trip proofs>", "exec"), namespace)
        proof: Callable[[Any], bool] = namespace[name]
        return proof


def _json_kind(t: mi.Type) -> tuple[str, str | None]:
    """Return what a value of ``t`` is written as in JSON; a tagged struct names its tag.

    Raises:
        _Unprovable: a type :class:`_ProofWriter` does not prove.
    """
    match t:
        case mi.StrType():
            return ("string", None)
        case mi.EnumType():
            return ("string" if issubclass(t.cls, str) else "number", None)
        case mi.IntType() | mi.FloatType():
            return ("number", None)
        case mi.BoolType():
            return ("bool", None)
        case mi.NoneType():
            return ("null", None)
        case mi.ListType():
            return ("array", None)
        case mi.DictType():
            return ("object", None)
        case mi.StructType():
            return ("object", str(t.tag) if t.tag_field else None)
    raise _Unprovable(t)


def prove(cls: type[msgspec.Struct]) -> Callable[[Any], bool]:
    """Return the proof for values of ``cls``: true when a value provably reads back as
    itself; false when only the full check can tell (a type that cannot be proven at all
    gets a proof that is always false)."""
    try:
        return _ProofWriter().build(mi.type_info(cls))  # type: ignore[arg-type]
    except _Unprovable:
        return _refuse


def reads_back(event: Event) -> bool:
    """Tell whether a stamped event provably reads back as itself (then it needs no decode
    and compare); False says only that the full check must decide."""
    return _event_proof(event)


def _first_proof(event: Event) -> bool:
    # Written at the first seal, not at import: every CLI command imports the journal.
    global _event_proof
    _event_proof = prove(Event)
    return _event_proof(event)


_event_proof: Callable[[Any], bool] = _first_proof
