"""The span projector: committed events in, the records of the spans they ended out.

Each open flow's state is a ``_Flow`` (kernel.telemetry._project); the projector keeps
the flows begun and not yet ended. A drift breach, no flow's, is a span of its own
(kernel.telemetry._drift).
"""

from __future__ import annotations

from collections.abc import Iterable

from kernel.core.events import DriftBreached, Event, FlowCreated
from kernel.telemetry._drift import breach_span
from kernel.telemetry._project import SpanRecord, _Flow

__all__ = ["SpanProjector"]


class SpanProjector:
    """Fold committed events, in seq order, into the records of spans that ended.

    The only state is that of flows not yet terminal. A flow is projected only if
    its FlowCreated was seen; events for a flow already ended (a late
    DuplicateSuppressed, say) are ignored, since its spans are out.
    """

    def __init__(self) -> None:
        self._open: dict[str, _Flow] = {}

    @property
    def open_flows(self) -> int:
        """The number of flows begun and not yet ended."""
        return len(self._open)

    def is_open(self, dfid: str) -> bool:
        """Whether flow ``dfid`` has begun and not yet ended."""
        return dfid in self._open

    def feed(self, events: Iterable[Event]) -> list[SpanRecord]:
        """Take events in seq order; return the records of the spans they ended."""
        out: list[SpanRecord] = []
        flows = self._open
        for event in events:
            dfid = event.dfid
            if dfid is None:
                if isinstance(event.payload, DriftBreached):
                    out.append(breach_span(event))  # a trace of its own: no flow's
                continue
            flow = flows.get(dfid)
            if flow is None:
                if isinstance(event.payload, FlowCreated):
                    flows[dfid] = _Flow(event, out)
                continue
            flow.out = out
            if flow.feed(event):
                del flows[dfid]
        return out
