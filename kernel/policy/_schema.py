"""A kind's JSON Schema as pack hashes read it: the same bytes under every msgspec.

A pack's hash covers its kinds' schemas, and journals record the hash of the pack that
judged them. msgspec 0.23 changed how a multi-line class docstring becomes a schema's
``description`` (``inspect.cleandoc`` where 0.22 and before dedented and stripped
newlines), which moved the hash of every pack with such a kind and left old journals
unable to name the pack that judged them. The hash reads descriptions in the older form,
whatever msgspec is installed; the schema offered to readers (``PolicyCatalog.schemas``)
stays msgspec's own.
"""

from __future__ import annotations

import textwrap
from typing import Any

import msgspec
import msgspec.inspect as mi


def hashed_schema(kind: type) -> dict[str, Any]:
    """Return ``kind``'s JSON Schema with each description as msgspec 0.22 wrote it."""
    schema = msgspec.json.schema(kind)
    classes = _classes(mi.type_info(kind), {})
    for title, definition in schema.get("$defs", {}).items():
        cls = classes.get(title)
        if cls is None:
            continue
        doc = _doc(cls)
        if doc:
            definition["description"] = doc
        else:
            definition.pop("description", None)
    return schema


def _classes(t: mi.Type, seen: dict[str, Any]) -> dict[str, Any]:
    """Every named type reachable from ``t`` (the titles of a schema's ``$defs``) by name."""
    cls = getattr(t, "cls", None)
    if cls is not None:
        name = getattr(cls, "__name__", None)
        if name in seen:
            return seen
        if name is not None:
            seen[name] = t
    for child in _children(t):
        _classes(child, seen)
    return seen


def _children(t: mi.Type) -> list[mi.Type]:
    fields = getattr(t, "fields", None)
    if fields is not None:
        return [f.type for f in fields]
    out: list[mi.Type] = []
    for attr in ("types", "item_types"):
        out.extend(getattr(t, attr, ()) or ())
    for attr in ("item_type", "key_type", "value_type"):
        child = getattr(t, attr, None)
        if child is not None:
            out.append(child)
    return out


def _doc(t: Any) -> str:
    """msgspec 0.22's ``_get_doc``: the docstring dedented, outer newlines stripped."""
    cls = getattr(t.cls, "__origin__", t.cls)
    doc = getattr(cls, "__doc__", "")
    if not doc:
        return ""
    doc = textwrap.dedent(doc).strip("\r\n")
    if isinstance(t, mi.EnumType):
        return "" if doc == "An enumeration." else doc
    if isinstance(t, mi.NamedTupleType | mi.DataclassType) and (
        doc.startswith(f"{cls.__name__}(") and doc.endswith(")")
    ):
        return ""
    return doc
