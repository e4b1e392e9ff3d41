"""The edges' rule for text (kernel.core.text) against the characters it names."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kernel.core.text import free_text_problem, id_problem, utf8_problem, value_problem
from tests.support.hostile import C0, C1, DEL, hostile_text, hostile_values, is_utf8

CONTROLS = frozenset((*C0, *C1, DEL))
LINE = frozenset("\t\n\r")


@given(hostile_text(max_size=60))
def test_an_id_is_utf8_text_without_any_control(text: str) -> None:
    refused = id_problem(text) is not None
    assert refused == (not is_utf8(text) or any(c in CONTROLS for c in text))


@given(hostile_text(max_size=60))
def test_free_text_keeps_tabs_and_line_breaks_only(text: str) -> None:
    refused = free_text_problem(text) is not None
    assert refused == (not is_utf8(text) or any(c in CONTROLS - LINE for c in text))


@given(hostile_text(max_size=60))
def test_a_refusal_never_holds_a_lone_surrogate(text: str) -> None:
    for problem in (id_problem(text), free_text_problem(text), utf8_problem(text)):
        assert problem is None or is_utf8(problem)


def test_what_is_not_text_is_refused_by_name() -> None:
    assert id_problem(5) == "not text: int"
    assert free_text_problem(None) == "not text: NoneType"
    assert utf8_problem("caf\u00e9") is None and utf8_problem("a\udcff") is not None


def _strings(value: Any) -> list[str]:
    found: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item
    return found


@given(hostile_values(max_leaves=30))
def test_a_free_form_value_is_refused_for_a_lone_surrogate_anywhere(value: Any) -> None:
    found = value_problem(value)
    assert (found is not None) == (not all(is_utf8(s) for s in _strings(value)))
    if found is not None:
        path, problem = found
        assert is_utf8(path) and is_utf8(problem)


def test_any_nesting_is_checked_without_recursion() -> None:
    deep: Any = "\ud800"
    for _ in range(100_000):
        deep = [deep]
    found = value_problem({"params": deep})
    assert found is not None and found[0].startswith("params[0][0]")


@given(st.text(min_size=1, max_size=8))
def test_a_key_with_a_lone_surrogate_is_named_safely(prefix: str) -> None:
    found = value_problem({"a": {prefix + "\udc80": 1}})
    assert found is not None and is_utf8(found[0]) and found[1].startswith("a key with")
