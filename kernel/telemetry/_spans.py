"""Spans as a projection of the journal: every DecisionFlow becomes part of a trace.

Spans are never recorded from live code paths. :class:`SpanProjector` folds
committed events into finished ``ReadableSpan`` objects whose trace id is the
root DFID and whose span ids are hashes of (DFID, stage, n), so re-exporting a
past flow yields the very same trace (DESIGN.md section 4). Export follows the
standard ``OTEL_*`` variables and is off unless an endpoint (or the console
exporter) is named.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import uuid
from collections.abc import AsyncIterable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import Event as SpanEvent
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, SynchronousMultiSpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.util.re import parse_env_headers

from kernel.core.events import (
    ApprovalExpired,
    CompensationFailed,
    CompensationStarted,
    CompensationSucceeded,
    ContextCompiled,
    DuplicateSuppressed,
    Event,
    ExecutionFailed,
    ExecutionIntent,
    ExecutionStarted,
    ExecutionSucceeded,
    Feedback,
    FlowAborted,
    FlowClosed,
    FlowCompensated,
    FlowCreated,
    FlowDirty,
    FlowEscalated,
    FlowFlagged,
    HumanDecided,
    ProposalAccepted,
    ProposalRejected,
    ProposalSubmitted,
)
from kernel.core.reasons import ReasonCode

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

_log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "dir-kernel"
"""The ``service.name`` of exported spans unless ``OTEL_SERVICE_NAME`` says otherwise."""

# The SDK's 10 s export timeout, spent on retries with backoff, stalls a flush
# for tens of seconds when the collector is down (DESIGN.md section 6).
_EXPORT_TIMEOUT_S = 2.0
# Flows end in bursts; the SDK's default queue of 2048 drops spans under load.
_MAX_QUEUE_SIZE = 8192

# Shared by every span, so built once (the Resource too, once per projector).
_SCOPE = InstrumentationScope("kernel.telemetry")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_OK = Status(StatusCode.OK)
_UNSET = Status(StatusCode.UNSET)
_NO_EVENTS: tuple[SpanEvent, ...] = ()
_TERMINAL = (FlowClosed, FlowAborted, FlowCompensated)


# --- identities ---------------------------------------------------------------


def trace_id_for(root_dfid: str) -> int:
    """Return the trace id of the flow tree rooted at ``root_dfid``: the DFID's 128 bits."""
    try:
        value = uuid.UUID(root_dfid).int
    except ValueError:
        value = 0
    # A DFID that is not a UUID (or is all zeros) still needs a stable, valid id.
    return value or int.from_bytes(hashlib.sha256(root_dfid.encode()).digest()[:16], "big")


def span_id_for(dfid: str, stage: str, n: int) -> int:
    """Return the id of the ``n``-th ``stage`` span of flow ``dfid``; the root is ("flow", 0)."""
    digest = hashlib.sha256(f"{dfid}/{stage}/{n}".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


def _context(trace_id: int, span_id: int) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=False, trace_flags=_SAMPLED)


def resource_from_env(env: Mapping[str, str] = os.environ) -> Resource:
    """Return the Resource spans carry: ``OTEL_SERVICE_NAME`` or "dir-kernel"."""
    return Resource.create({SERVICE_NAME: env.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME})


# --- projection -----------------------------------------------------------------


