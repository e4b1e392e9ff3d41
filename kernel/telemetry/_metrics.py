"""The numbers an operator alerts on, through the OpenTelemetry metrics SDK.

Like spans, metrics are a fold over committed events (and the span records
they end), so they cost the kernel's hot path nothing: flows ended by final
status, verdicts by reason code, escalations waiting and how long they waited,
execution retries, adapter latency, actor restarts and the size of the journal's commit batches.
Two numbers are not in the journal, so they come through ports the kernel's boot
connects: the journal's commit latency (its commit observer) and the depth of each
actor's mailbox (read when the metrics are collected).
Off unless an OTLP endpoint is configured (or the application set an SDK
MeterProvider as the global one).

Each histogram advises bucket bounds that fit what it measures (the SDK's default
bounds, 0 to 10,000 with 5 as the first, would put every journal commit in one
bucket): commits from tens of microseconds, adapter calls up to a minute, human
waits from a second to a week, batch sizes in powers. An application's View
still wins over the advice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from kernel.core.events import (
    ActorRestarted,
    ApprovalExpired,
    DriftBreached,
    Event,
    ExecutionRetried,
    FlowAborted,
    FlowClosed,
    FlowCompensated,
    FlowEscalated,
    HumanDecided,
    ProposalAccepted,
    ProposalRejected,
)
from kernel.registry import KERNEL_VERSION
from kernel.telemetry._otlp import ExporterUnavailable, _first, _timeout
from kernel.telemetry._project import SpanRecord

__all__ = [
    "BATCH_BUCKETS",
    "COMMIT_BUCKETS",
    "EXECUTION_BUCKETS",
    "WAIT_BUCKETS",
    "FlowMetrics",
    "configure_meter_provider",
]

_log = logging.getLogger(__name__)
_NS_PER_S = 1e9

COMMIT_BUCKETS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5,
)  # fmt: skip
"""Seconds: a journal transaction, 50 µs (SQLite, synchronous OFF) to seconds (a stalled disk)."""

EXECUTION_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
"""Seconds: an adapter call, in-process (100 µs) to a slow remote system (a minute)."""

WAIT_BUCKETS: tuple[float, ...] = (
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0,
    86400.0, 172800.0, 604800.0,
)  # fmt: skip
"""Seconds: an escalation waiting for a human, a second to a week."""

BATCH_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
"""Events in one committed batch: one alone, then group commits of growing size."""


def configure_meter_provider(env: Mapping[str, str], resource: Resource) -> MeterProvider | None:
    """Return a MeterProvider exporting over OTLP as ``env`` asks, or None (metrics off).

    On only when an OTLP endpoint is set and ``OTEL_METRICS_EXPORTER`` does not say
    "none"; the exporter reads its headers, compression and TLS from the environment.

    Raises:
        ExporterUnavailable: an endpoint is set but ``dir-kernel[otlp]`` is not installed.
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if "none" in {n.strip().lower() for n in (env.get("OTEL_METRICS_EXPORTER") or "").split(",")}:
        return None
    signal, generic = "OTEL_EXPORTER_OTLP_METRICS_", "OTEL_EXPORTER_OTLP_"
    endpoint = _first(env, signal + "ENDPOINT")
    if not endpoint and not _first(env, generic + "ENDPOINT"):
        return None
    protocol = _first(env, signal + "PROTOCOL", generic + "PROTOCOL").lower() or "http/protobuf"
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter as GrpcMetricExporter,
            )

            exporter: object = GrpcMetricExporter(
                endpoint=endpoint or _first(env, generic + "ENDPOINT"), timeout=_timeout(env)
            )
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )

            if not endpoint:
                endpoint = _first(env, generic + "ENDPOINT").rstrip("/") + "/v1/metrics"
            exporter = OTLPMetricExporter(endpoint=endpoint, timeout=_timeout(env))
    except ImportError as exc:
        raise ExporterUnavailable(
            f"OTLP export needs the exporters: pip install 'dir-kernel[otlp]' ({exc.name})"
        ) from None
    reader = PeriodicExportingMetricReader(exporter)  # type: ignore[arg-type]
    return MeterProvider([reader], resource=resource, shutdown_on_exit=False)


def host_meter_provider() -> MeterProvider | None:
    """The application's global MeterProvider, if it set an SDK one."""
    provider = metrics.get_meter_provider()
    return provider if isinstance(provider, MeterProvider) else None


