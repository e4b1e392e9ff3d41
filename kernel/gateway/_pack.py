"""Upstream tools as policy kinds: the schema from ``tools/list``, the rules from the config.

Each tool the configuration names becomes a ``PolicyKind`` made at start from the
JSON Schema its upstream lists: a property becomes a field of the JSON type it
declares (string, integer, number, boolean, array, object; anything else is any
value), a required property a required field, and an ``enum`` a ``OneOf``
invariant. Bounds, limits and approval thresholds come from the configuration
(:class:`~kernel.gateway._config.ToolPolicy`) as the pack's invariants, rules
and thresholds. The kind's adapter is ``mcp.<upstream>``: the executor that calls
the upstream (:mod:`kernel.gateway._upstream`).

The pack's version carries a digest of the schemas and the configuration it was
made from, so the hash every verdict records changes when an upstream changes a
tool's schema, and a pack made again from the same listing has the same hash.
"""

from __future__ import annotations

import hashlib
import keyword
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import msgspec
import msgspec.inspect

from kernel.gateway._config import GatewayConfig, ToolPolicy, read_config
from kernel.policy import (
    ALLOW,
    Impact,
    LimitSpec,
    OneOf,
    PolicyKind,
    PolicyPack,
    Range,
    RuleVerdict,
    Threshold,
    View,
    deny,
)
from kernel.policy.rules import Rule, decimal_of

_SAFE = re.compile(r"[^A-Za-z0-9_-]")
_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list[Any],
    "object": dict[str, Any],
}
_IDEMPOTENCY = ("idempotency_key", "idempotencyKey")
"""The arguments a tool takes its idempotency key in, by default."""


class PackFailure(ValueError):
    """The pack cannot be made: a named tool is missing upstream, or its schema is unusable."""


class ToolInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One tool as its upstream lists it."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = {}


class Route(msgspec.Struct, frozen=True, kw_only=True):
    """Where a governed tool goes: its name to clients, its kind, its upstream and its tool.

    Attributes:
        name: the tool's name to the gateway's clients: ``<upstream>_<tool>``.
        kind: its policy kind: ``<upstream>.<tool>``.
        upstream: the upstream's name.
        tool: the tool's name upstream.
        key_arg: the argument the idempotency key is passed in ("" for none).
        description: what the tool does (the upstream's words).
        input_schema: its JSON Schema to clients (without the idempotency key).
        scopes: the scopes its kind requires (tools/list hides it from a user without them).
    """

    name: str
    kind: str
    upstream: str
    tool: str
    key_arg: str = ""
    description: str = ""
    input_schema: dict[str, Any] = {}
    scopes: list[str] = []


def gateway_pack(
    config: GatewayConfig, listed: Mapping[str, Sequence[ToolInfo]]
) -> tuple[PolicyPack, dict[str, Route]]:
    """Return the pack of the tools ``config`` names, and their routes by client-side name.

    Args:
        config: the gateway's configuration.
        listed: each upstream's tools, as its ``tools/list`` answered.

    Raises:
        PackFailure: a named tool its upstream does not list, or a schema the
            gateway cannot govern (a property that is no Python name).
    """
    kinds: list[type[PolicyKind]] = []
    invariants: list[Any] = []
    rules: list[Rule] = []
    thresholds: list[Threshold] = []
    routes: dict[str, Route] = {}
    for kind_name, policy in sorted(config.tools.items()):
        upstream, _, tool = kind_name.partition(".")
        info = next((t for t in listed.get(upstream, ()) if t.name == tool), None)
        if info is None:
            raise PackFailure(f"{kind_name}: upstream {upstream} lists no tool {tool!r}")
        try:
            msgspec.json.encode([info.input_schema, info.description])  # what the digest reads
            key_arg = _key_arg(config.upstreams[upstream].idempotency_key, info.input_schema)
            kind = _kind(kind_name, info, policy, key_arg)
            found = _invariants(kind, info.input_schema, policy)
        except PackFailure:
            raise
        except (TypeError, ValueError, AttributeError) as exc:
            # An upstream's schema is input like any other: one the gateway cannot read
            # stops it at start, with the tool's name, never a traceback.
            raise PackFailure(f"{kind_name}: its input schema cannot be governed: {exc}") from None
        kinds.append(kind)
        invariants.extend(found)
        rules.extend(_limit_rule(kind, field, name) for field, name in policy.limit.items())
        thresholds.extend(
            Threshold(kind, amount=field, above=above)
            for field, above in policy.approve_above.items()
        )
        route = Route(
            name=f"{upstream}_{_SAFE.sub('_', tool)}",
            kind=kind_name,
            upstream=upstream,
            tool=tool,
            key_arg=key_arg,
            description=info.description,
            input_schema=_shown_schema(info.input_schema, key_arg),
            scopes=list(policy.scopes),
        )
        if route.name in routes:
            raise PackFailure(f"{kind_name}: two tools are named {route.name} to clients")
        routes[route.name] = route
    pack = PolicyPack(
        name=config.pack,
        version=f"{config.version}+{_digest(config, listed)}",
        kinds=tuple(kinds),
        escalate_below_confidence=config.escalate_below_confidence,
        invariants=tuple(invariants),
        rules=tuple(rules),
        thresholds=tuple(thresholds),
        limits={
            name: LimitSpec(default=d.default, floor=d.floor, ceiling=d.ceiling)
            for name, d in config.limits.items()
        },
    )
    return pack, routes