class _FlowSpans:
    """The spans of one flow while its buffered events are walked through."""

    __slots__ = ("counts", "dfid", "open", "resource", "root", "spans")

    def __init__(self, dfid: str, root: SpanContext, resource: Resource) -> None:
        self.dfid = dfid
        self.root = root
        self.resource = resource
        self.spans: list[ReadableSpan] = []
        self.counts: dict[str, int] = {}
        # key -> (span name, start ts, attributes); executions are keyed by idempotency key.
        self.open: dict[str, tuple[str, int, dict[str, Any]]] = {}

    def emit(
        self,
        name: str,
        start: int,
        end: int,
        attrs: dict[str, Any],
        status: Status = _UNSET,
        events: Sequence[SpanEvent] = _NO_EVENTS,
    ) -> None:
        n = self.counts.get(name, 0)
        self.counts[name] = n + 1
        context = _context(self.root.trace_id, span_id_for(self.dfid, name, n))
        self.spans.append(
            ReadableSpan(
                name,
                context,
                parent=self.root,
                resource=self.resource,
                attributes=attrs,
                events=events,
                status=status,
                start_time=start,
                end_time=end,
                instrumentation_scope=_SCOPE,
            )
        )

    def start(self, name: str, ts: int, attrs: dict[str, Any], key: str = "") -> None:
        key = key or name
        # A stage begun again (a recompiled context, an execution resumed after
        # a crash) ends the unfinished one rather than losing it.
        self.finish(key, ts)
        self.open[key] = (name, ts, attrs)

    def finish(
        self,
        key: str,
        end: int,
        extra: dict[str, Any] | None = None,
        status: Status = _UNSET,
        events: Sequence[SpanEvent] = _NO_EVENTS,
    ) -> None:
        stage = self.open.pop(key, None)
        if stage is None:  # e.g. a human acceptance after escalation: no validate is open
            return
        name, start, attrs = stage
        if extra:
            attrs.update(extra)
        if name == "escalation":
            attrs["dir.wait_ms"] = (end - start) // 1_000_000
        self.emit(name, start, end, attrs, status, events)

    def finish_all(self, end: int, still_open: bool) -> None:
        extra = {"dir.open": True} if still_open else None
        for key in list(self.open):
            self.finish(key, end, extra)


def _feedback_attrs(feedback: Feedback) -> dict[str, Any]:
    attrs: dict[str, Any] = {"dir.reason_code": str(feedback.reason_code)}
    for name in ("detail", "layer", "field"):
        if value := getattr(feedback, name):
            attrs[f"dir.{name}"] = value
    return attrs


def _intent_attrs(intent: ExecutionIntent) -> dict[str, Any]:
    return {
        "dir.idempotency_key": intent.key,
        "dir.adapter": intent.adapter,
        "dir.intent_kind": intent.kind,
        "dir.step": intent.step,
    }


