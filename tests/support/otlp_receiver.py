"""A minimal OTLP/HTTP receiver for tests: prints every span and metric point as a JSON line.

Run ``python tests/support/otlp_receiver.py [PORT]``: it binds 127.0.0.1 on PORT (a
free one if none is given: a test restarting a killed receiver gives the old one's),
prints ``PORT <n>``, then one JSON object per received span, each line
flushed. It exits on SIGTERM, SIGINT or end of its standard input, so a test
that dies cannot leave it behind.
"""

from __future__ import annotations

import gzip
import io
import json
import signal
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

_print_lock = threading.Lock()


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _span_lines(request: ExportTraceServiceRequest) -> list[str]:
    lines = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                record = {
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "name": span.name,
                    "attributes": _attributes(span.attributes),
                    "status_code": span.status.code,
                    "status_message": span.status.message,
                    "service_name": resource.get("service.name"),
                    "resource": resource,
                    "start": span.start_time_unix_nano,
                    "end": span.end_time_unix_nano,
                    "links": [[link.trace_id.hex(), link.span_id.hex()] for link in span.links],
                    "events": [
                        [event.name, _attributes(event.attributes)] for event in span.events
                    ],
                }
                lines.append(json.dumps(record, sort_keys=True))
    return lines


def _metric_lines(request: ExportMetricsServiceRequest) -> list[str]:
    """One line per data point: its metric's name, its attributes, and its value (a sum's
    value; a histogram's count, sum, bucket bounds and counts per bucket)."""
    lines = []
    for resource_metrics in request.resource_metrics:
        resource = _attributes(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                if kind is None:
                    continue  # a metric with no data points of any kind
                for point in getattr(metric, kind).data_points:
                    record: dict[str, Any] = {
                        "metric": metric.name,
                        "kind": kind,
                        "attributes": _attributes(point.attributes),
                        "service_name": resource.get("service.name"),
                    }
                    if kind == "histogram":
                        record["count"], record["sum"] = point.count, point.sum
                        record["bounds"] = list(point.explicit_bounds)
                        record["buckets"] = list(point.bucket_counts)
                    else:
                        record["value"] = (
                            point.as_int if point.HasField("as_int") else point.as_double
                        )
                    lines.append(json.dumps(record, sort_keys=True))
    return lines


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        if self.path not in ("/v1/traces", "/v1/metrics"):
            self.send_error(404)
            return
        metrics = self.path == "/v1/metrics"
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        encoding = self.headers.get("Content-Encoding", "").lower()
        try:
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            if metrics:
                lines = _metric_lines(ExportMetricsServiceRequest.FromString(body))
            else:
                lines = _span_lines(ExportTraceServiceRequest.FromString(body))
        except Exception:  # a garbled request is the exporter's bug: say so, stay up
            self.send_error(400)
            return
        with _print_lock:
            for line in lines:
                print(line, flush=True)
        answer = ExportMetricsServiceResponse() if metrics else ExportTraceServiceResponse()
        reply = answer.SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # stdout carries spans only; per-request logs would be noise on stderr


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main() -> None:
    """Serve until SIGTERM, SIGINT or end of standard input."""
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, _stop)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    print(f"PORT {server.server_address[1]}", flush=True)
    try:
        # Reading stdin until EOF ties our life to the parent's pipe.
        # Typed BinaryIO, a BufferedReader in fact: read1 returns what has arrived.
        while cast(io.BufferedReader, sys.stdin.buffer).read1(65536):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()
