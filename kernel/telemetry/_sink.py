"""Span records become SDK spans through a tracer of the host's (or our own) TracerProvider.

Going through the provider's tracer means its sampler, span limits, resource and
processors apply exactly as they do to the application's own spans. Two things
are ours: the ids (the tracer's id generator is told, span by span, the DFID-based
ids of :mod:`kernel.telemetry._ids`) and how a ratio is decided (on a hash of the
DFID, :mod:`kernel.telemetry._sampling`: the SDK's comparison keeps no UUIDv4 at 0.5).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event as SpanEvent
from opentelemetry.sdk.trace import (
    ReadableSpan,
    SpanLimits,
    SpanProcessor,
    Tracer,
    TracerProvider,
)
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import (
    Decision,
    ParentBased,
    Sampler,
    StaticSampler,
    TraceIdRatioBased,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)

from kernel.registry import KERNEL_VERSION
from kernel.telemetry._ids import caller_context, span_id_for, trace_id_for
from kernel.telemetry._project import SpanRecord, Where
from kernel.telemetry._sampling import DfidRatioBased, flow_sampler

__all__ = ["Collector", "DirectSink", "SpanSink"]

_SCOPE = "kernel.telemetry"
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_OK = Status(StatusCode.OK)
# On the link from a flow's root to the span of the code that started it.
_CALLER = {"dir.link": "caller"}
_UNSET = Status(StatusCode.UNSET)
_KEPT = (Decision.RECORD_AND_SAMPLE,)
_DECIDED = 8192  # the flows whose sampling decision a sink remembers


def _pure(sampler: Sampler) -> bool:
    """Whether ``sampler``'s decision for a root span is a function of its trace id alone."""
    if isinstance(sampler, ParentBased):
        sampler = sampler._root
    return type(sampler) in (StaticSampler, TraceIdRatioBased, DfidRatioBased)


class _GivenIds(IdGenerator):
    """Hands out the ids it was last given: the tracer asks, the sink has already said."""

    def __init__(self) -> None:
        self.trace_id = 0
        self.span_id = 0

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        return self.span_id

    def is_trace_id_random(self) -> bool:
        return False


class Collector(SpanProcessor):
    """A span processor that keeps every span it is handed, in order."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


class SpanSink:
    """Turns span records into spans of ``provider``'s tracer, and names a flow's spans."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        tracer = provider.get_tracer(_SCOPE, KERNEL_VERSION)
        # A disabled SDK (OTEL_SDK_DISABLED) hands out a no-op tracer: nothing to do then.
        self._tracer = tracer if isinstance(tracer, Tracer) else None
        self._ids = _GivenIds()
        if self._tracer is not None:
            self._tracer.id_generator = self._ids
            # The SDK's ratio sampler would keep no flow at 0.5 (a DFID's variant bits):
            # the kernel's tracer decides the same ratio on a hash of the DFID instead.
            self._tracer.sampler = flow_sampler(self._tracer.sampler)
        self._lock = threading.Lock()
        # The SDK's own samplers decide a root by its trace id alone: ask them once per
        # flow, not once per batch and per decide() (any other sampler is asked each time).
        self._decided: dict[str, bool] | None = None
        if self._tracer is not None and _pure(self._tracer.sampler):
            self._decided = {}

    @property
    def enabled(self) -> bool:
        """Whether spans are recorded at all."""
        return self._tracer is not None

    def sampled(self, dfid: str) -> bool:
        """Whether the provider's sampler keeps the trace of flow ``dfid``."""
        if self._tracer is None:
            return False
        decided = self._decided
        if decided is not None and (known := decided.get(dfid)) is not None:
            return known
        result = self._tracer.sampler.should_sample(Context(), trace_id_for(dfid), "flow")
        kept = result.decision in _KEPT
        if decided is not None:
            if len(decided) >= _DECIDED:
                decided.clear()
            decided[dfid] = kept
        return kept

    def _context(self, dfid: str, stage: str, n: int, flags: TraceFlags) -> SpanContext:
        return SpanContext(trace_id_for(dfid), span_id_for(dfid, stage, n), False, flags)

    def write(self, records: Sequence[SpanRecord]) -> None:
        """Start and end one span per record; the provider's processors take them from there."""
        tracer = self._tracer
        if tracer is None or not records:
            return
        sampled: dict[str, TraceFlags] = {}

        def flags(dfid: str) -> TraceFlags:
            if (known := sampled.get(dfid)) is None:
                known = sampled[dfid] = _SAMPLED if self.sampled(dfid) else _NOT_SAMPLED
            return known

        with self._lock:
            for record in records:
                dfid = record.dfid
                parent = Context()
                if record.parent is not None:
                    up = NonRecordingSpan(self._context(dfid, *record.parent, flags(dfid)))
                    parent = set_span_in_context(up, parent)
                links = [
                    Link(self._context(other, *where, flags(other)))
                    for other, where in record.links
                ]
                if record.remote and (caller := caller_context(record.remote)) is not None:
                    links.append(Link(caller, _CALLER))
                self._ids.trace_id = trace_id_for(dfid)
                self._ids.span_id = span_id_for(dfid, *record.where)
                span = tracer.start_span(
                    record.name,
                    context=parent,
                    attributes=record.attrs,
                    links=links,
                    start_time=record.start,
                )
                if not span.is_recording():
                    continue
                for name, attrs, ts in record.events:
                    span.add_event(name, attrs, max(ts, record.start))
                if record.error is not None:
                    span.set_status(Status(StatusCode.ERROR, record.error))
                elif record.ok:
                    span.set_status(_OK)
                span.end(end_time=record.end)

    @contextmanager
    def reasoning(self, dfid: str, attempt: int) -> Iterator[None]:
        """Make flow ``dfid``'s reasoning span (of ``attempt``) the current span context."""
        if self._tracer is None:
            yield
            return
        flags = _SAMPLED if self.sampled(dfid) else _NOT_SAMPLED
        span = NonRecordingSpan(self._context(dfid, "reason", attempt, flags))
        token = otel_context.attach(set_span_in_context(span))
        try:
            yield
        finally:
            otel_context.detach(token)


