"""Governed beliefs through a real kernel: an agent that plays one governance tool call per flow."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agents_sdk import Agent, Manifest, Proposal, WorkingContext
from kernel import FlowState, Kernel, open_kernel
from kernel.audit import payloads
from kernel.beliefs import GOVERNANCE_PACK, KINDS, BeliefGraph
from kernel.config import KernelConfig, Ports
from kernel.core.events import Event, ProposalRejected
from kernel.testing import ManualClock, ScriptedTests, SeededIds
from tests.support.helpers import configured
from tests.support.principals import LOCAL

HOUR = 3600.0
TASK = "task-1"


class Believer(Agent):
    """Proposes the next queued tool call, once per flow (one attempt: a refusal ends it)."""

    def __init__(self, agent_id: str = "believer") -> None:
        self.manifest = Manifest(
            agent_id=agent_id,
            version="1.0.0",
            capabilities=list(KINDS),
            subscriptions=[f"desk.{agent_id}"],
            max_attempts=1,
        )
        self.calls: list[dict[str, Any]] = []
        self._flows: dict[str, int] = {}

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        index = self._flows.setdefault(ctx.dfid, len(self._flows))
        return ctx.propose(self.calls[index], explain=f"tool call {index}")


class Desk:
    """One kernel, one agent, a manual clock: ``call`` runs one tool call to its end."""

    def __init__(self, kernel: Kernel, agent: Believer, clock: ManualClock) -> None:
        self.kernel = kernel
        self.agent = agent
        self.clock = clock

    async def call(self, tool: str, task: str = TASK, **params: Any) -> FlowState:
        """Propose ``governance.<tool>`` with ``params`` in ``task``; return the ended flow."""
        self.agent.calls.append({"kind": f"governance.{tool}", "task": task, **params})
        topic = f"desk.{self.agent.manifest.agent_id}"
        [dfid] = await self.kernel.trigger(topic, {f"{topic}.n": len(self.agent.calls)})
        return await self.kernel.wait_flow(dfid)

    async def observe(self, observation: str, source: str, group: str = "", **kw: Any) -> None:
        flow = await self.call(
            "record_observation",
            observation=observation,
            source=source,
            independence_group=group or source,
            raw_payload=f"{source} says {observation}",
            **kw,
        )
        assert flow.status == "CLOSED", await self.why(flow)

    async def why(self, flow: FlowState) -> list[str]:
        """The refusal codes and details recorded in ``flow``."""
        events = await self.kernel.journal.flow_events(flow.dfid)
        return [
            f"{p.feedback.reason_code}: {p.feedback.detail}"
            for p in payloads(events, ProposalRejected)
        ]

    async def refusal(self, tool: str, **params: Any) -> str:
        """Run a call that must be refused; return its reason code."""
        flow = await self.call(tool, **params)
        [why] = await self.why(flow)
        return why.split(":")[0]

    def advance_hours(self, hours: float) -> None:
        self.clock.advance(hours * HOUR)

    @property
    def graph(self) -> BeliefGraph:
        return self.kernel.projections.beliefs

    def state(self, proposition: str) -> str:
        return str(self.graph.propositions[proposition].state)

    async def events(self) -> list[Event]:
        return list(await self.kernel.journal.read())


@asynccontextmanager
async def belief_desk(
    path: Path, tests: ScriptedTests | None = None, allow: tuple[str, ...] = (), **settings: Any
) -> AsyncIterator[Desk]:
    clock = ManualClock()
    agent = Believer()
    adapters: dict[str, Any] = {"belief_test": tests} if tests is not None else {}
    config = KernelConfig(principal=LOCAL, ports=Ports(clock=clock, ids=SeededIds(19)))
    async with open_kernel(
        path,
        packs=[GOVERNANCE_PACK],
        adapters=adapters,
        allow=[agent.manifest.agent_id, *allow],
        config=configured(config, **settings),
    ) as kernel:
        await kernel.register(agent)
        yield Desk(kernel, agent, clock)
