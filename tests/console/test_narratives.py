"""Every event type reads in words: the console's narrative and ``dirk show`` never print JSON.

Each type of the journal's union is built with sample values of its fields' types
and narrated; the words must be the type's own (not the catch-all for types this
module does not know, and never the event's JSON).
"""

from __future__ import annotations

import enum
import types
import typing
from typing import Any

import msgspec
import pytest

from kernel.audit.narrative import narrate
from kernel.core import events as ev

PAYLOADS = typing.get_args(ev.AnyPayload)


def sample(kind: Any) -> Any:
    """A plausible value of type ``kind``."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        arms = [arm for arm in typing.get_args(kind) if arm is not type(None)]
        return sample(arms[0])
    if origin is typing.Literal:
        return typing.get_args(kind)[0]
    if origin is typing.Annotated:
        return sample(typing.get_args(kind)[0])
    if origin in (list, tuple, set, frozenset) or kind in (list, tuple):
        args = typing.get_args(kind)
        return [sample(args[0])] if args and args[0] is not Ellipsis else []
    if origin is dict or kind is dict:
        return {"k": "v"}
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return next(iter(kind))
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        hints = typing.get_type_hints(kind, include_extras=True)
        return kind(
            **{f.name: sample(hints[f.name]) for f in msgspec.structs.fields(kind) if f.required}
        )
    if kind is bool:
        return True
    if kind is int:
        return 7
    if kind is float:
        return 0.5
    if kind is bytes:
        return b"x"
    if isinstance(kind, typing.NewType):
        return sample(kind.__supertype__)
    return "sample"


@pytest.mark.parametrize("payload_type", PAYLOADS, ids=lambda t: t.__name__)
def test_every_event_type_has_a_narrative_in_words(payload_type: type[msgspec.Struct]) -> None:
    payload = sample(payload_type)
    event = ev.Event(seq=9, ts=1, payload=payload)
    text = narrate(event)
    assert text and not text.startswith(f"{payload_type.__name__}:"), text
    assert "{" not in text.split("explain")[0] or payload_type in (
        ev.ProposalSubmitted,
        ev.HumanDecided,
    ), text


def test_a_type_no_narrative_knows_still_reads_as_its_fields() -> None:
    class Invented(msgspec.Struct, frozen=True, kw_only=True):
        what: str

    event = ev.Event(seq=1, ts=1, payload=Invented(what="x"))  # type: ignore[arg-type]
    assert narrate(event) == "Invented: what='x'"