Listing = dict[str, list[ToolInfo]]
"""Each upstream's tools, as its ``tools/list`` answered, by upstream name."""

_listing = msgspec.json.Decoder(Listing)


def write_listing(path: str | Path, listed: Mapping[str, Sequence[ToolInfo]]) -> None:
    """Save what the upstreams listed (what the pack was made from) as JSON."""
    Path(path).write_bytes(msgspec.json.encode({k: list(v) for k, v in listed.items()}))


def pack_of(config: GatewayConfig | str | Path, listing: str | Path) -> PolicyPack:
    """Make the gateway's pack again from its configuration and a saved listing.

    What ``dirk verify --verdicts`` judges a gateway's journal with: a pack file holding
    ``PACK = pack_of("gateway.toml", "listing.json")`` (``dirk mcp proxy --listing``
    saves the listing at start). The same file and listing make the same pack hash.

    Raises:
        ConfigError: the configuration cannot be used.
        PackFailure: the listing cannot be read, or a named tool is not in it.
    """
    if not isinstance(config, GatewayConfig):
        config = read_config(config)
    try:
        listed = _listing.decode(Path(listing).read_bytes())
    except (OSError, msgspec.DecodeError) as exc:
        raise PackFailure(f"cannot read the listing {listing}: {exc}") from None
    return gateway_pack(config, listed)[0]


def _key_arg(configured: str | None, schema: Mapping[str, Any]) -> str:
    """The argument the tool takes the idempotency key in, or ""."""
    properties = schema.get("properties", {})
    if configured is not None:
        return configured if configured in properties else ""
    return next((name for name in _IDEMPOTENCY if name in properties), "")


def _kind(name: str, info: ToolInfo, policy: ToolPolicy, key_arg: str) -> type[PolicyKind]:
    """Make the policy kind of one upstream tool from its JSON Schema."""
    schema = info.input_schema
    properties = schema.get("properties", {})
    required = set(schema.get("required", []))
    if not isinstance(properties, dict):
        raise PackFailure(f"{name}: its input schema's properties are not an object")
    fields: list[tuple[str, Any, Any]] = []
    for prop, spec in properties.items():
        if prop == key_arg:
            continue  # the kernel fills it in: a client never chooses the key
        if not prop.isidentifier() or keyword.iskeyword(prop) or prop in ("kind", "version"):
            raise PackFailure(f"{name}: parameter {prop!r} is not a name the gateway can govern")
        spec = spec if isinstance(spec, dict) else {}
        typ = _type_of(spec)
        if prop in required:
            fields.append((prop, typ, msgspec.NODEFAULT))
        else:
            fields.append((prop, typ | None, _default_of(spec, typ)))
    # Required fields first: msgspec wants no required field after a default (kw_only anyway).
    fields.sort(key=lambda f: f[2] is not msgspec.NODEFAULT)
    namespace = {
        "__doc__": info.description or f"The tool {info.name} of an upstream MCP server.",
        "__module__": __name__,
        "version": "1.0",
        "adapter": f"mcp.{name.partition('.')[0]}",
        "impact": Impact(policy.impact),
        "scopes": tuple(policy.scopes),
        "read_only": policy.read_only,
    }
    kind = msgspec.defstruct(
        "Upstream_" + _SAFE.sub("_", name).replace("-", "_"),
        [(f, t) if d is msgspec.NODEFAULT else (f, t, d) for f, t, d in fields],
        bases=(PolicyKind,),
        tag=name,
        namespace=namespace,
        kw_only=True,
        omit_defaults=True,
    )
    return cast(type[PolicyKind], kind)


