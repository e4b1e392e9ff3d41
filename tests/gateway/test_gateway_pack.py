"""The gateway's configuration and its pack, made from what upstreams list: checked, no crash."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.gateway import (
    ConfigError,
    PackFailure,
    ToolInfo,
    config_of,
    gateway_pack,
)
from kernel.policy.packs import PolicyCatalog
from tests.support.hostile import hostile_text, hostile_values

NOTE = ToolInfo(
    name="add_note",
    description="Add a note.",
    input_schema={
        "type": "object",
        "properties": {
            "text": {"type": "string"},
            "priority": {"type": "integer", "default": 1},
            "tag": {"type": "string", "enum": ["a", "b"]},
            "idempotency_key": {"type": "string"},
        },
        "required": ["text", "idempotency_key"],
    },
)


def config(**tools: Any) -> Any:
    return config_of(
        {
            "upstreams": {"notes": {"url": "http://127.0.0.1:1/mcp"}},
            "tools": tools or {"notes.add_note": {}},
            "limits": {"cap": {"default": 5, "floor": 0, "ceiling": 9}},
        }
    )


def test_a_tool_becomes_a_kind_with_its_schema_and_the_configs_rules() -> None:
    pack, routes = gateway_pack(
        config(
            **{"notes.add_note": {"limit": {"priority": "cap"}, "approve_above": {"priority": 3}}}
        ),
        {"notes": [NOTE]},
    )
    PolicyCatalog([pack])  # what the kernel checks at start
    [kind] = pack.kinds
    route = routes["notes_add_note"]
    assert route.kind == "notes.add_note" and route.key_arg == "idempotency_key"
    assert "idempotency_key" not in route.input_schema["properties"]
    assert kind.adapter == "mcp.notes"
    # The schema's default stands; an optional enum may be left out; the key is the kernel's.
    given = msgspec.convert({"kind": "notes.add_note", "text": "x"}, kind)
    assert given.priority == 1 and given.tag is None  # type: ignore[attr-defined]
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"kind": "notes.add_note", "text": "x", "idempotency_key": "k"}, kind)
    assert [r.name for r in pack.rules] == ["within_cap"]
    assert len(pack.thresholds) == 1


def test_the_packs_version_follows_the_upstreams_schema() -> None:
    first, _ = gateway_pack(config(), {"notes": [NOTE]})
    again, _ = gateway_pack(config(), {"notes": [NOTE]})
    changed = msgspec.structs.replace(NOTE, description="Add a note, differently.")
    other, _ = gateway_pack(config(), {"notes": [changed]})
    assert first.hash == again.hash and first.version == again.version
    assert other.version != first.version and other.hash != first.hash


def test_a_named_tool_the_upstream_does_not_list_stops_the_start() -> None:
    with pytest.raises(PackFailure, match="lists no tool 'gone'"):
        gateway_pack(config(**{"notes.gone": {}}), {"notes": [NOTE]})


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({}, "upstreams"),
        ({"upstreams": {}}, "no [upstreams]"),
        ({"upstreams": {"a_b": {"url": "http://x"}}}, "a name is"),
        ({"upstreams": {"a": {}}}, "either command"),
        ({"upstreams": {"a": {"url": "http://x", "command": ["x"]}}}, "either command"),
        ({"upstreams": {"a": {"url": "file:///x"}}}, "http://"),
        ({"upstreams": {"a": {"url": "http://x"}}, "tools": {"b.t": {}}}, "of an upstream"),
        (
            {"upstreams": {"a": {"url": "http://x"}}, "tools": {"a.t": {"limit": {"f": "z"}}}},
            "no [limits.z]",
        ),
        ({"upstreams": {"a": {"url": "http://x"}}, "surprise": 1}, "unknown field"),
        ({"upstreams": {"a": {"url": "http://x", "attempts": 0}}}, "attempts"),
    ],
)
def test_a_config_that_cannot_be_used_says_why(data: Any, says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("[", r"\[").replace("]", r"\]")):
        config_of(data)


schemas = st.one_of(
    hostile_values(max_leaves=12),
    st.fixed_dictionaries(
        {
            "type": st.just("object"),
            "properties": st.dictionaries(
                hostile_text(max_size=12),
                st.one_of(
                    hostile_values(max_leaves=4),
                    st.fixed_dictionaries(
                        {"type": st.sampled_from(["string", "integer", "number", "boolean"])},
                        optional={
                            "default": hostile_values(max_leaves=1),
                            "enum": hostile_values(max_leaves=3),
                        },
                    ),
                ),
                max_size=4,
            ),
        },
        optional={"required": hostile_values(max_leaves=3)},
    ),
)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(schemas)
def test_any_listed_schema_makes_a_pack_the_kernel_accepts_or_a_clear_failure(schema: Any) -> None:
    listed = ToolInfo(
        name="add_note", input_schema=schema if isinstance(schema, dict) else {"x": schema}
    )
    try:
        pack, _ = gateway_pack(config(), {"notes": [listed]})
    except PackFailure as exc:
        assert str(exc).startswith("notes.add_note:")
        return
    PolicyCatalog([pack])
