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
import math
import os
import threading
import time
from collections.abc import AsyncIterable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext

import anyio
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
from kernel.telemetry._principal import PrincipalSpans, user_key_from_env
from kernel.telemetry._project import SpanRecord
from kernel.telemetry._ship import SHUT_DOWN, SpanShipper
from kernel.telemetry._sink import Collector, DirectSink, SpanSink

__all__ = ["Telemetry", "export_flows", "shutdown_processor", "spans_for_events"]

_log = logging.getLogger(__name__)

_SLICE = 512
"""Events projected between two looks at the exporter's queue (at most ~2 spans each)."""
_DRAIN_S = 5.0
_WAIT_S = 1.0
"""A wait for room in a worker thread ends this often, so a cancelled one ends soon."""


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
        drain_s: how long the kernel's close waits for the exporter to take the spans of
            what it has not exported yet (``DIRK_SPAN_DRAIN_S`` in :meth:`from_env`); what
            is left then is counted and logged, and ``dirk traces export`` can send it.
        user_key: the key that pseudonymises ``user.id`` on spans (``DIRK_SPAN_USER_KEY``
            in :meth:`from_env`; None: the user's id as recorded). Never put on a span.
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
        drain_s: float = _DRAIN_S,
        user_key: bytes | None = None,
    ) -> None:
        self._span_clock = SpanClock(span_time)
        if not 0 <= drain_s < math.inf:
            raise ValueError(f"drain_s must be a finite number of seconds, not {drain_s!r}")
        self._drain_s = drain_s
        # The kernel's own shipper tells the telemetry task when it has room; a host's
        # processors (or a test's) take every span at once.
        self._shipper = processor if isinstance(processor, SpanShipper) else None
        self.unexported = 0
        """Events whose spans were never handed to the exporter: the close ran out of time."""
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
        # Spans carry their flow's user and tenant; ``user_key`` pseudonymises the user.
        self._projector = PrincipalSpans(user_key)

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
        return cls(
            provider=provider,
            span_time=span_time or span_time_from_env(env),
            user_key=user_key_from_env(env),
        )

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
        key = user_key_from_env(env)
        host = trace.get_tracer_provider()
        host_meter = host_meter_provider()
        if isinstance(host, TracerProvider):
            return cls(
                provider=host,
                meter_provider=host_meter,
                owns_meter=False,
                span_time=span_time,
                user_key=key,
            )
        resource = resource_from_env(env)
        drain_s = _drain_from_env(env)
        meter = host_meter or meter_provider_from_env(env, resource)
        owns_meter = host_meter is None
        try:
            processor = configure_exporter(env)
        except ExporterUnavailable as exc:
            _log.error("span export is off: %s", exc)
            processor = None
        if processor is None:
            return cls(
                None, meter_provider=meter, owns_meter=owns_meter, span_time=span_time, user_key=key
            )
        return cls(
            processor,
            resource=resource,
            meter_provider=meter,
            owns_meter=owns_meter,
            span_time=span_time,
            drain_s=drain_s,
            user_key=key,
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
        """Emit every batch of a journal subscription until it ends, at the exporter's pace."""
        async for batch in subscription:
            await self._emit_paced(batch)

    async def _emit_paced(self, batch: Sequence[Event], exported: list[int] | None = None) -> None:
        """Emit ``batch`` a slice at a time, each once the exporter has room; keep
        ``exported[0]`` at the last event emitted."""
        start, end = 0, len(batch)
        while start < end:
            await self.wait_for_room()
            stop = min(start + _SLICE, end)
            while stop < end and batch[stop].seq == batch[stop - 1].seq:
                stop += 1  # never between a row and the event it stands for (one seq)
            part = batch[start:stop]
            self.emit(part)
            if exported is not None:
                exported[0] = part[-1].seq
            start = stop

    @property
    def dropped(self) -> Mapping[str, int]:
        """Spans the kernel's own exporter lost, by reason (:mod:`kernel.telemetry._ship`)."""
        return dict(self._shipper.dropped) if self._shipper is not None else {}

    async def wait_for_room(self, deadline: float = math.inf) -> bool:
        """Wait until the kernel's exporter has room for more spans, or ``deadline``
        (``time.monotonic()``) passes; return whether it has room.

        The wait is in a worker thread, so the event loop, and every decision on it, goes
        on meanwhile; a host's provider (or none) always has room.
        """
        shipper = self._shipper
        if shipper is None or self._sink is None:
            return True
        if shipper.queued < shipper.max_queue_size:
            return True  # the common case: no thread hop
        while (left := deadline - time.monotonic()) > 0:
            wait_s = min(left, _WAIT_S)
            if await anyio.to_thread.run_sync(
                shipper.wait_for_room, wait_s, abandon_on_cancel=True
            ):
                return True
        return False

    async def follow(self, journal: Journal, exported: list[int]) -> None:
        """Emit what ``journal`` commits after ``exported[0]``, keeping ``exported[0]`` at the
        last event emitted, at the exporter's pace; until the journal closes.

        Falling behind costs the kernel nothing but memory the subscription bounds: it
        reads the events it missed from the journal when the exporter has room again.
        """
        async with journal.subscribe(exported[0] + 1) as batches:
            async for batch in batches:
                await self._emit_paced(batch, exported)

    async def finish(self, journal: Journal, exported: list[int]) -> bool:
        """Emit what ``journal`` holds after ``exported[0]`` and shut down, all within about
        ``drain_s`` (plus the exporter's timeout); return whether every span was handed over
        and exported.

        What the exporter did not take in time is counted (:attr:`unexported` events,
        :attr:`dropped` spans) and logged with the seqs to export again.
        """
        deadline = time.monotonic() + self._drain_s
        head = journal.head_seq
        done = True
        while exported[0] < head:
            if not await self.wait_for_room(deadline):
                done = False
                break
            events = await journal.read(exported[0] + 1, head + 1, limit=_SLICE)
            if not events:
                break
            self.emit(events)
            exported[0] = events[-1].seq
        if exported[0] < head:
            self.unexported = head - exported[0]
            _log.warning(
                "the spans of events %d to %d were not exported within %g s (the exporter is"
                " slow or down): `dirk traces export` sends them",
                exported[0] + 1,
                head,
                self._drain_s,
            )
        left = max(deadline - time.monotonic(), 0.5)
        finished = await anyio.to_thread.run_sync(self.shutdown, left)
        lost = self.dropped.get(SHUT_DOWN, 0)
        return done and finished and not lost

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


def _drain_from_env(env: Mapping[str, str]) -> float:
    raw = env.get("DIRK_SPAN_DRAIN_S", "").strip()
    try:
        value = float(raw) if raw else _DRAIN_S
    except ValueError:
        value = -1.0
    if not (0 <= value < math.inf):
        _log.warning("DIRK_SPAN_DRAIN_S=%r is not a number of seconds; using %g", raw, _DRAIN_S)
        return _DRAIN_S
    return value


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
