"""The governed system: a real dirk kernel with the governance pack.

One kernel per seed, on an embedded SQLite journal in the run's work directory,
its clock a :class:`kernel.testing.ManualClock` set to each tool call's recorded
time (the scenario clock, each scenario on its own stretch), its ids seeded. The
agent is a hosted agent that proposes the scripted port's call it is handed by a
trigger, once (no retry): every call is a DecisionFlow judged by the DIM, a
refusal carries its reason code, an accepted call is executed by the kernel's
beliefs executor (a test by :class:`LookupTestAdapter`, the outside world). The
answers are read from the kernel's belief projection, ``kernel.projections.beliefs``,
with the same reader as the pure fold (:func:`examples.beliefs.systems.read_outcome`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from examples.beliefs.port import Resolution, ToolCall
from examples.beliefs.scenarios import Scenario
from examples.beliefs.systems import (
    PREFIX,
    LookupTests,
    Outcome,
    at_ns,
    consolidation_row,
    offset_s,
    read_outcome,
    transition_row,
)
from kernel import (
    FlowStatus,
    Kernel,
    KernelConfig,
    Manifest,
    Ports,
    Principal,
    Proposal,
    Storage,
    Supervision,
    WorkingContext,
    open_kernel,
)
from kernel.adapters import ExecutionIntent, Receipt
from kernel.audit import events as ev
from kernel.beliefs import GOVERNANCE_PACK, KINDS, TEST_ADAPTER
from kernel.testing import ManualClock, SeededIds

AGENT = "study-agent"
TOPIC = "study.call"


class LookupTestAdapter:
    """The ``belief_test`` adapter: a test's outcome is the scenario's lookup (the world)."""

    def __init__(self) -> None:
        self.tests = LookupTests([])

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        """Answer the test: passed when the lookup gives the proposition's value."""
        outcome = self.tests.outcome(dict(intent.params))
        return Receipt(
            external_id=f"test:{intent.params.get('test', '')}", detail={"outcome": outcome}
        )


class ToolAgent:
    """Proposes the tool call a trigger hands it, as the scripted port made it, once."""

    def __init__(self) -> None:
        self.manifest = Manifest(
            agent_id=AGENT,
            version="1.0.0",
            capabilities=list(KINDS),
            subscriptions=[TOPIC],
            max_attempts=1,
        )

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        call = ctx.state.get(TOPIC)
        if not isinstance(call, dict):
            return None
        policy = {"kind": PREFIX + str(call["kind"]), **call["params"]}
        return ctx.propose(policy, explain="scripted governance port", valid_for_s=3_600)


class GovernedKernel:
    """The governed system: every tool call through a real kernel's gate."""

    name = "governed"

    def __init__(self, seed: int, workdir: Path) -> None:
        self.seed = seed
        self.db = workdir / "governed.db"
        self.clock = ManualClock(start_ns=at_ns(0))
        self.tests = LookupTestAdapter()
        self._cm: Any = None
        self.kernel: Kernel | None = None
        self._index = 0
        self._read_from = 1
        self._transitions: list[dict[str, Any]] = []
        self._consolidations: list[dict[str, Any]] = []

    async def _open(self) -> Kernel:
        if self.kernel is None:
            self._cm = open_kernel(
                self.db,
                packs=[GOVERNANCE_PACK],
                adapters={TEST_ADAPTER: self.tests},
                allow=[AGENT],
                config=KernelConfig(
                    # This host vouches for one local user: every flow acts on its behalf
                    # (KernelConfig.principal; docs/identity.md).
                    principal=Principal(tenant="local", user="local"),
                    ports=Ports(clock=self.clock, ids=SeededIds(self.seed), jitter_seed=self.seed),
                    supervision=Supervision(inbox_poll_s=None),
                    # A study's journal survives the process, not a power cut: no fsync wait.
                    storage=Storage(synchronous="NORMAL"),
                ),
            )
            self.kernel = await self._cm.__aenter__()
            await self.kernel.register(ToolAgent())
        return self.kernel

    async def run_scenario(self, sc: Scenario, calls: list[ToolCall], res: Resolution) -> Outcome:
        kernel = await self._open()
        offset = offset_s(self._index)
        self._index += 1
        self.tests.tests = LookupTests(calls)
        refused: Counter[str] = Counter()
        for c in calls:
            now = at_ns(c.at_s, offset)
            if now > self.clock.now_ns():
                self.clock.advance((now - self.clock.now_ns()) / 1e9)
            call = {"kind": c.kind, "params": c.params}
            [dfid] = await kernel.trigger(TOPIC, {TOPIC: call}, source="study")
            await kernel.wait_quiet()
            flow = kernel.flow(dfid)
            if flow is not None and flow.status is not FlowStatus.CLOSED:
                refused[await self._code(kernel, dfid)] += 1
        graph = kernel.projections.beliefs
        for e in await self._belief_events(kernel, sc.id):
            if isinstance(e, ev.PropositionTransitioned):
                self._transitions.append(transition_row(sc.id, e, offset))
            elif isinstance(e, ev.ConsolidationRecorded):
                self._consolidations.append(consolidation_row(sc.id, e, offset))
        end = at_ns(sc.end_s, offset)
        return read_outcome(sc, res, graph, end, {}, dict(sorted(refused.items())))

    @staticmethod
    async def _code(kernel: Kernel, dfid: str) -> str:
        """The reason code the gate refused the call with (else the flow's ending code)."""
        events = await kernel.journal.read(dfid=dfid)
        for e in events:
            if isinstance(e.payload, ev.ProposalRejected):
                return str(e.payload.feedback.reason_code)
        for e in reversed(events):
            code = getattr(e.payload, "reason_code", None)
            if code:
                return str(code)
        return "UNKNOWN"

    async def _belief_events(self, kernel: Kernel, task: str) -> list[Any]:
        """The scenario's transitions and consolidations, read from the journal."""
        found = await kernel.journal.read(
            self._read_from, types=["PropositionTransitioned", "ConsolidationRecorded"]
        )
        if found:
            self._read_from = found[-1].seq + 1
        return [e.payload for e in found if getattr(e.payload, "task", "") == task]

    def transitions(self) -> list[dict[str, Any]]:
        return list(self._transitions)

    def consolidations(self) -> list[dict[str, Any]]:
        return list(self._consolidations)

    async def aclose(self) -> None:
        if self._cm is not None:
            cm, self._cm, self.kernel = self._cm, None, None
            await cm.__aexit__(None, None, None)
