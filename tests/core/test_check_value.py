"""check_value spells a refused value's path only when it refuses: same verdicts as before."""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import IntEnum, StrEnum
from types import MappingProxyType
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.core import wall
from kernel.core.wall import InputInvalid, check_value


def eager_check_value(value: Any, path: str = "$") -> None:
    """The previous kernel's check, which built every value's path as it went."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    nodes = chars = 0
    while stack:
        item, where, depth = stack.pop()
        nodes += 1
        if nodes > wall.MAX_NODES:
            raise InputInvalid("$", f"more than {wall.MAX_NODES} values in all")
        if depth > wall.MAX_DEPTH:
            raise InputInvalid(wall._bare(where), f"nested deeper than {wall.MAX_DEPTH} levels")
        if item is None or item is True or item is False:
            continue
        if isinstance(item, int):
            if not wall.INT_MIN <= item <= wall.INT_MAX:
                raise InputInvalid(wall._bare(where), "an integer outside 64 bits")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InputInvalid(wall._bare(where), f"{item} is not a finite number")
        elif isinstance(item, str):
            chars += len(item)
            if chars > wall.MAX_CHARS:
                raise InputInvalid("$", f"more than {wall.MAX_CHARS} characters of text in all")
            if len(item) > wall.MAX_VALUE_CHARS:
                raise InputInvalid(
                    wall._bare(where),
                    f"a string of {len(item)} characters, over {wall.MAX_VALUE_CHARS}",
                )
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item))
        elif isinstance(item, Mapping):
            for key, v in item.items():
                if not isinstance(key, str):
                    raise InputInvalid(
                        wall._bare(where), f"a key that is not a string: {key!r}"[:200]
                    )
                chars += len(key)
                stack.append((v, f"{where}.{key[:64]}", depth + 1))
        else:
            raise InputInvalid(wall._bare(where), f"a {type(item).__name__} is not plain data")


class Level(IntEnum):
    LOW = 1


class Side(StrEnum):
    BUY = "buy"


leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from([Level.LOW, Side.BUY, b"bytes", (1, 2), {1, 2}, "k" * 70]),
)


def _trees(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.one_of(st.text(max_size=70), st.integers(0, 3))
    return st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(keys, children, max_size=4),
        st.dictionaries(st.text(max_size=5), children, max_size=3).map(MappingProxyType),
    )


values = st.recursive(leaves, _trees, max_leaves=30)


def verdict(check: Any, value: Any) -> tuple[str, str] | None:
    try:
        check(value)
    except InputInvalid as exc:
        return exc.field, exc.detail
    return None


@settings(max_examples=400, derandomize=True, deadline=None)
@given(values)
def test_same_verdict_and_same_field_as_the_eager_check(value: Any) -> None:
    assert verdict(check_value, value) == verdict(eager_check_value, value)


def test_deep_and_wide_values_are_refused_where_they_were() -> None:
    deep: Any = 1
    for _ in range(wall.MAX_DEPTH + 2):
        deep = {"a": [deep]}
    wide = list(range(wall.MAX_NODES + 1))
    for value in (deep, wide, {"x" * 80: [0, {"y": math.nan}]}, [[2**64]]):
        assert verdict(check_value, value) == verdict(eager_check_value, value)
        assert verdict(check_value, value) is not None