def _project(
    dfid: str, events: list[Event], resource: Resource, still_open: bool
) -> list[ReadableSpan]:
    """Return the spans of one flow, given its events from FlowCreated on."""
    created = events[0]
    flow = cast(FlowCreated, created.payload)
    trace_id = trace_id_for(flow.root_dfid or dfid)
    b = _FlowSpans(dfid, _context(trace_id, span_id_for(dfid, "flow", 0)), resource)
    agent_id, kind, attempts = created.agent_id, "", 0
    status, outcome = _UNSET, "OPEN"
    root_attrs: dict[str, Any] = {"dir.dfid": dfid}
    root_events: list[SpanEvent] = []
    prev = created.ts
    for event in events[1:]:
        ts = event.ts
        agent_id = agent_id or event.agent_id
        match event.payload:
            case ContextCompiled(attempt=attempt, context_ref=ref):
                attempts = max(attempts, attempt)
                b.emit("context", prev, ts, {"dir.attempt": attempt, "dir.context_ref": ref})
                b.start("reason", ts, {"dir.attempt": attempt})
            case ProposalSubmitted(attempt=attempt, proposal=proposal, by_human=by_human):
                attempts, kind = max(attempts, attempt), proposal.kind
                b.finish("reason", ts, {"dir.policy_kind": kind})
                attrs: dict[str, Any] = {"dir.attempt": attempt, "dir.policy_kind": kind}
                if by_human:
                    attrs["dir.by_human"] = True
                b.start("validate", ts, attrs)
            case ProposalRejected(feedback=feedback):
                code = str(feedback.reason_code)
                rejected = {"dir.verdict": "REJECTED", "dir.reason_code": code}
                detail = (SpanEvent("feedback", _feedback_attrs(feedback), ts),)
                b.finish("validate", ts, rejected, Status(StatusCode.ERROR, code), detail)
            case ProposalAccepted():
                b.finish("validate", ts, {"dir.verdict": "ACCEPTED"})
            case FlowEscalated(reason_code=reason_code, impact=impact):
                code = str(reason_code)
                b.finish("validate", ts, {"dir.verdict": "ESCALATED", "dir.reason_code": code})
                b.start("escalation", ts, {"dir.reason_code": code, "dir.impact": impact})
            case ApprovalExpired():
                b.finish("escalation", ts, {"dir.decision": "expired"})
            case HumanDecided(decision=decision, operator=operator):
                b.finish("escalation", ts, {"dir.decision": decision, "dir.operator": operator})
            case ExecutionStarted(intent=intent):
                b.start("execute", ts, _intent_attrs(intent), key=f"execute/{intent.key}")
            case ExecutionSucceeded(key=key, external_id=external_id):
                done = {"dir.external_id": external_id} if external_id else None
                b.finish(f"execute/{key}", ts, done)
            case ExecutionFailed(key=key, error=error, transient=transient):
                code = ReasonCode.EXECUTION_FAILED.value
                failed = {"dir.reason_code": code, "dir.error": error, "dir.transient": transient}
                b.finish(f"execute/{key}", ts, failed, Status(StatusCode.ERROR, code))
            case DuplicateSuppressed(key=key, source=source):
                dup = {"dir.idempotency_key": key, "dir.source": source}
                root_events.append(SpanEvent("duplicate_suppressed", dup, ts))
            case FlowDirty(step=step, reason_code=reason_code, detail=detail):
                code = str(reason_code)
                dirty: dict[str, Any] = {
                    "dir.step": step,
                    "dir.reason_code": code,
                    "dir.detail": detail,
                }
                root_events.append(SpanEvent("dirty", dirty, ts))
            case CompensationStarted(intent=intent):
                b.start("compensate", ts, _intent_attrs(intent), key=f"compensate/{intent.key}")
            case CompensationSucceeded(key=key, external_id=external_id):
                done = {"dir.external_id": external_id} if external_id else None
                b.finish(f"compensate/{key}", ts, done)
            case CompensationFailed(key=key, error=error, transient=transient):
                failed = {"dir.error": error, "dir.transient": transient}
                status_failed = Status(StatusCode.ERROR, "COMPENSATION_FAILED")
                b.finish(f"compensate/{key}", ts, failed, status_failed)
            case FlowFlagged(guard=guard, reason=reason, confidence=confidence):
                root_attrs["dir.needs_review"] = True
                flag = {"dir.guard": guard, "dir.reason": reason, "dir.confidence": confidence}
                root_events.append(SpanEvent("needs_review", flag, ts))
            case FlowClosed():
                status, outcome = _OK, "CLOSED"
            case FlowCompensated(steps=steps):
                code = ReasonCode.COMPENSATED.value
                status, outcome = Status(StatusCode.ERROR, code), "COMPENSATED"
                root_attrs["dir.reason_code"] = code
                root_attrs["dir.compensated_steps"] = steps
            case FlowAborted(reason_code=reason_code, detail=detail):
                code = str(reason_code)
                status, outcome = Status(StatusCode.ERROR, code), "ABORTED"
                root_attrs["dir.reason_code"] = code
                if detail:
                    root_attrs["dir.detail"] = detail
        prev = ts
    # Stages the terminal event cut short (or, for an open flow, still running) end with it.
    b.finish_all(prev, still_open)

    if created.parent_dfid:
        root_attrs["dir.parent_dfid"] = created.parent_dfid
    root_attrs["gen_ai.operation.name"] = "invoke_agent"
    if agent_id:
        root_attrs["dir.agent_id"] = root_attrs["gen_ai.agent.id"] = agent_id
        root_attrs["gen_ai.agent.name"] = agent_id
    if flow.topic:
        root_attrs["dir.topic"] = flow.topic
    if kind:
        root_attrs["dir.policy_kind"] = kind
    root_attrs["dir.attempts"] = attempts
    root_attrs["dir.status"] = outcome
    if still_open:
        root_attrs["dir.open"] = True
    # A child flow hangs under its parent's root span, whose id needs no lookup.
    parent = None
    if created.parent_dfid:
        parent = _context(trace_id, span_id_for(created.parent_dfid, "flow", 0))
    b.spans.append(
        ReadableSpan(
            f"flow {kind or flow.topic}".rstrip(),
            b.root,
            parent=parent,
            resource=resource,
            attributes=root_attrs,
            events=root_events,
            status=status,
            start_time=created.ts,
            end_time=prev,
            instrumentation_scope=_SCOPE,
        )
    )
    return b.spans


