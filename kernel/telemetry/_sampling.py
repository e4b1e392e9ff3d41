"""Ratio sampling that keeps the configured share of flows, though a DFID is a UUIDv4.

The SDK's ``TraceIdRatioBased`` keeps a trace when the low 64 bits of its id fall
below ``rate * 2**64``. A flow's trace id is its DFID, and a UUIDv4 puts its
variant bits ``10`` at the top of those 64 bits: every DFID compares as at least
``2**63``, so a ratio of 0.5 or less keeps no flow at all and 0.75 keeps them all.
:class:`DfidRatioBased` compares a hash of the trace id instead. A hash, not
fresh random bits, because the decision must be the same in every process and on
every replay: the live export, ``dirk traces export``, a restarted kernel and an
agent host deciding for the LLM spans inside ``decide()`` all keep the same flows,
and each flow is kept or dropped whole.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import (
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanKind, get_current_span
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

__all__ = ["DfidRatioBased", "flow_sampler", "sampling_hash"]


def sampling_hash(trace_id: int) -> int:
    """Return the 64 bits a flow's sampling decision compares: BLAKE2b of its trace id.

    Every bit of the DFID moves every bit of the hash, so the fixed version and
    variant bits of a UUIDv4 no longer matter.
    """
    digest = hashlib.blake2b(trace_id.to_bytes(16, "big"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class DfidRatioBased(TraceIdRatioBased):
    """Keep ``rate`` of flows, deciding on a hash of the trace id (the DFID).

    The drop-in for the SDK's ``TraceIdRatioBased`` (``OTEL_TRACES_SAMPLER=traceidratio``):
    same rate, same bound, same result shape; only the number compared differs.
    """

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        keep = sampling_hash(trace_id) < self.bound
        parent = get_current_span(parent_context).get_span_context()
        return SamplingResult(
            Decision.RECORD_AND_SAMPLE if keep else Decision.DROP,
            attributes if keep else None,
            parent.trace_state if parent.is_valid else None,
        )

    def get_description(self) -> str:
        return f"DfidRatioBased{{{self.rate}}}"


def _on_hash(sampler: Sampler) -> Sampler:
    # Exactly the SDK's class: a subclass of it may decide on purpose as it does.
    if type(sampler) is TraceIdRatioBased:
        return DfidRatioBased(sampler.rate)
    return sampler


def flow_sampler(sampler: Sampler) -> Sampler:
    """Return ``sampler`` with each of the SDK's ratio decisions taken on a hash of the DFID.

    ``TraceIdRatioBased`` becomes :class:`DfidRatioBased` at the same rate, also as the
    root (or any delegate) of a ``ParentBased``; every other sampler is returned as it is.
    """
    if isinstance(sampler, ParentBased):
        delegates = (
            sampler._root,
            sampler._remote_parent_sampled,
            sampler._remote_parent_not_sampled,
            sampler._local_parent_sampled,
            sampler._local_parent_not_sampled,
        )
        hashed = tuple(_on_hash(d) for d in delegates)
        if all(h is d for h, d in zip(hashed, delegates, strict=True)):
            return sampler
        return ParentBased(*hashed)
    return _on_hash(sampler)
