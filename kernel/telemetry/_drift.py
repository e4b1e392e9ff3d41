"""A drift breach as a span: a trace of its own, spanning the window that crossed the bound.

A breach (``DriftBreached``) belongs to no flow: a monitor judged many flows' verdicts
together. Its span is the root of a trace of its own, whose id is derived from what
names the breach (pack, monitor, subject and the window's end), so exporting the journal
again gives the same trace. It starts where the evidence window starts and ends when the
breach was recorded, so a trace viewer shows how long the drift took to catch; its
attributes say what was measured, the bound, what the pack did and whom it was about: the
agent (``gen_ai.agent.id``) or the principal (``user.id``, ``dirk.tenant``, pseudonymised
as every flow's are when a key is set).
"""

from __future__ import annotations

from typing import Any

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv._incubating.attributes.user_attributes import USER_ID

from kernel.core.events import DriftBreached, Event
from kernel.telemetry._spans import _ROOT, SpanRecord

TENANT = "dirk.tenant"
"""The span attribute naming the tenant a flow (or a breach about a principal) is in."""


def breach_trace(breach: DriftBreached) -> str:
    """The name of a breach's trace (what its trace id is derived from)."""
    return f"drift/{breach.pack}/{breach.monitor}/{breach.subject}/{breach.window_end_ns}"


def breach_span(event: Event) -> SpanRecord:
    """The span of the breach ``event`` records (its ``DriftBreached``)."""
    breach = event.payload
    assert isinstance(breach, DriftBreached)
    attrs: dict[str, Any] = {
        "dir.drift.pack": breach.pack,
        "dir.drift.monitor": breach.monitor,
        "dir.drift.metric": breach.metric,
        "dir.drift.value": breach.value,
        "dir.drift.bound": breach.bound,
        "dir.drift.samples": breach.samples,
        "dir.drift.action": breach.action,
        "dir.drift.first_seq": breach.first_seq,
        "dir.drift.last_seq": breach.last_seq,
        "dir.seq": event.seq,
    }
    if breach.baseline is not None:
        attrs["dir.drift.baseline"] = breach.baseline
    if breach.by == "agent":
        attrs[gen_ai.GEN_AI_AGENT_ID] = breach.subject
    else:
        tenant, _, user = breach.subject.partition("/")
        attrs[TENANT], attrs[USER_ID] = tenant, user
    return SpanRecord(
        breach_trace(breach),
        _ROOT,
        f"drift {breach.monitor}",
        min(breach.window_start_ns, event.ts),
        event.ts,
        attrs,
        parent=None,
        error=f"{breach.metric} {breach.value:g} crossed {breach.bound:g}",
        final=True,
    )
