"""The round-trip check only where it can fail: the proof refuses exactly what the full
check refuses.

:func:`kernel.journal.sealing.reads_back` lets an event skip the decode and compare when
every value is exactly of its field's type, 64-bit and plain JSON. These tests draw every
payload type of the kernel, field by field from its msgspec type information, with hostile
values mixed in (text with lone surrogates and controls, integers past 64 bits, ``nan``,
``inf``, tuples, sets, subclasses, raw enum values), and hold the proof to the full check:
whenever the proof vouches for an event, the full check passes it, and :func:`seal` gives
the same rows or the same refusal with the proof as without it.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec import inspect as mi

from kernel.core import events as ev
from kernel.core.events import GENESIS_HASH, Draft, Event, canonical
from kernel.core.reasons import ReasonCode
from kernel.journal import sealing
from kernel.journal.sealing import EventUnreadable, prove, reads_back, seal
from tests.core.test_events import SAMPLES
from tests.support.hostile import deeply_nested, hostile_scalars, hostile_text, hostile_values

PAYLOAD_TYPES: list[type[msgspec.Struct]] = list(ev.AnyPayload.__args__)
NAN, INF = float("nan"), float("inf")
EDGE_INTS = (2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30)


class Text(str):
    """A str subclass (msgspec writes none: refused before either check runs)."""


class Number(int):
    """An int subclass (likewise)."""


@functools.cache
def off_type() -> st.SearchStrategy[Any]:
    """Draw what a broken or hostile caller puts in a field whatever its declared type."""
    return st.one_of(
        hostile_values(max_leaves=6),
        hostile_scalars().map(lambda v: (v,)),
        st.lists(hostile_scalars(), max_size=3).map(tuple),
        st.frozensets(st.integers(-5, 5), max_size=3),
        st.sets(st.text(max_size=3), max_size=3),
        st.sampled_from(
            [
                NAN,
                INF,
                -INF,
                *EDGE_INTS,
                True,
                1.0,
                0,
                "",
                b"bytes",
                Text("sub"),
                Number(3),
                ReasonCode.EXPIRED,
                "EXPIRED",
                datetime(2026, 1, 1, tzinfo=UTC),
                deeply_nested(40),
                {1: "int key"},
                {"k": (1, 2)},
                [NAN],
                {"deep": deeply_nested(35)},
            ]
        ),
        st.builds(object),
    )


@functools.cache
def clean_any() -> st.SearchStrategy[Any]:
    """Draw plain JSON as an agent would send it: finite floats, 64-bit integers."""
    return st.recursive(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-(2**63), 2**64 - 1),
            st.floats(allow_nan=False, allow_infinity=False),
            hostile_text(max_size=12),
        ),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(hostile_text(max_size=8), inner, max_size=3),
        ),
        max_leaves=8,
    )


@st.composite
def field_value(draw: st.DrawFn, t: mi.Type, hostile: bool) -> Any:
    """Draw a value for a field of type ``t``; when ``hostile``, sometimes one of another type."""
    # How often a value is hostile is drawn once per event: some events have one wrong
    # value among many right ones, the case a proof could miss.
    if not hostile:
        return draw(typed(t, False))
    rate = draw(st.shared(st.sampled_from([2, 6, 20]), key="hostile rate"))
    choice = draw(st.sampled_from(range(rate + 1)))
    if choice == 0:
        return draw(off_type())
    return draw(typed(t, choice == 1))


def typed(t: mi.Type, hostile: bool) -> st.SearchStrategy[Any]:
    """Draw values of type ``t`` (hostile ones within the type: nan, huge ints, tuples, ...)."""
    match t:
        case mi.StrType():
            # The proof does not read text (JSON keeps every string it can write), so text
            # that cannot be written is only one case among others here.
            return st.one_of(st.text(max_size=12), hostile_text(max_size=16))
        case mi.IntType():
            edges = st.sampled_from(EDGE_INTS) if hostile else st.sampled_from(EDGE_INTS[:3])
            return st.one_of(st.integers(-(2**63), 2**64 - 1), edges)
        case mi.FloatType():
            return st.floats(allow_nan=hostile, allow_infinity=hostile)
        case mi.BoolType():
            return st.booleans()
        case mi.NoneType():
            return st.none()
        case mi.EnumType():
            members = list(t.cls)
            if hostile:
                return st.sampled_from([*members, *(m.value for m in members)])
            return st.sampled_from(members)
        case mi.AnyType():
            return st.one_of(hostile_values(max_leaves=8), off_type()) if hostile else clean_any()
        case mi.ListType():
            items = st.lists(field_value(t.item_type, hostile), max_size=3)
            return st.one_of(items, items.map(tuple)) if hostile else items
        case mi.DictType():
            return st.dictionaries(
                hostile_text(max_size=8), field_value(t.value_type, hostile), max_size=3
            )
        case mi.StructType():
            return struct_of(t, hostile)
        case mi.UnionType():
            return st.one_of(*(typed(member, hostile) for member in t.types))
    raise AssertionError(f"no strategy for {t}")


def struct_of(t: mi.StructType, hostile: bool) -> st.SearchStrategy[Any]:
    """Draw a struct of type ``t``, its optional fields sometimes left to their defaults."""
    required = {f.name: field_value(f.type, hostile) for f in t.fields if f.required}
    optional = {f.name: field_value(f.type, hostile) for f in t.fields if not f.required}
    return st.fixed_dictionaries(required, optional=optional).map(lambda kw: t.cls(**kw))


@functools.cache
def event_of(kind: type[msgspec.Struct], hostile: bool) -> st.SearchStrategy[Event]:
    """Draw a stamped event carrying a payload of ``kind``, its envelope drawn the same way."""
    info: Any = mi.type_info(Event)
    envelope = {
        f.name: field_value(f.type, hostile)
        for f in info.fields
        if f.name in ("dfid", "parent_dfid", "agent_id", "caused_by")
    }
    return st.builds(
        Event,
        seq=st.integers(1, 2**40),
        ts=st.integers(0, 2**63 - 1),
        payload=struct_of(mi.type_info(kind), hostile),  # type: ignore[arg-type]
        **envelope,
    )


def full_verdict(event: Event) -> str:
    """The full check's verdict on ``event``: "" if it reads back, else why not."""
    try:
        body = canonical(event)
    except (TypeError, ValueError, OverflowError) as exc:
        return f"no canonical bytes: {type(exc).__name__}"
    try:
        sealing._full_round_trip(event, body)
    except EventUnreadable as exc:
        return str(exc)
    return ""


