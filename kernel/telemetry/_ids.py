"""The identities of spans: a flow's trace id is its DFID, span ids hash (DFID, stage, n).

Both are pure functions of what the journal records, so a span projected live,
re-exported later or pointed at from inside ``decide()`` always has the same id.
"""

from __future__ import annotations

import functools
import hashlib
import uuid

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext, TraceFlags

__all__ = [
    "ROOT",
    "caller_context",
    "flow_context",
    "span_id_for",
    "trace_id_for",
    "traceparent_of",
]

ROOT = ("flow", 0)
"""The (stage, n) of a flow's root span."""

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)


@functools.lru_cache(maxsize=8192)
def trace_id_for(dfid: str) -> int:
    """Return the trace id of flow ``dfid``: the DFID's 128 bits (a hash if it is no UUID)."""
    try:
        value = uuid.UUID(dfid).int
    except ValueError:
        value = 0
    # A DFID that is not a UUID (or is all zeros) still needs a stable, valid id.
    return value or int.from_bytes(hashlib.sha256(dfid.encode()).digest()[:16], "big")


# A flow's root id is asked for by each of its spans (their parent), the reasoning
# span's by decide()'s context and by the span itself: a small cache halves the hashing.
@functools.lru_cache(maxsize=8192)
def span_id_for(dfid: str, stage: str, n: int) -> int:
    """Return the id of the ``n``-th ``stage`` span of flow ``dfid``; the root is ("flow", 0).

    A reasoning span's ``n`` is its attempt, so the kernel can name it while
    ``decide()`` runs, before anything about it is recorded.
    """
    digest = hashlib.sha256(f"{dfid}/{stage}/{n}".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


def traceparent_of(context: Context | None) -> str:
    """Return the W3C ``traceparent`` of the span current in ``context`` ("" if none).

    A context without a valid span, or None, links to nothing.
    """
    if context is None:
        return ""
    span = trace.get_current_span(context).get_span_context()
    if not span.is_valid:
        return ""
    return f"00-{span.trace_id:032x}-{span.span_id:016x}-{int(span.trace_flags) & 0xFF:02x}"


def caller_context(traceparent: str) -> SpanContext | None:
    """Return the caller's span a recorded ``traceparent`` names (None if it names none)."""
    parts = traceparent.split("-")
    if len(parts) != 4:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags & 0xFF))


def flow_context(dfid: str, stage: str, n: int, *, sampled: bool = True) -> SpanContext:
    """Return the span context of the ``n``-th ``stage`` span of flow ``dfid``."""
    return SpanContext(
        trace_id_for(dfid),
        span_id_for(dfid, stage, n),
        is_remote=False,
        trace_flags=_SAMPLED if sampled else _NOT_SAMPLED,
    )
