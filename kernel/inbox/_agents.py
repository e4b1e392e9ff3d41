"""Agents in another process whose proposals reach the kernel through the inbox.

``dirk mcp`` following a journal writes a ``propose`` request per agent write, signed
with the agent's own key (kernel.inbox.keyring, role ``agent``). The kernel hosts an
:class:`InboxAgent` for that agent, opens one flow per row on the topic
``inbox.<agent>.<row id>``, and the agent proposes the row's policy in it, so the DIM
judges it like any other. The flow's events are the answer the other process reads
back. A row whose flow an earlier run already opened is not proposed again.

What a row may never do (trust-and-edges D5):

- take over an agent that is hosted in the kernel, or that holds a session of its own
  (a handshake in process or over the bus): refused with AGENT_IN_SESSION;
- widen what an agent may propose: the first time, its manifest names every kind the
  packs define; afterwards, never more than the manifest it had (a pack loaded since
  adds nothing to it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from kernel.core.events import Manifest
from kernel.core.reasons import ReasonCode
from kernel.inbox.proof import Proof, ProofRefused
from kernel.inbox.requests import PROPOSE_TOPIC, ProposeRequest
from kernel.policy.contracts import Proposal, WorkingContext
from kernel.registry import CONTRACT_VERSION
from kernel.state.projections import Projections

INBOX_BUILD = "inbox"
"""The build label (SemVer ``+inbox``) of the manifests the inbox registers."""


def inbox_manifest(manifest: Manifest) -> bool:
    """Tell whether ``manifest`` is one the inbox registered (not the agent's own handshake)."""
    return manifest.version.endswith(f"+{INBOX_BUILD}") and manifest.subscriptions == [
        f"{PROPOSE_TOPIC}.{manifest.agent_id}"
    ]


class InboxAgent:
    """A hosted agent whose proposals arrive as inbox rows: it proposes what its row brings."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.calls: dict[str, tuple[dict[str, Any], str, float]] = {}

    async def decide(self, ctx: WorkingContext) -> Proposal | None:
        call = self.calls.pop(ctx.topic, None)
        if call is None:
            return None  # its row was applied by an earlier run: declined, on record
        policy, explain, confidence = call
        return ctx.propose(policy, explain=explain, confidence=confidence, valid_for_s=600)


class InboxAgents:
    """The agents the inbox hosts, one per agent id.

    Args:
        register: hosts an agent (``Kernel.register``).
        trigger: opens the flows of a topic (``Kernel.trigger``).
        kinds: the kinds the packs define.
        projections: the kernel's projections (flows opened, agents registered).
        hosts: the agents hosted in the kernel or routed to the bus, by id.
    """

    def __init__(
        self,
        register: Callable[[InboxAgent], Awaitable[object]],
        trigger: Callable[[str], Awaitable[list[str]]],
        kinds: Callable[[], Iterable[str]],
        projections: Projections,
        hosts: Mapping[str, object],
    ) -> None:
        self._register = register
        self._trigger = trigger
        self._kinds = kinds
        self._projections = projections
        self._hosts = hosts
        self._agents: dict[str, InboxAgent] = {}

    async def propose(self, request: ProposeRequest, proof: Proof) -> None:
        """Open the flow of a ``propose`` request, in which its agent proposes its policy.

        Raises:
            ProofRefused: AGENT_IN_SESSION, for an agent hosted here or holding a session.
            InputInvalid: an agent that is not active (no flow opened).
            HandshakeRefused: the kernel does not allow the agent.
        """
        agent_id = request.agent_id
        topic = f"{PROPOSE_TOPIC}.{agent_id}.{proof.inbox_id}"
        if any(flow.topic == topic for flow in self._projections.flows.values()):
            return
        agent = self._agents.get(agent_id)
        if agent is None:
            agent = InboxAgent(self._manifest(agent_id))
            await self._register(agent)
            self._agents[agent_id] = agent
        agent.calls[topic] = (request.policy, request.explain, request.confidence)
        if not await self._trigger(topic):
            agent.calls.pop(topic, None)
            view = self._projections.agents.get(agent_id)
            status = view.status if view is not None else "unknown"
            raise ProofRefused(
                ReasonCode.AGENT_PASSIVE if status == "PASSIVE" else ReasonCode.UNAUTHORIZED,
                "agent_id",
                f"agent {agent_id} is {status}: no flow was opened",
            )

    def _manifest(self, agent_id: str) -> Manifest:
        """The manifest the inbox registers for ``agent_id``: never wider than it had.

        Raises:
            ProofRefused: AGENT_IN_SESSION, when the agent is hosted here or has a session
                of its own.
        """
        if agent_id in self._hosts:
            raise ProofRefused(
                ReasonCode.AGENT_IN_SESSION,
                "agent_id",
                f"agent {agent_id} is hosted in this kernel: the inbox does not propose for it",
            )
        kinds = sorted(self._kinds())
        view = self._projections.agents.get(agent_id)
        if view is not None:
            if not inbox_manifest(view.manifest):
                raise ProofRefused(
                    ReasonCode.AGENT_IN_SESSION,
                    "agent_id",
                    f"agent {agent_id} holds a session of its own: the inbox does not propose"
                    " for it",
                )
            kinds = [kind for kind in view.manifest.capabilities if kind in kinds]
        major, minor = CONTRACT_VERSION
        return Manifest(
            agent_id=agent_id,
            version=f"{major}.{minor}.0+{INBOX_BUILD}",
            capabilities=kinds,
            subscriptions=[f"{PROPOSE_TOPIC}.{agent_id}"],
            limits=dict(view.manifest.limits) if view is not None else {},
            max_attempts=1,
        )
