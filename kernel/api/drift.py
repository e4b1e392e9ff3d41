"""The drift watch: a pack's monitors run on what commits, beside the kernel.

Started only when a loaded pack declares a monitor (a kernel without one runs no task
and does no per-event work for drift). It follows the journal from its first event,
keeps the events its monitors count (kernel.state.drift.OBSERVED, and each flow's
opening) within the longest window and baseline, and after each committed batch that
holds one of them evaluates every monitor on the batch's recorded time, over the events
through the batch's last seq. What it finds it records: each ``DriftBreached`` with its
evidence window and ``as_of_seq``, then the ``AgentStatusChanged`` its action leads to,
by operator ``drift``. Because the window, the time and the seq horizon are recorded,
the evaluation is a pure function of the journal: ``kernel.state.drift.reevaluate``
finds the same breach again from it (replay's check, ``dirk verify --verdicts``).

History is read to fill the windows, never judged again: only batches committed after
the kernel started are evaluated, so a restart records no breach twice.

``Kernel.wait_quiet`` waits for the watch too (:meth:`DriftWatch.wait_judged`): once it
returns, every committed batch has been judged and what a breach led to (a demotion) is
on record, so a program that drives one flow at a time (the examples) records the same
journal on every run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import anyio

from kernel.core.errors import KernelShutdown
from kernel.core.events import Draft, DriftBreached, Event, FlowCreated
from kernel.journal.store import Journal, JournalClosed, JournalWriteFailed
from kernel.policy.monitors import Monitor
from kernel.state.drift import NS, OBSERVED, Drift, Subjects, watch
from kernel.state.projections import Projections


class DriftWatch:
    """Evaluates the monitors after each batch that changes what they count."""

    def __init__(
        self, journal: Journal, projections: Projections, monitors: Sequence[tuple[str, Monitor]]
    ) -> None:
        self._journal = journal
        self._projections = projections
        self._monitors = list(monitors)
        self._span_ns = max((m.window_s + (m.baseline_s or 0)) * NS for _, m in self._monitors)
        self._kept: deque[Event] = deque()
        self._subjects = Subjects()
        self._seen = 0
        """The last seq judged (or read, for history), with what it led to on record."""
        self._ended = False
        self._moved = anyio.Event()

    async def run(self, live_from: int) -> None:
        """Follow the journal; judge the batches from ``live_from`` on, until the kernel stops."""
        try:
            async with self._journal.subscribe(1) as batches:
                async for batch in batches:
                    if self._keep(batch) and batch[-1].seq >= live_from:
                        await self._judge(batch[-1])
                    self._seen = batch[-1].seq
                    self._wake()
        except (KernelShutdown, JournalClosed, JournalWriteFailed):
            return
        finally:
            self._ended = True
            self._wake()

    async def wait_judged(self, seq: int) -> None:
        """Wait until every batch through ``seq`` is judged and its breaches are on record."""
        while self._seen < seq and not self._ended:
            await self._moved.wait()

    def _wake(self) -> None:
        self._moved.set()
        self._moved = anyio.Event()

    def _keep(self, batch: Sequence[Event]) -> bool:
        """Keep what the monitors count; whether the batch held any of it."""
        counted = False
        for event in batch:
            if isinstance(event.payload, FlowCreated):
                self._subjects.see(event)
            elif isinstance(event.payload, OBSERVED):
                self._kept.append(event)
                counted = True
        horizon = batch[-1].ts - self._span_ns
        while self._kept and self._kept[0].ts <= horizon:
            self._kept.popleft()
        return counted

    async def _judge(self, last: Event) -> None:
        agents = self._projections.agents
        status = {name: view.status for name, view in agents.items()}
        drift = self._projections.domain(Drift)
        found = watch(
            self._monitors, list(self._kept), last.ts, drift, status, self._subjects, last.seq
        )
        drafts: list[Draft] = []
        agent: str | None = None
        for payload in found:
            if isinstance(payload, DriftBreached):
                # A breach by principal names no agent; its action, when any, follows it.
                agent = payload.subject if payload.by == "agent" else None
            drafts.append(Draft(payload=payload, agent_id=agent))
        if drafts:
            await self._journal.append(drafts)