class FlowMetrics:
    """Counts what committed events say, into instruments of ``provider``."""

    def __init__(self, provider: metrics.MeterProvider) -> None:
        self.provider = provider
        meter = provider.get_meter("kernel.telemetry", KERNEL_VERSION)
        self._flows = meter.create_counter(
            "dir.flows", unit="{flow}", description="DecisionFlows ended, by final status"
        )
        self._verdicts = meter.create_counter(
            "dir.verdicts", unit="{verdict}", description="Verdicts, by verdict and reason code"
        )
        self._waiting = meter.create_up_down_counter(
            "dir.escalations.waiting", unit="{flow}", description="Flows waiting for a human"
        )
        self._wait = meter.create_histogram(
            "dir.escalation.wait",
            unit="s",
            description="How long escalations waited for a human",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS,
        )
        self._retries = meter.create_counter(
            "dir.execution.retries", unit="{retry}", description="Execution retries, by key"
        )
        self._latency = meter.create_histogram(
            "dir.execution.duration",
            unit="s",
            description="Adapter execution time, by adapter",
            explicit_bucket_boundaries_advisory=EXECUTION_BUCKETS,
        )
        self._restarts = meter.create_counter(
            "dir.actor.restarts", unit="{restart}", description="Actor restarts, by actor"
        )
        self._batch = meter.create_histogram(
            "dir.journal.batch_size",
            unit="{event}",
            description="Events per committed batch",
            explicit_bucket_boundaries_advisory=BATCH_BUCKETS,
        )
        self._commit = meter.create_histogram(
            "dir.journal.commit.duration",
            unit="s",
            description="Time to commit one journal transaction (write and sync)",
            explicit_bucket_boundaries_advisory=COMMIT_BUCKETS,
        )
        self._breaches = meter.create_counter(
            "dir.drift.breaches",
            unit="{breach}",
            description="Drift monitors' breaches, by monitor, metric, action and agent",
        )
        self._depths: Callable[[], Mapping[str, int]] | None = None
        meter.create_observable_gauge(
            "dir.mailbox.depth",
            callbacks=[self._observe_depths],
            unit="{message}",
            description="Messages waiting in each actor's mailbox",
        )
        self._escalated: dict[str, int] = {}

    def committed(self, events: int, duration_ns: int) -> None:
        """The journal's commit observer: one transaction of ``events`` took ``duration_ns``."""
        self._commit.record(max(0, duration_ns) / _NS_PER_S)

    def watch_mailboxes(self, depths: Callable[[], Mapping[str, int]]) -> None:
        """Read the mailboxes' depths from ``depths`` whenever the metrics are collected."""
        self._depths = depths

    def _observe_depths(self, options: CallbackOptions) -> Iterable[Observation]:
        depths = self._depths
        if depths is None:
            return []
        try:
            return [Observation(n, {"dir.mailbox": name}) for name, n in depths().items()]
        except Exception:
            # Collected in the reader's thread while the kernel runs or stops: skip a round.
            return []

    def feed(self, events: Sequence[Event], records: Iterable[SpanRecord]) -> None:
        """Count one committed batch and the span records it ended."""
        if events:
            self._batch.record(len(events))
        for event in events:
            dfid = event.dfid or ""
            match event.payload:
                case ProposalAccepted():
                    self._verdicts.add(1, {"dir.verdict": "ACCEPTED"})
                case ProposalRejected(feedback=feedback):
                    code = str(feedback.reason_code)
                    self._verdicts.add(1, {"dir.verdict": "REJECTED", "dir.reason_code": code})
                case FlowEscalated(reason_code=code):
                    self._verdicts.add(
                        1, {"dir.verdict": "ESCALATED", "dir.reason_code": str(code)}
                    )
                    if dfid not in self._escalated:
                        self._escalated[dfid] = event.ts
                        self._waiting.add(1)
                case HumanDecided() | ApprovalExpired():
                    self._unwait(dfid, event.ts)
                case ExecutionRetried():
                    self._retries.add(1)
                case ActorRestarted(actor=actor):
                    self._restarts.add(1, {"dir.actor": actor})
                case DriftBreached() as breach:
                    self._breaches.add(1, _breach_attributes(breach))
                case FlowClosed() | FlowAborted() | FlowCompensated():
                    self._unwait(dfid, event.ts)
                    status = {FlowClosed: "CLOSED", FlowAborted: "ABORTED"}.get(
                        type(event.payload), "COMPENSATED"
                    )
                    self._flows.add(1, {"dir.status": status})
        for record in records:
            if record.where[0] == "execute":
                outcome = "error" if record.error else "ok"
                attrs = {
                    "dir.adapter": str(record.attrs.get("dir.adapter", "")),
                    "outcome": outcome,
                }
                self._latency.record((record.end - record.start) / _NS_PER_S, attrs)

    def resume(self, events: Iterable[Event]) -> None:
        """Take up the flows an earlier run left waiting, counting nothing else again."""
        for event in events:
            if isinstance(event.payload, FlowEscalated) and event.dfid:
                if event.dfid not in self._escalated:
                    self._escalated[event.dfid] = event.ts
                    self._waiting.add(1)
            elif isinstance(event.payload, HumanDecided | ApprovalExpired) and event.dfid:
                if self._escalated.pop(event.dfid, None) is not None:
                    self._waiting.add(-1)

    def _unwait(self, dfid: str, ts: int) -> None:
        began = self._escalated.pop(dfid, None)
        if began is not None:
            self._waiting.add(-1)
            self._wait.record(max(0, ts - began) / _NS_PER_S)


def meter_provider_from_env(env: Mapping[str, str], resource: Resource) -> MeterProvider | None:
    """The host's SDK MeterProvider, else one from ``env``; None when metrics are off."""
    host = host_meter_provider()
    if host is not None:
        return host
    try:
        return configure_meter_provider(env, resource)
    except ExporterUnavailable as exc:
        _log.error("metrics export is off: %s", exc)
        return None


def _breach_attributes(breach: DriftBreached) -> dict[str, str]:
    """A breach's metric attributes: the agent by id; a principal's breach names no user."""
    attrs = {
        "dir.drift.monitor": breach.monitor,
        "dir.drift.metric": breach.metric,
        "dir.drift.action": breach.action,
        "dir.drift.by": breach.by,
    }
    if breach.by == "agent":
        attrs["dir.agent"] = breach.subject
    return attrs
