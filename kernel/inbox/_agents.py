"""Agents in another process whose proposals reach the kernel through the inbox.

``dirk mcp`` following a journal writes a ``propose`` request per agent write, signed
with the agent's own key (kernel.inbox.keyring, role ``agent``). The kernel opens a
session for that agent (a handshake with the manifest below, nothing hosted) and
opens one flow per row with the row's proposal in it (``Kernel.propose``'s entry), on
the topic ``inbox.<agent>.<row id>``, so the DIM judges it like any other. The flow's
events are the answer the other process reads back. The flow's DFID is derived from
the agent and the row, so a row whose flow an earlier run already opened is answered
from that flow, never proposed again.

What a row may never do (trust-and-edges D5):

- take over an agent that is hosted in the kernel, or that holds a session of its own
  (a handshake in process or over the bus): refused with AGENT_IN_SESSION;
- widen what an agent may propose: the first time, its manifest names every kind the
  packs define; afterwards, never more than the manifest it had (a pack loaded since
  adds nothing to it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from kernel.core.events import Feedback, Manifest
from kernel.core.reasons import ReasonCode
from kernel.inbox.proof import Proof, ProofRefused
from kernel.inbox.requests import PROPOSE_TOPIC, ProposeRequest
from kernel.policy.contracts import Session
from kernel.registry import CONTRACT_VERSION
from kernel.state.projections import AgentView, Projections

INBOX_BUILD = "inbox"
"""The build label (SemVer ``+inbox``) of the manifests the inbox registers."""


def inbox_manifest(manifest: Manifest) -> bool:
    """Tell whether ``manifest`` is one the inbox registered (not the agent's own handshake)."""
    return manifest.version.endswith(f"+{INBOX_BUILD}") and manifest.subscriptions == [
        f"{PROPOSE_TOPIC}.{manifest.agent_id}"
    ]


class OpenFlow(Protocol):
    """The kernel's entry that opens a flow with a given proposal (``Kernel.propose``'s)."""

    def __call__(
        self,
        agent_id: str,
        token: str,
        policy: Mapping[str, Any],
        *,
        explain: str,
        confidence: float,
        key: str,
        topic: str,
    ) -> Awaitable[Feedback | None]:
        """Open the flow keyed ``key`` and judge the proposal in it.

        Returns why no flow was opened (the agent may not act), or None: the flow
        is open now, or was opened under that key before.
        """
        ...


class InboxProposals:
    """Opens the flows of the inbox's ``propose`` rows, each in its agent's own session.

    Args:
        handshake: opens a session for a manifest, hosting nothing (``Kernel.handshake``).
        open_flow: opens a flow with a given proposal (the entry behind ``Kernel.propose``).
        kinds: the kinds the packs define.
        projections: the kernel's projections (agents registered).
        hosts: the agents hosted in the kernel or routed to the bus, by id.
    """

    def __init__(
        self,
        handshake: Callable[[Manifest], Awaitable[Session]],
        open_flow: OpenFlow,
        kinds: Callable[[], Iterable[str]],
        projections: Projections,
        hosts: Mapping[str, object],
    ) -> None:
        self._handshake = handshake
        self._open = open_flow
        self._kinds = kinds
        self._projections = projections
        self._hosts = hosts
        self._tokens: dict[str, str] = {}

    async def propose(self, request: ProposeRequest, proof: Proof) -> None:
        """Open the flow of a ``propose`` request with its policy in it, once per row.

        Raises:
            ProofRefused: AGENT_IN_SESSION, for an agent hosted here or holding a session;
                AGENT_PASSIVE or UNAUTHORIZED when the agent may not act (no flow opened).
            HandshakeRefused: the kernel does not allow the agent.
        """
        agent_id = request.agent_id
        view = self._check(agent_id)  # at every row: a session of its own may have begun
        token = self._tokens.get(agent_id)
        if token is None:
            token = (await self._handshake(self._manifest(agent_id, view))).token
            self._tokens[agent_id] = token
        refused = await self._open(
            agent_id,
            token,
            request.policy,
            explain=request.explain,
            confidence=request.confidence,
            key=f"inbox:{proof.inbox_id}",
            topic=f"{PROPOSE_TOPIC}.{agent_id}.{proof.inbox_id}",
        )
        if refused is not None:
            view = self._projections.agents.get(agent_id)
            status = view.status if view is not None else "unknown"
            raise ProofRefused(
                ReasonCode.AGENT_PASSIVE if status == "PASSIVE" else ReasonCode.UNAUTHORIZED,
                "agent_id",
                refused.detail,
            )

    def _check(self, agent_id: str) -> AgentView | None:
        """Return the agent as registered, unless the inbox may not propose for it.

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
        view = self._projections.agents.get(agent_id)
        if view is not None and not inbox_manifest(view.manifest):
            self._tokens.pop(agent_id, None)
            raise ProofRefused(
                ReasonCode.AGENT_IN_SESSION,
                "agent_id",
                f"agent {agent_id} holds a session of its own: the inbox does not propose for it",
            )
        return view

    def _manifest(self, agent_id: str, view: AgentView | None) -> Manifest:
        """The manifest the inbox registers for ``agent_id``: never wider than it had."""
        kinds = sorted(self._kinds())
        if view is not None:
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
