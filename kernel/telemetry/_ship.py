"""The kernel's span shipper: batches to an exporter on a thread of its own, dropping nothing
while its writer waits for room.

The SDK's BatchSpanProcessor drops a span whenever its queue is full ("Queue full, dropping
Span"): the kernel, which ends five spans per flow thousands of times a second, outruns
any exporter sharing its GIL, and P2 delivered 0.68 of its spans (docs/benchmarks.md, "S2:
spans under load"). Here the writer asks first: the telemetry task waits (off the event
loop's path, see :meth:`SpanShipper.wait_for_room`) until the queue has room, and its
journal subscription falls behind and reads from the database meanwhile, so the queue is
bounded without dropping and the kernel's decisions never wait for the exporter.

A span can still be lost in three ways, each counted (:attr:`SpanShipper.dropped`, by
reason) and logged with its reason: the exporter refused a batch for longer than
``give_up_s`` (the collector is down), the shipper was shut down with spans still queued (a
close that ran out of time), or a writer that does not wait pushed the queue past four
times its size.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, detach, set_value
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["EXPORT_FAILED", "OVERFLOW", "SHUT_DOWN", "Fanout", "SpanShipper"]

_log = logging.getLogger(__name__)

EXPORT_FAILED = "export_failed"
"""The exporter refused a batch for ``give_up_s`` (the collector is down or refuses it)."""
SHUT_DOWN = "shut_down"
"""The shipper was shut down (the kernel's close ran out of time) with the spans still queued."""
OVERFLOW = "queue_overflow"
"""A writer that does not wait for room pushed the queue past its limit."""

# A writer that waits for room still hands over one slice of events past it (the kernel's
# telemetry task: 512 events, at most ~1,000 spans); one that never waits may overrun the
# queue up to four times its size plus this before spans are dropped: memory stays
# bounded whoever writes.
_SLACK = 4096
_JOIN_S = 10.0
_FIRST_RETRY_S = 0.1
_MAX_RETRY_S = 2.0


class Fanout(SpanExporter):
    """One batch to several exporters (``OTEL_TRACES_EXPORTER=otlp,console``): it succeeds
    only when every exporter took it."""

    def __init__(self, exporters: Sequence[SpanExporter]) -> None:
        self.exporters = tuple(exporters)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        results = [exporter.export(spans) for exporter in self.exporters]
        ok = all(result is SpanExportResult.SUCCESS for result in results)
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        for exporter in self.exporters:
            exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(exporter.force_flush(timeout_millis) for exporter in self.exporters)


class SpanShipper(SpanProcessor):
    """Queue ended spans and export them in batches from a thread of its own.

    Args:
        exporter: where batches go.
        max_queue_size: the queue's size: a writer that waits (:meth:`wait_for_room`) never
            finds it fuller than this plus one write; past four times this (plus 4,096)
            spans are dropped.
        max_export_batch_size: spans per export call (one OTLP/HTTP request).
        schedule_delay_s: how long a partial batch may wait for more spans.
        give_up_s: how long a refused batch is retried (with backoff) before it is
            dropped and counted: the bound on what a collector that is down costs.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_size: int = 2048,
        max_export_batch_size: int = 512,
        schedule_delay_s: float = 0.5,
        give_up_s: float = 30.0,
    ) -> None:
        if max_queue_size < 1 or max_export_batch_size < 1:
            raise ValueError("the queue and the export batch hold at least one span")
        self.exporter = exporter
        self.max_queue_size = max_queue_size
        self._limit = 4 * max_queue_size + _SLACK
        self._batch = max_export_batch_size
        self._delay_s = schedule_delay_s
        self._give_up_s = give_up_s
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._lock = threading.Condition()
        # Spans taken from the queue whose export has not ended: a flush waits for them too.
        self._in_flight = 0
        self._flushing = 0
        self._stopping = False
        self.exported = 0
        """Spans the exporter took."""
        self.high_water = 0
        """The most spans the queue ever held."""
        self.refused = 0
        """Export calls that failed (each retried until ``give_up_s``)."""
        self.dropped: dict[str, int] = {}
        """Spans lost, by reason (:data:`EXPORT_FAILED`, :data:`SHUT_DOWN`, :data:`OVERFLOW`)."""
        self._thread = threading.Thread(target=self._work, name="dir-span-export", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        """Spans waiting in the queue or in the batch being exported."""
        return len(self._queue) + self._in_flight

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        with self._lock:
            if self._stopping:
                self._drop(1, SHUT_DOWN)
                return
            if len(self._queue) >= self._limit:
                self._drop(1, OVERFLOW)
                return
            self._queue.append(span)
            if (n := len(self._queue)) > self.high_water:
                self.high_water = n
            if n >= self._batch:
                self._lock.notify_all()

    def wait_for_room(self, timeout_s: float | None = None) -> bool:
        """Block until the queue is at most half full; return whether it is (False: timed out).

        Half, not one below full: the writer then hands over a good share of a queue at a
        time, instead of waking for every batch the exporter takes.
        """
        low = self.max_queue_size // 2
        with self._lock:
            return self._lock.wait_for(lambda: len(self._queue) <= low or self._stopping, timeout_s)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export everything queued now; return whether it was done within the timeout."""
        deadline = time.monotonic() + timeout_millis / 1000
        with self._lock:
            self._flushing += 1
            self._lock.notify_all()
            try:
                return self._lock.wait_for(
                    lambda: not self._queue and not self._in_flight,
                    max(0.0, deadline - time.monotonic()),
                )
            finally:
                self._flushing -= 1

    def shutdown(self) -> None:
        """Stop the export thread; what is still queued is dropped and counted."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            self._lock.notify_all()
        # Retries end at once; an export in flight ends within the exporter's timeout.
        self._thread.join(_JOIN_S)
        with self._lock:
            if self._queue:
                self._drop(len(self._queue), SHUT_DOWN)
                self._queue.clear()
        self.exporter.shutdown()

    def _drop(self, count: int, reason: str) -> None:
        # Called holding the lock. Logged the first time and then at each doubling, so a
        # writer dropping span by span does not flood the log.
        before = self.dropped.get(reason, 0)
        self.dropped[reason] = after = before + count
        if before == 0 or after.bit_length() > before.bit_length():
            _log.warning("%d spans dropped in all (%s, %d this time)", after, reason, count)
        self._lock.notify_all()

    def _next_batch(self) -> list[ReadableSpan] | None:
        """Wait for a full batch, a flush, the schedule delay or the end; None when stopping."""
        with self._lock:
            self._lock.wait_for(
                lambda: len(self._queue) >= self._batch or self._flushing or self._stopping,
                self._delay_s,
            )
            if self._stopping or not self._queue:
                return None if self._stopping else []
            queue = self._queue
            batch = [queue.popleft() for _ in range(min(self._batch, len(queue)))]
            self._in_flight = len(batch)
            # Room was made: a writer waiting for it goes on while this batch is exported.
            self._lock.notify_all()
            return batch

    def _work(self) -> None:
        # The exporter's own HTTP calls must not become spans of the application's tracer.
        token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            while (batch := self._next_batch()) is not None:
                if batch:
                    self._export(batch)
        finally:
            detach(token)

    def _export(self, batch: list[ReadableSpan]) -> None:
        """Export ``batch``, retrying with backoff for ``give_up_s``, then count it as dropped."""
        give_up = time.monotonic() + self._give_up_s
        wait_s = _FIRST_RETRY_S
        while True:
            try:
                done = self.exporter.export(batch) is SpanExportResult.SUCCESS
            except Exception:
                _log.exception("the span exporter failed")
                done = False
            with self._lock:
                if done:
                    self.exported += len(batch)
                else:
                    self.refused += 1
                    if self._stopping or time.monotonic() + wait_s > give_up:
                        self._drop(len(batch), EXPORT_FAILED)
                        done = True
                if done:
                    self._in_flight = 0
                    self._lock.notify_all()
                    return
                # Woken early only by shutdown, which ends the retries.
                self._lock.wait_for(lambda: self._stopping, wait_s)
            wait_s = min(wait_s * 2, _MAX_RETRY_S)
