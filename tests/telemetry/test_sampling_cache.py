"""A sink remembers a flow's sampling decision only when the sampler decides by trace id
alone (the SDK's own samplers, ratios taken on a hash of the DFID); any other sampler is
asked every time, as before."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)

from kernel.telemetry._ids import trace_id_for
from kernel.telemetry._sampling import flow_sampler
from kernel.telemetry._sink import SpanSink


class Alternating(Sampler):
    """Keeps every other flow it is asked about, whatever its trace id: not a pure sampler."""

    def __init__(self) -> None:
        self.asked = 0

    def should_sample(self, *args: object, **kwargs: object) -> SamplingResult:
        self.asked += 1
        return SamplingResult(Decision.RECORD_AND_SAMPLE if self.asked % 2 else Decision.DROP)

    def get_description(self) -> str:
        return "alternating"


dfids = st.lists(st.integers(min_value=0, max_value=(1 << 128) - 1), min_size=1, max_size=20)


@settings(max_examples=50, derandomize=True, deadline=None)
@given(dfids, st.sampled_from([0.0, 0.25, 0.5, 1.0]), st.booleans())
def test_a_pure_sampler_decides_as_if_asked_each_time(
    ints: list[int], rate: float, parent_based: bool
) -> None:
    sampler: Sampler = TraceIdRatioBased(rate)
    if parent_based:
        sampler = ParentBased(sampler)
    sink = SpanSink(TracerProvider(sampler=sampler))
    on_hash = flow_sampler(sampler)
    for dfid in [str(uuid.UUID(int=i)) for i in ints] * 2:
        asked = on_hash.should_sample(Context(), trace_id_for(dfid), "flow").decision
        assert sink.sampled(dfid) is (asked is Decision.RECORD_AND_SAMPLE)


def test_the_sdks_samplers_are_remembered_others_asked_again() -> None:
    for sampler in (ALWAYS_ON, ALWAYS_OFF, ParentBased(TraceIdRatioBased(0.5))):
        assert SpanSink(TracerProvider(sampler=sampler))._decided == {}
    other = Alternating()
    sink = SpanSink(TracerProvider(sampler=other))
    assert [sink.sampled("flow-a") for _ in range(4)] == [True, False, True, False]
    assert other.asked == 4