def _type_of(spec: Mapping[str, Any]) -> Any:
    """The Python type a property's JSON Schema declares (Any when it declares no one type)."""
    declared = spec.get("type")
    if isinstance(declared, list):
        types = [_TYPES.get(t) for t in declared if t != "null"]
        if len(types) == 1 and types[0] is not None:
            return types[0] | None if "null" in declared else types[0]
        return Any
    return _TYPES.get(declared, Any) if isinstance(declared, str) else Any


def _default_of(spec: Mapping[str, Any], typ: Any) -> Any:
    """An optional property's default: the schema's, when it is a value of its type, else None.

    With ``omit_defaults`` the default is not sent upstream: the upstream applies its own.
    """
    default = spec.get("default")
    if isinstance(default, bool) is (typ is bool) and typ in (str, int, float, bool):
        if isinstance(default, typ) and not isinstance(default, list | dict):
            return default
    return None


def _invariants(kind: type[PolicyKind], schema: Mapping[str, Any], policy: ToolPolicy) -> list[Any]:
    """The tool's invariants: its schema's enums, then the configuration's bounds."""
    found: list[Any] = []
    properties = schema.get("properties", {})
    for prop, spec in properties.items():
        values = spec.get("enum") if isinstance(spec, dict) else None
        if isinstance(values, list) and values and prop not in policy.one_of:
            listed = {v for v in values if _hashable(v)}
            if _optional(kind, prop):
                listed.add(None)  # an optional parameter left out is no value outside the enum
            found.append(OneOf(kind, prop, frozenset(listed)))
    for field, allowed in policy.one_of.items():
        found.append(OneOf(kind, field, frozenset(allowed)))
    for field in sorted(set(policy.min) | set(policy.max)):
        found.append(Range(kind, field, min=policy.min.get(field), max=policy.max.get(field)))
    return found


def _optional(kind: type[PolicyKind], field: str) -> bool:
    """Whether ``field`` of ``kind`` may be left out with None."""
    info = msgspec.inspect.type_info(kind)
    return any(
        f.name == field and not f.required and f.default is None
        for f in getattr(info, "fields", ())
    )


def _hashable(value: Any) -> bool:
    return isinstance(value, str | int | float | bool) or value is None


def _limit_rule(kind: type[PolicyKind], field: str, limit: str) -> Rule:
    """A rule of ``kind``: ``field`` is at most the agent's limit ``limit`` (amendable)."""

    def within_limit(view: View) -> RuleVerdict:
        """The field stays within the agent's limit."""
        value = decimal_of(getattr(view.params, field))
        cap = decimal_of(view.limits.get(limit))
        if value is None or cap is None:
            return deny(f"{field} is not a number within {limit}", field=field, limit=limit)
        if value > cap:
            return deny(f"{field} {value} is above {limit} {cap}", field=field, limit=cap)
        return ALLOW

    within_limit.__name__ = f"within_{limit}"
    return Rule(kind=kind, fn=within_limit, fields=(field,))


def _shown_schema(schema: Mapping[str, Any], key_arg: str) -> dict[str, Any]:
    """The tool's input schema as clients see it: the idempotency key is the kernel's."""
    shown = dict(schema) or {"type": "object"}
    if key_arg:
        shown["properties"] = {k: v for k, v in shown.get("properties", {}).items() if k != key_arg}
        shown["required"] = [r for r in shown.get("required", []) if r != key_arg]
    return shown


def _digest(config: GatewayConfig, listed: Mapping[str, Sequence[ToolInfo]]) -> str:
    """A digest of what the pack is made of: the configuration's policy and the schemas."""
    named = {
        kind: next(
            (t for t in listed.get(kind.partition(".")[0], ()) if t.name == kind.partition(".")[2]),
            None,
        )
        for kind in config.tools
    }
    content = {
        "tools": config.tools,
        "limits": config.limits,
        "keys": {name: spec.idempotency_key for name, spec in config.upstreams.items()},
        "schemas": {k: (t.input_schema, t.description) if t else None for k, t in named.items()},
    }
    body = msgspec.json.encode(msgspec.to_builtins(content), order="sorted")
    return hashlib.sha256(body).hexdigest()[:12]
