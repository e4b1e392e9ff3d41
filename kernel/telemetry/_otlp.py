"""What the ``OTEL_*`` variables configure: the Resource and the span exporters.

The SDK does the reading: ``Resource.create()`` detects ``OTEL_RESOURCE_ATTRIBUTES``
and ``OTEL_SERVICE_NAME``, the TracerProvider takes its sampler and span limits
from the environment, and the OTLP exporters read their headers, compression and
TLS files themselves. The kernel only picks the exporter (export is off unless
an endpoint or the console exporter is named), gives its default service name
to a service that has none, keeps its timeout short, and ships spans through a
queue whose writer waits for room rather than one that drops (kernel.telemetry._ship).
The OTLP exporters come with the optional extra ``dir-kernel[otlp]``; nothing here
imports them until an endpoint asks for one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter

from kernel.telemetry._ship import Fanout, SpanShipper

__all__ = [
    "DEFAULT_SERVICE_NAME",
    "ExporterUnavailable",
    "configure_exporter",
    "resource_from_env",
]

_log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "dir-kernel"
"""The ``service.name`` of exported spans when neither ``OTEL_SERVICE_NAME`` nor
``OTEL_RESOURCE_ATTRIBUTES`` names one."""

# The SDK's 10 s export timeout, spent on retries with backoff, stalls a flush
# for tens of seconds when the collector is down (DESIGN.md section 6).
_EXPORT_TIMEOUT_S = 2.0
# The queue bounds memory, not delivery: the kernel's telemetry task waits for room
# (kernel.telemetry._ship). So it needs no more than the SDK's 2,048 spans and batches of
# 512: a larger queue delivers no more, keeps more spans alive for the cyclic GC to walk,
# and has the exporter encode while decisions wait for the GIL (docs/benchmarks.md, "S2:
# spans under load").
_MAX_QUEUE_SIZE = 2048
_EXPORT_BATCH = 512
_SCHEDULE_DELAY_MS = 500
_TRACES, _GENERIC = "OTEL_EXPORTER_OTLP_TRACES_", "OTEL_EXPORTER_OTLP_"


class ExporterUnavailable(RuntimeError):
    """An OTLP endpoint is configured but the exporters are not installed (``dir-kernel[otlp]``)."""


def resource_from_env(env: Mapping[str, str] | None = None) -> Resource:
    """Return the Resource the SDK detects, with "dir-kernel" if it names no service.

    ``env`` may name ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` beyond the
    process's own environment (tests do); the process's variables are read by the SDK.
    """
    extra: dict[str, str] = {}
    if env is not None and env is not os.environ:
        for pair in (env.get("OTEL_RESOURCE_ATTRIBUTES") or "").split(","):
            key, sep, value = pair.partition("=")
            if sep and key.strip():
                extra[key.strip()] = value.strip()
        if name := (env.get("OTEL_SERVICE_NAME") or "").strip():
            extra[SERVICE_NAME] = name
    resource = Resource.create(extra)
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


def _first(env: Mapping[str, str], *names: str) -> str:
    for name in names:
        if value := env.get(name, "").strip():
            return value
    return ""


def _timeout(env: Mapping[str, str]) -> float | None:
    # Ours only when the environment sets none: the exporter reads that itself.
    return None if _first(env, _TRACES + "TIMEOUT", _GENERIC + "TIMEOUT") else _EXPORT_TIMEOUT_S


def _otlp_exporter(env: Mapping[str, str]) -> SpanExporter:
    """Build the OTLP exporter for the protocol ``env`` names (http/protobuf by default)."""
    protocol = _first(env, _TRACES + "PROTOCOL", _GENERIC + "PROTOCOL").lower() or "http/protobuf"
    endpoint = _first(env, _TRACES + "ENDPOINT")
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )

            return GrpcExporter(
                endpoint=endpoint or _first(env, _GENERIC + "ENDPOINT"), timeout=_timeout(env)
            )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise ExporterUnavailable(
            f"OTLP export needs the exporters: pip install 'dir-kernel[otlp]' ({exc.name})"
        ) from None
    if protocol != "http/protobuf":
        _log.warning("unsupported OTLP protocol %r, using http/protobuf", protocol)
    if not endpoint:
        # The SDK's rule: the signal path is appended to the generic endpoint only.
        endpoint = _first(env, _GENERIC + "ENDPOINT").rstrip("/") + "/v1/traces"
    return OTLPSpanExporter(endpoint=endpoint, timeout=_timeout(env))


def configure_exporter(
    env: Mapping[str, str] = os.environ, *, give_up_s: float = 30.0
) -> SpanShipper | None:
    """Return a batching span processor as the ``OTEL_*`` variables in ``env`` ask, or None.

    The processor is a :class:`~kernel.telemetry._ship.SpanShipper` (``OTEL_BSP_MAX_QUEUE_SIZE``,
    ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` and ``OTEL_BSP_SCHEDULE_DELAY`` size it): one queue
    and one export thread, whatever the number of exporters. A batch the collector refuses
    is retried for ``give_up_s``, then dropped and counted (0: tried once).

    Export is on only when an OTLP endpoint is set or ``OTEL_TRACES_EXPORTER``
    names "console"; ``OTEL_SDK_DISABLED=true``, ``OTEL_TRACES_EXPORTER=none``
    or no configuration at all turn it off quietly.

    Raises:
        ExporterUnavailable: an endpoint is set but ``dir-kernel[otlp]`` is not installed.
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    chosen = env.get("OTEL_TRACES_EXPORTER") or "otlp"
    names = {name.strip().lower() for name in chosen.split(",")}
    if "none" in names:
        return None
    exporters: list[SpanExporter] = []
    if "console" in names:
        exporters.append(ConsoleSpanExporter())
    if "otlp" in names and _first(env, _TRACES + "ENDPOINT", _GENERIC + "ENDPOINT"):
        exporters.append(_otlp_exporter(env))
    if unknown := names - {"otlp", "console", ""}:
        _log.warning("ignoring unsupported trace exporters %s", sorted(unknown))
    if not exporters:
        return None
    exporter = exporters[0] if len(exporters) == 1 else Fanout(exporters)
    return SpanShipper(
        exporter,
        max_queue_size=_positive(env, "OTEL_BSP_MAX_QUEUE_SIZE", _MAX_QUEUE_SIZE),
        max_export_batch_size=_positive(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", _EXPORT_BATCH),
        schedule_delay_s=_positive(env, "OTEL_BSP_SCHEDULE_DELAY", _SCHEDULE_DELAY_MS) / 1000,
        give_up_s=give_up_s,
    )


def _positive(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        value = int(env.get(name) or default)
    except ValueError:
        _log.warning("%s is not an integer, using %d", name, default)
        return default
    return value if value > 0 else default