class SpanProjector:
    """Fold committed events, in seq order, into the spans of DecisionFlows that ended.

    The only state is the buffered events of flows not yet terminal, dropped
    when their FlowClosed, FlowAborted or FlowCompensated arrives. A flow is projected only if
    its FlowCreated was seen; events for a flow already ended (a late
    DuplicateSuppressed, say) are ignored, since its spans are already out.
    """

    def __init__(self, resource: Resource | None = None) -> None:
        self._resource = resource if resource is not None else resource_from_env()
        self._open: dict[str, list[Event]] = {}

    @property
    def open_flows(self) -> int:
        """The number of flows begun and not yet ended."""
        return len(self._open)

    def feed(self, events: Iterable[Event]) -> list[ReadableSpan]:
        """Take events in seq order; return the spans of flows they ended."""
        spans: list[ReadableSpan] = []
        flows = self._open
        for event in events:
            dfid = event.dfid
            if dfid is None:
                continue
            buffered = flows.get(dfid)
            if buffered is None:
                if isinstance(event.payload, FlowCreated):
                    flows[dfid] = [event]
                continue
            buffered.append(event)
            if isinstance(event.payload, _TERMINAL):
                del flows[dfid]
                spans += _project(dfid, buffered, self._resource, still_open=False)
        return spans

    def flush_open(self) -> list[ReadableSpan]:
        """End every open flow at its last event, marked ``dir.open``, and forget it."""
        spans: list[ReadableSpan] = []
        for dfid, buffered in self._open.items():
            spans += _project(dfid, buffered, self._resource, still_open=True)
        self._open.clear()
        return spans


def spans_for_events(
    events: Iterable[Event], *, resource: Resource | None = None
) -> list[ReadableSpan]:
    """Return the spans of every flow in ``events``, open flows included."""
    projector = SpanProjector(resource)
    return projector.feed(events) + projector.flush_open()


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
) -> int:
    """Re-emit the spans of past flows (all, or ``dfid`` and its descendants); return how many.

    The caller owns ``processor`` and flushes or shuts it down afterwards.
    """
    selected = events if dfid is None else _flow_and_descendants(events, dfid)
    spans = spans_for_events(selected, resource=resource)
    for span in spans:
        processor.on_end(span)
    return len(spans)


# --- export -------------------------------------------------------------------


def _first(env: Mapping[str, str], *names: str) -> str:
    for name in names:
        if value := env.get(name, "").strip():
            return value
    return ""


def _otlp_exporter(env: Mapping[str, str]) -> SpanExporter:
    """Build the OTLP exporter ``env`` names.

    Endpoint, protocol, timeout, headers and compression come from ``env``;
    TLS files and credential providers the SDK reads from the process itself.
    """
    traces, generic = "OTEL_EXPORTER_OTLP_TRACES_", "OTEL_EXPORTER_OTLP_"
    protocol = _first(env, traces + "PROTOCOL", generic + "PROTOCOL").lower() or "http/protobuf"
    raw_timeout = _first(env, traces + "TIMEOUT", generic + "TIMEOUT")
    timeout = _EXPORT_TIMEOUT_S
    if raw_timeout:
        try:
            timeout = float(raw_timeout)  # seconds, as the Python SDK reads it
        except ValueError:
            _log.warning("ignoring invalid OTLP timeout %r", raw_timeout)
    headers = parse_env_headers(_first(env, traces + "HEADERS", generic + "HEADERS"), liberal=True)
    compression = _first(env, traces + "COMPRESSION", generic + "COMPRESSION").lower() or "none"
    endpoint = _first(env, traces + "ENDPOINT")

    if protocol == "grpc":
        import grpc  # type: ignore[import-untyped,unused-ignore]
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        insecure = _first(env, traces + "INSECURE", generic + "INSECURE").lower()
        return GrpcExporter(
            endpoint=endpoint or _first(env, generic + "ENDPOINT"),
            insecure=None if not insecure else insecure == "true",
            headers=dict(headers) or None,
            timeout=timeout,
            compression={"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate}.get(
                compression, grpc.Compression.NoCompression
            ),
        )

    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if protocol != "http/protobuf":
        _log.warning("unsupported OTLP protocol %r, using http/protobuf", protocol)
    if not endpoint:
        # The SDK's rule: the signal path is appended to the generic endpoint only.
        endpoint = _first(env, generic + "ENDPOINT").rstrip("/") + "/v1/traces"
    try:
        http_compression = Compression(compression)
    except ValueError:
        _log.warning("unsupported OTLP compression %r, sending uncompressed", compression)
        http_compression = Compression.NoCompression
    return OTLPSpanExporter(
        endpoint=endpoint, headers=headers, timeout=timeout, compression=http_compression
    )


