"""Telemetry: the journal's committed events, projected live into spans of a TracerProvider.

The provider is the embedding application's when it gives one (or has set an SDK
provider as the global one): its sampler, limits, resource and exporters then
govern the kernel's spans too. Otherwise the kernel builds one from the
``OTEL_*`` environment, with export off unless an endpoint is named. Span times
are on the journal's clock or the wall clock as ``span_time`` (or ``DIRK_SPAN_TIME``)
says (:mod:`kernel.telemetry._clock`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import AsyncIterable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Sampler

from kernel.core.events import Event, FlowCreated
from kernel.journal.store import Journal
from kernel.telemetry._clock import SpanClock, SpanTime, span_time_from_env
from kernel.telemetry._metrics import FlowMetrics, host_meter_provider, meter_provider_from_env
from kernel.telemetry._otlp import ExporterUnavailable, configure_exporter, resource_from_env
from kernel.telemetry._project import SpanProjector, SpanRecord
from kernel.telemetry._sink import Collector, DirectSink, SpanSink

__all__ = ["Telemetry", "export_flows", "shutdown_processor", "spans_for_events"]

_log = logging.getLogger(__name__)


def _provider(
    processor: SpanProcessor, resource: Resource | None, sampler: Sampler | None = None
) -> TracerProvider:
    provider = TracerProvider(
        sampler=sampler,  # None: the SDK's, from OTEL_TRACES_SAMPLER
        resource=resource if resource is not None else resource_from_env(),
        shutdown_on_exit=False,
    )
    provider.add_span_processor(processor)
    return provider


def _bounded(work: object, timeout_s: float, what: str) -> bool:
    def run() -> None:
        try:
            work()  # type: ignore[operator]
        except Exception:
            _log.exception("%s failed", what)

    # The SDK's flush exports in the calling thread and ignores its timeout, so
    # an unreachable collector would hold us through the retries of every
    # batch: waiting on a daemon thread instead bounds it.
    closer = threading.Thread(target=run, name="dir-telemetry-shutdown", daemon=True)
    closer.start()
    closer.join(timeout_s)
    return not closer.is_alive()


def shutdown_processor(processor: SpanProcessor, timeout_s: float = 3.0) -> bool:
    """Flush and shut ``processor`` down within about ``timeout_s``; return whether it finished.

    What is not exported by then is dropped. Blocks the calling thread.
    """

    def close() -> None:
        try:
            processor.force_flush(int(timeout_s * 1000))
        finally:
            processor.shutdown()

    return _bounded(close, timeout_s, "span export shutdown")


class Telemetry:
    """Project the journal into spans, live, and hand them to a TracerProvider.

    Args:
        processor: where spans go, in a provider of the kernel's own (None: telemetry off).
        resource: that provider's Resource (default: what the SDK detects, "dir-kernel"
            as the service name if none is set).
        sampler: that provider's sampler (default: the SDK's, from ``OTEL_TRACES_SAMPLER``).
        provider: instead of all three, the application's SDK TracerProvider; the kernel
            flushes it on close but never shuts it down.
        meter_provider: where the kernel's metrics go (None: no metrics); shut down on
            close unless ``owns_meter`` is False.
        span_time: the clock of span times: "auto" (the wall clock when the journal's is
            a simulated one, else the journal's), "wall" or "journal".
    """

    def __init__(
        self,
        processor: SpanProcessor | None = None,
        *,
        resource: Resource | None = None,
        sampler: Sampler | None = None,
        provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        owns_meter: bool = True,
        span_time: SpanTime = "auto",
    ) -> None:
        self._span_clock = SpanClock(span_time)
        # Spans of flows an earlier run left open wait for the first live batch, which
        # tells how far the journal's clock is from the wall clock (their own events
        # are old, whatever the clock).
        self._held: list[SpanRecord] = []
        self._owned = provider is None
        self._metrics = FlowMetrics(meter_provider) if meter_provider is not None else None
        self._owns_meter = owns_meter
        self._sink: SpanSink | None = None
        if provider is not None:
            self._sink = SpanSink(provider)
        elif processor is not None:
            self._sink = DirectSink(_provider(processor, resource, sampler), processor)
        if self._sink is not None and not self._sink.enabled:
            self._sink = None
        self._projector = SpanProjector()

    @classmethod
    def from_provider(
        cls,
        provider: TracerProvider,
        *,
        span_time: SpanTime | None = None,
        env: Mapping[str, str] = os.environ,
    ) -> Telemetry:
        """Return telemetry whose spans go through the application's ``provider``.

        ``span_time`` None: as ``DIRK_SPAN_TIME`` in ``env`` says (default "auto").
        """
        return cls(provider=provider, span_time=span_time or span_time_from_env(env))

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] = os.environ, *, span_time: SpanTime | None = None
    ) -> Telemetry:
        """Return telemetry as the application or the ``OTEL_*`` variables in ``env`` set it up.

        An SDK TracerProvider the application set as the global one wins; otherwise an
        exporter is built from ``env`` (none: telemetry off). ``span_time`` None: as
        ``DIRK_SPAN_TIME`` in ``env`` says (default "auto").
        """
        span_time = span_time or span_time_from_env(env)
        host = trace.get_tracer_provider()
        host_meter = host_meter_provider()
        if isinstance(host, TracerProvider):
            return cls(
                provider=host, meter_provider=host_meter, owns_meter=False, span_time=span_time
            )
        resource = resource_from_env(env)
        meter = host_meter or meter_provider_from_env(env, resource)
        owns_meter = host_meter is None
        try:
            processor = configure_exporter(env)
        except ExporterUnavailable as exc:
            _log.error("span export is off: %s", exc)
            processor = None
        if processor is None:
            return cls(None, meter_provider=meter, owns_meter=owns_meter, span_time=span_time)
        return cls(
            processor,
            resource=resource,
            meter_provider=meter,
            owns_meter=owns_meter,
            span_time=span_time,
        )

    @property
    def span_time(self) -> SpanTime:
        """The clock of span times ("auto", "wall" or "journal")."""
        return self._span_clock.mode

    @property
    def enabled(self) -> bool:
        """Whether spans or metrics are exported at all."""
        return self._sink is not None or self._metrics is not None

    def emit(self, events: Sequence[Event]) -> None:
        """Project committed events and pass on the spans they ended and what they count."""
        self._emit(events, live=True)

    def _emit(self, events: Sequence[Event], *, live: bool) -> None:
        if self._sink is None and self._metrics is None:
            return
        records = self._projector.feed(events)
        if self._sink is not None:
            spans = records
            if self._held and events:
                # Sent now, counted never again: the metrics saw them in an earlier run.
                spans = [*self._held, *records]
                self._held = []
            if spans and events:
                self._span_clock.place(
                    spans, events[-1].ts, live=live, is_open=self._projector.is_open
                )
            self._sink.write(spans)
        if self._metrics is not None:
            self._metrics.feed(events, records)

    @property
    def measures(self) -> bool:
        """Whether metrics are exported."""
        return self._metrics is not None

    def install(self, journal: Journal, depths: Callable[[], Mapping[str, int]]) -> None:
        """Measure what the journal does not record: its commit latency (through its commit
        observer) and the mailboxes' depths (``depths()``, read at each collection).

        Nothing is installed while metrics are off.
        """
        if self._metrics is None:
            return
        journal.observe_commits(self._metrics.committed)
        self._metrics.watch_mailboxes(depths)

    def resume(self, events: Sequence[Event]) -> None:
        """Take up flows an earlier run left open: re-send their finished spans (same ids,
        same content) without counting their past again."""
        if self._sink is None and self._metrics is None:
            return
        records = self._projector.feed(events)
        if self._sink is not None:
            if self._span_clock.mode == "journal":
                self._sink.write(records)
            else:
                self._held.extend(records)
        if self._metrics is not None:
            self._metrics.resume(events)

    def reasoning(self, dfid: str, attempt: int) -> AbstractContextManager[None]:
        """Make the reasoning span of ``dfid``'s ``attempt`` the current span context.

        An instrumented LLM or tool call made inside ``decide()`` then becomes that
        span's child, in the flow's trace.
        """
        return self._sink.reasoning(dfid, attempt) if self._sink is not None else nullcontext()

    async def run(self, subscription: AsyncIterable[Sequence[Event]]) -> None:
        """Emit every batch of a journal subscription until it ends."""
        async for batch in subscription:
            self.emit(batch)

    def shutdown(self, timeout_s: float = 3.0) -> bool:
        """Flush (and, if the provider is the kernel's own, shut down) within about ``timeout_s``.

        Blocks the calling thread; from async code run it in a worker thread.
        Returns whether it finished in time.
        """
        if self._held and self._sink is not None:
            # No live batch came to measure the clock by: the recorded times, then.
            held, self._held = self._held, []
            self._sink.write(held)
        sink, self._sink = self._sink, None
        metrics, self._metrics = self._metrics, None
        done = True
        if metrics is not None:
            meter = metrics.provider
            if isinstance(meter, MeterProvider):
                work = meter.shutdown if self._owns_meter else meter.force_flush
                done = _bounded(work, timeout_s, "metrics export shutdown")
        if sink is None:
            return done
        provider = sink.provider
        if not self._owned:
            flushed = _bounded(
                lambda: provider.force_flush(int(timeout_s * 1000)), timeout_s, "flush"
            )
            return flushed and done

        def close() -> None:
            try:
                provider.force_flush(int(timeout_s * 1000))
            finally:
                provider.shutdown()

        return _bounded(close, timeout_s, "span export shutdown") and done


def spans_for_events(
    events: Iterable[Event],
    *,
    resource: Resource | None = None,
    span_time: SpanTime = "journal",
) -> list[ReadableSpan]:
    """Return the spans ``events`` end (every sampled-in span, in the order they end).

    On the recorded times unless ``span_time`` says otherwise: a pure function of ``events``.
    """
    collector = Collector()
    telemetry = Telemetry(collector, resource=resource, sampler=ALWAYS_ON, span_time=span_time)
    telemetry._emit(list(events), live=False)
    return collector.spans


def _flow_and_descendants(events: Iterable[Event], dfid: str) -> Iterator[Event]:
    wanted = {dfid}
    for event in events:
        if event.dfid is None:
            continue
        # Seq order puts a parent's FlowCreated before any child's.
        if event.parent_dfid in wanted and isinstance(event.payload, FlowCreated):
            wanted.add(event.dfid)
        if event.dfid in wanted:
            yield event


def export_flows(
    events: Iterable[Event],
    processor: SpanProcessor,
    *,
    dfid: str | None = None,
    resource: Resource | None = None,
    span_time: SpanTime | None = None,
    env: Mapping[str, str] = os.environ,
) -> int:
    """Re-emit the spans of past flows (all, or ``dfid`` and its descendants); return how many.

    Only what has ended is sent (a waiting flow's root, its finished stages), with the
    ids and content the live export gave them. The sampler is the SDK's, from the
    environment. Span times: ``span_time``, else ``DIRK_SPAN_TIME`` in ``env``; "auto"
    keeps the recorded times (an export cannot tell a simulated clock from a real one
    long past), "wall" moves all flows by one shift so that the newest exported event
    lands now. The caller owns ``processor`` and flushes or shuts it down afterwards.
    """
    selected = events if dfid is None else _flow_and_descendants(events, dfid)
    counter = _Counting(processor)
    telemetry = Telemetry(
        counter, resource=resource, span_time=span_time or span_time_from_env(env)
    )
    telemetry._emit(list(selected), live=False)
    return counter.count


class _Counting(SpanProcessor):
    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner
        self.count = 0

    def on_end(self, span: ReadableSpan) -> None:
        self.count += 1
        self.inner.on_end(span)
