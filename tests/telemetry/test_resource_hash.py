"""The sink's Resource is the provider's, hashed once (the OTLP encoder hashes it per span)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kernel.core.events import Event, FlowAborted, FlowCreated
from kernel.core.reasons import ReasonCode
from kernel.telemetry._sink import DirectSink
from kernel.telemetry._telemetry import Telemetry


@settings(max_examples=30, derandomize=True, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8), st.one_of(st.text(max_size=8), st.integers()), max_size=4
    )
)
def test_the_sinks_resource_equals_the_providers_and_hashes_alike(
    attrs: dict[str, str | int],
) -> None:
    provider = TracerProvider(resource=Resource(attrs, "https://example.test/schema"))
    exporter = InMemorySpanExporter()
    sink = DirectSink(provider, SimpleSpanProcessor(exporter))
    resource = sink._resource
    assert resource == provider.resource
    assert hash(resource) == hash(provider.resource)
    assert resource.attributes == provider.resource.attributes
    assert resource.schema_url == provider.resource.schema_url


def test_exported_spans_carry_the_same_resource_and_encode_alike() -> None:
    exporter = InMemorySpanExporter()
    resource = Resource({"service.name": "resource-test", "deployment": "x"})
    telemetry = Telemetry(SimpleSpanProcessor(exporter), resource=resource)
    dfid = "00000000-0000-4000-8000-000000000001"
    created = FlowCreated(root_dfid=dfid, topic="t")
    aborted = FlowAborted(reason_code=ReasonCode.AGENT_DECLINED, detail="no action")
    telemetry.emit(
        [
            Event(seq=1, ts=1, payload=created, dfid=dfid, agent_id="a"),
            Event(seq=2, ts=2, payload=aborted, dfid=dfid, agent_id="a"),
        ]
    )
    spans = exporter.get_finished_spans()
    assert spans
    assert all(span.resource == resource for span in spans)
    request = encode_spans(spans)
    assert len(request.resource_spans) == 1  # one group: every span has the one resource
    attributes = request.resource_spans[0].resource.attributes
    encoded = {kv.key: kv.value.string_value for kv in attributes}
    assert encoded == {"service.name": "resource-test", "deployment": "x"}
