"""The trading desk's agents in their own host processes (``python -m examples.trading --bus``).

The example starts one host per agent::

    TRADING_SEED=7 TRADING_MINUTES=60 TRADING_RUN=<run> DIRK_CREDENTIAL_PM_1=dirk_... \\
        TRADING_HOST_KEY=<bus dir>/host-pm-1.pem \\
        python -m agents_sdk.serve --bus nats://127.0.0.1:4222 examples.desk_hosts:Pm1Host

Each class builds the same agent and the same seeded model as the single-process run
(:mod:`examples.trading`). The agent reaches the kernel as the kernel's own hosts do
(its credential seeds its nkey). The simulation's cues travel on subjects of the
example's own, ``trading.<run>.*``, over a second connection with a principal of its
own (``trading-host-<agent_id>``, its key in the run's bus directory): the server's
configuration lets it publish ``trading.*.stall.<agent_id>`` and read
``trading.*.resend.<agent_id>``, nothing of the kernel's (:mod:`examples.desk_mesh`).

- The stall: on the plan's ``stall`` minute the position agent's model asks the driver
  (``trading.<run>.stall.<agent_id>``) and answers only once the driver replies, after
  it moved the market (what ``Stall`` does in one process).
- The resend: at the resend beat the driver asks (``trading.<run>.resend.<agent_id>``)
  and the host's client publishes its last proposal for the flow again, the same
  message, id and signature, as the agent's own principal; JetStream's duplicate window
  absorbs it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, ClassVar

import anyio
import msgspec

from agents_sdk import Agent, Proposal, WorkingContext
from examples.desk import DeskAgent, Hedger, PositionAgent, RiskAgent, Stall, Strategist
from examples.desk_model import playbooks
from examples.llm import open_model
from examples.market import plan_day

log = logging.getLogger("examples.desk_hosts")

STALL_WAIT_S = 600.0
"""The longest a stalled model waits for the driver (the driver answers within a step)."""
HOST_KEY_ENV = "TRADING_HOST_KEY"
"""The environment variable naming the key file of a host's own principal."""
SENT, DUPLICATE, NOTHING = b"stored", b"duplicate", b"nothing"
"""A host's answers to a resend: JetStream stored it, absorbed it, or there was none."""


def stall_subject(run: str, agent_id: str) -> str:
    """Where a hosted agent's model says it stalled; the reply resumes it."""
    return f"trading.{run}.stall.{agent_id}"


def resend_subject(run: str, agent_id: str) -> str:
    """Where the driver asks the host of ``agent_id`` to send a flow's last proposal again."""
    return f"trading.{run}.resend.{agent_id}"


def host_principal(agent_id: str) -> str:
    """The name of the bus principal of ``agent_id``'s host cues (its stall and resends)."""
    return f"trading-host-{agent_id}"


class Resend(msgspec.Struct, frozen=True, kw_only=True, tag="resend"):
    """The driver's ask: send the last proposal for ``dfid`` in ``journal`` again."""

    journal: str
    dfid: str


_RESEND = msgspec.json.Decoder(Resend)


class _Cues:
    """A host's connection as its own principal: the model's stall, the driver's resends.

    Opened at the first reasoning step (an Agent has no async start); a resend is only
    ever asked for a flow this host decided, so it is listening by then.
    """

    def __init__(self, url: str, agent_id: str, run: str) -> None:
        self.url, self.agent_id, self.run = url, agent_id, run
        self.nc: Any = None
        self.agent_nc: Any = None
        self._lock = anyio.Lock()

    async def open(self, host: _DeskHost) -> None:
        async with self._lock:
            if self.nc is not None:
                return
            from kernel.mesh import BusAuth, app_inbox, connect, load_private_key, tls_from_env

            key = load_private_key(Path(os.environ[HOST_KEY_ENV]))
            name = host_principal(self.agent_id)
            auth = BusAuth(key=key, inbox=app_inbox(name), tls=tls_from_env())
            self.nc = await connect(self.url, name=name, auth=auth)

            async def on_resend(msg: Any) -> None:
                await msg.respond(await host.resend(msg.data))

            await self.nc.subscribe(resend_subject(self.run, self.agent_id), cb=on_resend)
            await self.nc.flush()

    async def stalled(self) -> None:
        await self.nc.request(stall_subject(self.run, self.agent_id), b"", timeout=STALL_WAIT_S)

    async def as_agent(self) -> Any:
        """A connection as the agent's own principal: only it may publish its proposals."""
        if self.agent_nc is None:
            from agents_sdk.serve import credential_for
            from kernel.mesh import BusAuth, agent_inbox, agent_key, connect, tls_from_env

            credential = credential_for(self.agent_id)
            if credential is None:
                raise LookupError(f"no credential for {self.agent_id} in the environment")
            auth = BusAuth(
                key=agent_key(credential), inbox=agent_inbox(self.agent_id), tls=tls_from_env()
            )
            self.agent_nc = await connect(self.url, name=f"trading-{self.agent_id}", auth=auth)
        return self.agent_nc