def configure_exporter(env: Mapping[str, str] = os.environ) -> SpanProcessor | None:
    """Return a batching span processor as the ``OTEL_*`` variables in ``env`` ask, or None.

    Export is on only when an OTLP endpoint is set or ``OTEL_TRACES_EXPORTER``
    names "console"; ``OTEL_SDK_DISABLED=true``, ``OTEL_TRACES_EXPORTER=none``
    or no configuration at all turn it off quietly.
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
    endpoint = _first(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    if "otlp" in names and endpoint:
        exporters.append(_otlp_exporter(env))
    if unknown := names - {"otlp", "console", ""}:
        _log.warning("ignoring unsupported trace exporters %s", sorted(unknown))
    try:
        queue_size = int(env.get("OTEL_BSP_MAX_QUEUE_SIZE") or _MAX_QUEUE_SIZE)
    except ValueError:
        queue_size = _MAX_QUEUE_SIZE
    processors = [BatchSpanProcessor(exporter, max_queue_size=queue_size) for exporter in exporters]
    if len(processors) <= 1:
        return processors[0] if processors else None
    multi = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
    for processor in processors:
        multi.add_span_processor(processor)
    return multi


def shutdown_processor(processor: SpanProcessor, timeout_s: float = 3.0) -> bool:
    """Flush and shut ``processor`` down within about ``timeout_s``; return whether it finished.

    What is not exported by then is dropped. Blocks the calling thread.
    """

    def close() -> None:
        try:
            try:
                processor.force_flush(int(timeout_s * 1000))
            finally:
                processor.shutdown()
        except Exception:
            _log.exception("span export shutdown failed")

    # The SDK's flush exports in the calling thread and ignores its timeout, so
    # an unreachable collector would hold us through the retries of every
    # batch: waiting on a daemon thread instead bounds it.
    closer = threading.Thread(target=close, name="dir-telemetry-shutdown", daemon=True)
    closer.start()
    closer.join(timeout_s)
    return not closer.is_alive()


class Telemetry:
    """Project the journal into spans and hand them to a span processor.

    With no processor, telemetry is off and every method is a cheap no-op.
    """

    def __init__(
        self, processor: SpanProcessor | None, *, resource: Resource | None = None
    ) -> None:
        self._processor = processor
        self._projector = SpanProjector(resource) if processor is not None else None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Telemetry:
        """Return telemetry configured by the ``OTEL_*`` variables in ``env``."""
        processor = configure_exporter(env)
        return cls(processor, resource=resource_from_env(env) if processor is not None else None)

    @property
    def enabled(self) -> bool:
        """Whether spans are exported at all."""
        return self._processor is not None

    def emit(self, events: Iterable[Event]) -> None:
        """Project committed events and pass the spans of flows they ended on; never blocks."""
        if self._processor is None or self._projector is None:
            return
        on_end = self._processor.on_end
        for span in self._projector.feed(events):
            on_end(span)

    async def run(self, subscription: AsyncIterable[Sequence[Event]]) -> None:
        """Emit every batch of a journal subscription until it ends.

        Disabled telemetry still drains the subscription, so a bounded one
        never stalls the journal; better not to subscribe (see ``enabled``).
        """
        async for batch in subscription:
            self.emit(batch)

    def shutdown(self, timeout_s: float = 3.0) -> bool:
        """Flush and shut the processor down within about ``timeout_s``; return whether it finished.

        Blocks the calling thread; from async code run it in a worker thread.
        """
        processor, self._processor, self._projector = self._processor, None, None
        return True if processor is None else shutdown_processor(processor, timeout_s)
