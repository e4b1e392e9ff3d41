"""Tools from policy kinds: one signature, every parameter described; the gate never raises."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel import Decision, DecisionVerdict, ReasonCode
from kernel.audit import verify_journal
from kernel.frameworks import tool_spec, tool_specs
from kernel.policy import OneOf, PolicyKind, Range
from policies.booking import BOOKING
from policies.trading import TRADING
from tests.frameworks.support import CHEAP, TOOL, Hotel, booking_kernel
from tests.support.hostile import hostile_scalars, hostile_text, hostile_values

EXAMPLES = itertools.count()


def test_every_kind_of_the_shipped_packs_is_a_tool_with_each_parameter_described() -> None:
    for pack in (BOOKING, TRADING):
        specs = tool_specs(pack)
        assert [s.kind for s in specs] == [k.__struct_config__.tag for k in pack.kinds]
        for spec, kind in zip(specs, pack.kinds, strict=True):
            assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", spec.name), spec.name
            fields = set(kind.__struct_fields__)
            assert set(spec.parameters["properties"]) == fields  # no field lost or added
            assert all(p["description"].strip() for p in spec.parameters["properties"].values())
            assert spec.description and "``" not in spec.description
            assert set(spec.parameters["required"]) == fields - _defaulted(kind)


def _defaulted(kind: type[PolicyKind]) -> set[str]:
    names = kind.__struct_fields__
    defaults = kind.__struct_defaults__
    return set(names[len(names) - len(defaults) :])


def test_the_packs_bounds_are_in_the_words_not_in_the_schema() -> None:
    [reserve, _cancel] = tool_specs(BOOKING)
    props = reserve.parameters["properties"]
    assert "at least 1 and at most 30" in props["nights"]["description"]
    assert "one of accessible, double, single, suite" in props["room_type"]["description"]
    # No enum, no minimum: an out-of-bounds call reaches the kernel, which says why.
    assert "enum" not in props["room_type"] and "maximum" not in props["nights"]
    assert props["guests"]["description"].endswith("default 1")
    assert reserve.name == TOOL and reserve.kind == "booking.reserve_room"


class Ship(PolicyKind, tag="depot.ship"):
    """Ship a parcel.

    Attributes:
        parcel: the parcel's id, as printed on
            its label.
        weight_g: the weight in grams.
    """

    adapter: ClassVar[str] = "depot"

    parcel: str
    weight_g: int
    to: Annotated[str, msgspec.Meta(description="the receiving depot")] = "north"


def test_a_kinds_own_words_describe_its_parameters() -> None:
    spec = tool_spec(
        Ship, (Range(Ship, "weight_g", min=1), OneOf(Ship, "to", frozenset({"north"})))
    )
    props = spec.parameters["properties"]
    assert props["parcel"]["description"] == "the parcel's id, as printed on its label."
    assert props["weight_g"]["description"] == "the weight in grams. (at least 1)"
    assert props["to"]["description"] == 'the receiving depot (one of north); default "north"'
    assert spec.description == "Ship a parcel."
    assert spec.name == "depot_ship" and spec.parameters["required"] == ["parcel", "weight_g"]


calls = st.fixed_dictionaries(
    {
        "tool": st.one_of(st.just(TOOL), hostile_text(max_size=30)),
        "args": st.one_of(st.just(CHEAP), hostile_values(max_leaves=8)),
        "conversation": st.one_of(st.none(), hostile_text(max_size=30), hostile_scalars()),
        "tool_call_id": st.one_of(st.none(), hostile_text(max_size=30), hostile_scalars()),
    }
)


@settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(proposed=st.lists(calls, min_size=1, max_size=4))
async def test_no_tool_call_a_model_makes_stops_the_kernel(
    tmp_path: Path, proposed: list[dict[str, Any]]
) -> None:
    path = tmp_path / f"j{next(EXAMPLES)}.db"  # tmp_path is shared by the examples
    async with booking_kernel(path, Hotel()) as gate:
        for call in proposed:
            decision = await gate.call(
                call["tool"],
                call["args"],
                conversation=call["conversation"],
                tool_call_id=call["tool_call_id"],
            )
            assert isinstance(decision, Decision)
            assert decision.verdict is DecisionVerdict.EXECUTED or isinstance(
                decision.reason_code, ReasonCode
            )
            assert gate.kernel.stopped is None
        cheap = await gate.call(TOOL, CHEAP, conversation="after", tool_call_id="x")
        assert cheap.verdict is DecisionVerdict.EXECUTED
    assert (await verify_journal(path)).ok


def test_each_framework_example_takes_at_most_ten_lines_of_dirk() -> None:
    """The examples mark their dirk lines (`# dirk`); with the imports from dirk, ten at most."""
    from tests.support import ROOT

    for name in ("openai_agents", "pydantic_ai", "langgraph"):
        lines = (ROOT / "examples" / "frameworks" / f"{name}.py").read_text().splitlines()
        imports = [ln for ln in lines if ln.startswith(("from kernel", "from examples"))]
        marked = [ln for ln in lines if "# dirk" in ln]
        assert 0 < len(imports) + len(marked) <= 10, name