class _BusStall(Stall):
    """The stall of a hosted agent: it waits for the driver over NATS, not on an Event."""

    def __init__(self, cues: _Cues) -> None:
        super().__init__()
        self.cues = cues

    async def wait_if_armed(self) -> None:
        if not self.armed:
            return
        self.armed = False
        await self.cues.stalled()


class _DeskHost(Agent):
    """One desk agent built from the run's environment (seed, minutes, model, run id)."""

    agent_id: ClassVar[str] = ""

    def __init__(self) -> None:
        seed = int(os.environ["TRADING_SEED"])
        plan = plan_day(seed, int(os.environ["TRADING_MINUTES"]))
        model = open_model(os.environ.get("TRADING_LLM", "scripted"), seed, playbooks(plan))
        self.inner: DeskAgent = build(self.agent_id, model)
        self.manifest = self.inner.manifest
        self.cues = _Cues(os.environ["DIRK_BUS"], self.agent_id, os.environ["TRADING_RUN"])
        self.inner.stall = _BusStall(self.cues)
        self._stall_minute = next((m for m, b in plan.beats.items() if b == "stall"), None)
        self.last: dict[str, tuple[int, Proposal | None]] = {}
        """What this host last answered for each flow: the attempt, and its proposal (None:
        it withdrew, or the agent failed)."""

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        await self.cues.open(self)
        # In one process the driver arms the owner's stall just before the stall minute's
        # signal; here the host knows the plan and arms it for that same reasoning step.
        symbol = ctx.topic.rsplit(".", 1)[-1]
        if (
            ctx.topic.startswith("signal.")
            and ctx.attempt == 1
            and ctx.state.get(f"signal.{symbol}.minute") == self._stall_minute
        ):
            self.inner.stall.armed = True
        self.last[ctx.dfid] = (ctx.attempt, None)
        proposal = await self.inner.decide(ctx)
        self.last[ctx.dfid] = (ctx.attempt, proposal)
        return proposal

    async def resend(self, data: bytes) -> bytes:
        """Publish the last proposal for the flow ``data`` names again; say what JetStream did.

        The message is the one ``agents_sdk.serve`` published: the same body, the same
        signature (Ed25519 signs deterministically) and so the same ``Nats-Msg-Id``
        (kernel.mesh.proposal_id: the work id and a digest of the signature), on the
        agent's own subject.
        """
        import nats.errors

        from agents_sdk.serve import credential_for
        from kernel.mesh import (
            PROPOSAL_STREAM,
            SIGNATURE_HEADER,
            agent_key,
            proposal_body,
            proposal_id,
            proposal_signature,
            work_id,
        )

        try:
            ask = _RESEND.decode(data)
        except msgspec.DecodeError as exc:
            return f"error: not a resend: {exc}".encode()
        attempt, proposal = self.last.get(ask.dfid, (0, None))
        if proposal is None:
            return NOTHING  # it withdrew (or never decided the flow): nothing to send again
        try:
            nc = await self.cues.as_agent()
            body = proposal_body(proposal)
            work = work_id(ask.journal, ask.dfid, attempt)
            key = agent_key(credential_for(self.agent_id) or "")
            signature = proposal_signature(key, work, body)
            headers = {"Nats-Msg-Id": proposal_id(work, signature), SIGNATURE_HEADER: signature}
            ack = await nc.jetstream().publish(
                f"dirk.proposals.{self.agent_id}", body, stream=PROPOSAL_STREAM, headers=headers
            )
        except (nats.errors.Error, TimeoutError, LookupError, OSError) as exc:
            log.warning("resending %s failed: %r", ask.dfid, exc)
            return f"error: {type(exc).__name__}: {exc}".encode()
        return DUPLICATE if ack.duplicate else SENT


def build(agent_id: str, model: Any) -> DeskAgent:
    """The desk agent named ``agent_id`` on ``model`` (as :mod:`examples.trading` builds it)."""
    from examples.trading import OWNERS

    if agent_id == "strategist":
        return Strategist(model)
    if agent_id == "risk":
        return RiskAgent(model)
    if agent_id == "hedger":
        return Hedger(model)
    return PositionAgent(agent_id, OWNERS[agent_id], model)


class StrategistHost(_DeskHost):
    agent_id = "strategist"


class Pm1Host(_DeskHost):
    agent_id = "pm-1"


class Pm2Host(_DeskHost):
    agent_id = "pm-2"


class RiskHost(_DeskHost):
    agent_id = "risk"


class HedgerHost(_DeskHost):
    agent_id = "hedger"


HOSTS = {
    "strategist": "StrategistHost",
    "pm-1": "Pm1Host",
    "pm-2": "Pm2Host",
    "risk": "RiskHost",
    "hedger": "HedgerHost",
}
"""The host class of each agent, by agent id."""
