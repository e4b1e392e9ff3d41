"""Spans as a projection of the journal, exported live through a TracerProvider.

Every DecisionFlow is one trace whose id is its DFID; a stage's span leaves as
the stage ends, a waiting flow's root as soon as it waits (see docs/traces.md).
The host application's SDK TracerProvider governs sampling, limits, resource and
exporters; without one, the standard ``OTEL_*`` variables do (a ratio sampler
decides on a hash of the DFID). Span times are on the wall clock when the journal's
is a simulated one (``span_time``, ``DIRK_SPAN_TIME``). The OTLP exporters are the
optional extra ``dir-kernel[otlp]``.
"""

from kernel.telemetry._clock import SpanTime
from kernel.telemetry._ids import caller_context, span_id_for, trace_id_for, traceparent_of
from kernel.telemetry._otlp import (
    DEFAULT_SERVICE_NAME,
    ExporterUnavailable,
    configure_exporter,
    resource_from_env,
)
from kernel.telemetry._project import PROVIDER_NAME, SpanRecord
from kernel.telemetry._projector import SpanProjector
from kernel.telemetry._sampling import DfidRatioBased, flow_sampler
from kernel.telemetry._telemetry import (
    Telemetry,
    export_flows,
    shutdown_processor,
    spans_for_events,
)

__all__ = [
    "DEFAULT_SERVICE_NAME",
    "PROVIDER_NAME",
    "DfidRatioBased",
    "ExporterUnavailable",
    "SpanProjector",
    "SpanRecord",
    "SpanTime",
    "Telemetry",
    "caller_context",
    "configure_exporter",
    "export_flows",
    "flow_sampler",
    "resource_from_env",
    "shutdown_processor",
    "span_id_for",
    "spans_for_events",
    "trace_id_for",
    "traceparent_of",
]
