"""The trading desk's agents in their own host processes (``python -m examples.trading --bus``).

The example starts one host per agent::

    TRADING_SEED=7 TRADING_MINUTES=60 TRADING_RUN=<run> DIRK_CREDENTIAL_PM_1=dirk_... \\
        python -m agents_sdk.serve --bus nats://127.0.0.1:4222 examples.desk_hosts:Pm1

Each class builds the same agent and the same seeded model as the single-process run
(:mod:`examples.trading`). One simulation cue reaches into an agent, on a plain NATS
subject of the run outside the kernel's streams: on the plan's ``stall`` minute the
position agent's model asks the driver (``trading.<run>.stall.<agent_id>``) and answers
only once the driver replies, after it moved the market (what ``Stall`` does in one
process). The resend beat is a re-publish of the recorded proposal message by the driver
(:mod:`examples.desk_mesh`), which JetStream's duplicate window absorbs.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from agents_sdk import Agent, Proposal, WorkingContext
from examples.desk import DeskAgent, PositionAgent, RiskAgent, Stall, Strategist
from examples.desk_model import playbooks
from examples.llm import open_model
from examples.market import plan_day

STALL_WAIT_S = 600.0
"""The longest a stalled model waits for the driver (the driver answers within a step)."""


def stall_subject(run: str, agent_id: str) -> str:
    """Where a hosted agent's model says it stalled; the reply resumes it."""
    return f"trading.{run}.stall.{agent_id}"


class _BusStall(Stall):
    """The stall of a hosted agent: it waits for the driver over NATS, not on an Event."""

    def __init__(self, url: str, subject: str) -> None:
        super().__init__()
        self.url, self.subject = url, subject
        self._nc: Any = None

    async def wait_if_armed(self) -> None:
        if not self.armed:
            return
        self.armed = False
        import nats

        if self._nc is None:
            self._nc = await nats.connect(self.url, name="trading-stall")
        await self._nc.request(self.subject, b"", timeout=STALL_WAIT_S)


class _DeskHost(Agent):
    """One desk agent built from the run's environment (seed, minutes, model, run id)."""

    agent_id: ClassVar[str] = ""

    def __init__(self) -> None:
        seed = int(os.environ["TRADING_SEED"])
        plan = plan_day(seed, int(os.environ["TRADING_MINUTES"]))
        model = open_model(os.environ.get("TRADING_LLM", "scripted"), seed, playbooks(plan))
        self.inner: DeskAgent = build(self.agent_id, model)
        self.manifest = self.inner.manifest
        url = os.environ["DIRK_BUS"]
        self.inner.stall = _BusStall(url, stall_subject(os.environ["TRADING_RUN"], self.agent_id))
        self._stall_minute = next((m for m, b in plan.beats.items() if b == "stall"), None)

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        # In one process the driver arms the owner's stall just before the stall minute's
        # signal; here the host knows the plan and arms it for that same reasoning step.
        symbol = ctx.topic.rsplit(".", 1)[-1]
        if (
            ctx.topic.startswith("signal.")
            and ctx.attempt == 1
            and ctx.state.get(f"signal.{symbol}.minute") == self._stall_minute
        ):
            self.inner.stall.armed = True
        return await self.inner.decide(ctx)


def build(agent_id: str, model: Any) -> DeskAgent:
    """The desk agent named ``agent_id`` on ``model`` (as :mod:`examples.trading` builds it)."""
    from examples.trading import OWNERS

    if agent_id == "strategist":
        return Strategist(model)
    if agent_id == "risk":
        return RiskAgent(model)
    return PositionAgent(agent_id, OWNERS[agent_id], model)


class StrategistHost(_DeskHost):
    agent_id = "strategist"


class Pm1Host(_DeskHost):
    agent_id = "pm-1"


class Pm2Host(_DeskHost):
    agent_id = "pm-2"


class RiskHost(_DeskHost):
    agent_id = "risk"


HOSTS = {
    "strategist": "StrategistHost",
    "pm-1": "Pm1Host",
    "pm-2": "Pm2Host",
    "risk": "RiskHost",
}
"""The host class of each agent, by agent id."""