def sealed(draft: Draft) -> tuple[str, bytes]:
    """Seal ``draft`` alone: ("", its hash) or (the refusal, b"")."""
    try:
        rows, _ = seal([draft], 0, GENESIS_HASH, 1_700_000_000_000_000_000)
    except (EventUnreadable, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}", b""
    return "", rows[0][4]


@contextmanager
def without_proof() -> Iterator[None]:
    """Seal as before the proof: the full check for every event."""
    saved = sealing._event_proof
    sealing._event_proof = sealing._refuse
    try:
        yield
    finally:
        sealing._event_proof = saved


@pytest.mark.parametrize("kind", PAYLOAD_TYPES, ids=lambda kind: kind.__name__)
@settings(
    max_examples=30, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(data=st.data())
def test_the_proof_refuses_exactly_what_the_full_check_refuses(
    kind: type[msgspec.Struct], data: st.DataObject
) -> None:
    event = data.draw(event_of(kind, hostile=True))
    verdict = full_verdict(event)
    if reads_back(event) and not verdict.startswith("no canonical bytes"):
        # (Text JSON cannot write is refused before either check runs.)
        assert verdict == "", f"the proof vouched for an event the full check refuses: {verdict}"
    draft = Draft(
        payload=event.payload,
        dfid=event.dfid,
        parent_dfid=event.parent_dfid,
        caused_by=event.caused_by,
        agent_id=event.agent_id,
    )
    with without_proof():
        before = sealed(draft)
    assert sealed(draft) == before


@pytest.mark.parametrize("kind", PAYLOAD_TYPES, ids=lambda kind: kind.__name__)
@settings(
    max_examples=10, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(data=st.data())
def test_well_typed_events_take_the_fast_path(
    kind: type[msgspec.Struct], data: st.DataObject
) -> None:
    # Without this the lever would do nothing: every payload type, built as the kernel
    # builds it, is vouched for, and (when it has canonical bytes) the full check agrees.
    event = data.draw(event_of(kind, hostile=False))
    assert reads_back(event)
    verdict = full_verdict(event)
    assert verdict == "" or verdict.startswith("no canonical bytes")


def test_every_sample_event_takes_the_fast_path() -> None:
    for seq, payload in enumerate(SAMPLES, 1):
        event = Event(seq=seq, ts=seq, payload=payload, dfid="d", agent_id="a", caused_by=1)
        assert reads_back(event), type(payload).__name__
        assert full_verdict(event) == ""


@pytest.mark.parametrize(
    ("value", "reads_back_as_itself"),
    [
        (NAN, False),
        (INF, False),
        (2**64, False),
        (-(2**63) - 1, False),
        ((1, 2), False),
        ({"a": [1, (2,)]}, False),
        ({1: "int key"}, False),
        ({"x"}, False),
        (Text("sub"), False),
        (Number(3), False),
        (deeply_nested(40), True),  # deeper than the proof follows
        (datetime(2026, 1, 1, tzinfo=UTC), False),
    ],
    ids=repr,
)
def test_what_the_proof_leaves_to_the_full_check(value: Any, reads_back_as_itself: bool) -> None:
    event = Event(seq=1, ts=1, payload=ev.TriggerFired(topic="t", facts={"x": value}))
    assert not reads_back(event)
    assert (full_verdict(event) == "") is reads_back_as_itself


@pytest.mark.parametrize(
    "payload",
    [
        ev.ContextCompiled(attempt=True, context_ref="c"),  # a bool where an int is declared
        ev.ContextCompiled(attempt=2**64, context_ref="c"),
        ev.ContextCompiled(attempt=1, context_ref=Text("c")),
        ev.ContextCompiled(attempt=1, context_ref="c", dropped=("a",)),  # type: ignore[arg-type]
        ev.ProposalSubmitted(attempt=1, proposal=ev.ProposalRecord(kind="k", confidence=NAN)),
        ev.ProposalSubmitted(attempt=1, proposal=ev.ProposalRecord(kind="k", confidence=1)),
        ev.ProposalSubmitted(attempt=1, proposal=ev.FlowClosed()),  # type: ignore[arg-type]
        ev.AgentRefused(reason_code="EXPIRED"),  # type: ignore[arg-type]
        ev.FlowClosed(),
    ],
    ids=repr,
)
def test_a_value_not_exactly_of_its_type_goes_to_the_full_check(payload: Any) -> None:
    event = Event(seq=1, ts=1, payload=payload)
    proved = reads_back(event)
    assert proved is (type(payload) is ev.FlowClosed)
    if proved:
        assert full_verdict(event) == ""


def test_the_envelope_is_proven_too() -> None:
    good = Event(seq=1, ts=1, payload=ev.FlowClosed(), dfid="d", caused_by=2**63 - 1)
    assert reads_back(good)
    for bad in (
        msgspec.structs.replace(good, dfid=7),
        msgspec.structs.replace(good, caused_by=2**64),
        msgspec.structs.replace(good, agent_id=Text("a")),
        msgspec.structs.replace(good, ts=NAN),
    ):
        assert not reads_back(bad)


class Colour(enum.Flag):
    RED = 1
    BLUE = 2


class WithTuple(msgspec.Struct, tag=True):
    pair: tuple[int, int]


class WithLiteral(msgspec.Struct, tag=True):
    side: Literal["buy", "sell"]


class WithBound(msgspec.Struct, tag=True):
    size: Annotated[int, msgspec.Meta(ge=0)]


class WithDate(msgspec.Struct, tag=True):
    at: datetime


class WithFlag(msgspec.Struct, tag=True):
    colour: Colour


class Ambiguous(msgspec.Struct, tag=True):
    amount: int | float


class Checked(msgspec.Struct, tag=True):
    name: str

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a name")


class Node(msgspec.Struct, tag=True):
    children: list[Node] = []


class Plain(msgspec.Struct, tag=True):
    name: str
    sizes: dict[str, int] = {}
    maybe: Checked | None = None


@pytest.mark.parametrize(
    "value",
    [
        WithTuple(pair=(1, 2)),
        WithLiteral(side="buy"),
        WithBound(size=1),
        WithDate(at=datetime(2026, 1, 1, tzinfo=UTC)),
        WithFlag(colour=Colour.RED | Colour.BLUE),
        Ambiguous(amount=1),
        Checked(name="x"),
        Node(children=[Node()]),
    ],
    ids=lambda value: type(value).__name__,
)
def test_a_type_it_cannot_prove_gets_the_full_check(value: msgspec.Struct) -> None:
    # A declared tuple, a constraint, a Literal, a type JSON writes as text, a Flag, a
    # union JSON cannot tell apart, a __post_init__, a recursive type: never vouched for.
    assert prove(type(value))(value) is False


def test_a_union_member_it_cannot_prove_leaves_only_that_member_to_the_full_check() -> None:
    proof = prove(Plain)
    assert proof(Plain(name="n", sizes={"a": 1}))
    assert not proof(Plain(name="n", sizes={"a": 2**64}))
    assert not proof(Plain(name="n", maybe=Checked(name="x")))


def test_the_fast_path_is_taken_when_sealing(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[bytes] = []
    full = sealing._full_round_trip

    def counting(event: Event, body: bytes) -> None:
        decoded.append(body)
        full(event, body)

    monkeypatch.setattr(sealing, "_full_round_trip", counting)
    drafts = [Draft(payload=payload, dfid="d") for payload in SAMPLES]
    rows, _ = seal(drafts, 0, GENESIS_HASH, 1)
    assert len(rows) == len(SAMPLES) and decoded == []
    bad = Draft(payload=ev.TriggerFired(topic="t", facts={"x": math.nan}))
    with pytest.raises(EventUnreadable):
        seal([bad], 0, GENESIS_HASH, 1)
    assert len(decoded) == 1
