"""Spans as a projection of the journal, and their export over OTLP."""

from kernel.telemetry._spans import (
    DEFAULT_SERVICE_NAME,
    SpanProjector,
    Telemetry,
    configure_exporter,
    export_flows,
    resource_from_env,
    shutdown_processor,
    span_id_for,
    spans_for_events,
    trace_id_for,
)

__all__ = [
    "DEFAULT_SERVICE_NAME",
    "SpanProjector",
    "Telemetry",
    "configure_exporter",
    "export_flows",
    "resource_from_env",
    "shutdown_processor",
    "span_id_for",
    "spans_for_events",
    "trace_id_for",
]
