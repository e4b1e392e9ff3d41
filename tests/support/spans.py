"""Typed reads of what OpenTelemetry recorded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Attributed(Protocol):
    """A span, a span event or a link: anything with OpenTelemetry attributes."""

    @property
    def attributes(self) -> Mapping[str, Any] | None:
        """Its attributes; the SDK types them optional."""
        ...


def attrs(item: Attributed) -> Mapping[str, Any]:
    """Return ``item``'s attributes: a recorded span or event always has them (maybe empty).

    The SDK types ``attributes`` as ``Mapping | None``, so indexing it directly is a type
    error in every test that reads one; this is the one place that says it is there.
    """
    attributes = item.attributes
    assert attributes is not None, f"{item!r} has no attributes"
    return attributes