class _HashedOnce(Resource):
    """The provider's Resource, equal to it, hashed once.

    The OTLP encoder groups spans by resource in a dict, hashing each span's resource,
    and a Resource hashes by dumping its attributes to sorted JSON every time.
    """

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = hash(resource)

    def __hash__(self) -> int:
        return self._hash


class _ScopeHashedOnce(InstrumentationScope):
    """The kernel's instrumentation scope, hashed once (the OTLP encoder groups every span
    by its scope in a dict, and a scope hashes a tuple of its fields each time)."""

    __slots__ = ("_hash",)

    def __init__(self, name: str, version: str) -> None:
        super().__init__(name, version)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


class DirectSink(SpanSink):
    """The kernel's own provider: the same spans, built directly and handed to ``processor``.

    Nothing but the kernel uses this provider, so the tracer's per-span work (id
    generation, attribute cleaning, locking) buys nothing: the sampler, the
    Resource and the span limits are applied here, as the tracer would apply them.
    """

    def __init__(self, provider: TracerProvider, processor: SpanProcessor) -> None:
        super().__init__(provider)
        self._processor = processor
        self._resource = _HashedOnce(provider.resource)
        self._limits = SpanLimits()
        self._scope = _ScopeHashedOnce(_SCOPE, KERNEL_VERSION)

    def _attributes(self, attrs: dict[str, Any]) -> Any:
        limits = self._limits
        if limits.max_span_attribute_length is None and len(attrs) <= (
            limits.max_span_attributes or len(attrs)
        ):
            return attrs
        return BoundedAttributes(
            limits.max_span_attributes,
            attrs,
            immutable=True,
            max_value_len=limits.max_span_attribute_length,
        )

    def write(self, records: Sequence[SpanRecord]) -> None:
        if self._tracer is None or not records:
            return
        kept: dict[str, bool] = {}
        # A flow's stages share their parent (its root, or its resume): one context each.
        parents: dict[tuple[str, Where], SpanContext] = {}
        on_end = self._processor.on_end
        resource, scope = self._resource, self._scope
        for record in records:
            dfid = record.dfid
            if (sampled := kept.get(dfid)) is None:
                sampled = kept[dfid] = self.sampled(dfid)
            if not sampled:
                continue
            trace_id = trace_id_for(dfid)
            context = SpanContext(trace_id, span_id_for(dfid, *record.where), False, _SAMPLED)
            parent = None
            if (up := record.parent) is not None and (parent := parents.get((dfid, up))) is None:
                parent = parents[dfid, up] = SpanContext(
                    trace_id, span_id_for(dfid, *up), False, _SAMPLED
                )
            links = []
            for other, where in record.links:
                if (other_sampled := kept.get(other)) is None:
                    other_sampled = kept[other] = self.sampled(other)
                flags = _SAMPLED if other_sampled else _NOT_SAMPLED
                links.append(Link(self._context(other, *where, flags)))
            if record.remote and (caller := caller_context(record.remote)) is not None:
                links.append(Link(caller, _CALLER))
            if record.error is not None:
                status = Status(StatusCode.ERROR, record.error)
            else:
                status = _OK if record.ok else _UNSET
            on_end(
                ReadableSpan(
                    record.name,
                    context,
                    parent=parent,
                    resource=resource,
                    attributes=self._attributes(record.attrs),
                    events=[
                        SpanEvent(name, self._attributes(attrs), max(ts, record.start))
                        for name, attrs, ts in record.events
                    ]
                    if record.events
                    else [],  # most spans have none: skip the comprehension's call
                    links=links,
                    status=status,
                    start_time=record.start,
                    end_time=record.end,
                    instrumentation_scope=scope,
                )
            )
