"""The agents' sessions: handshakes, the agents hosted in this process, and where they live.

An agent opens a session with a handshake (its manifest, and its credential once
one is provisioned); the registry records it. A hosted agent also gets a crew in
the agent host and a mailbox its contexts arrive in; an agent hosted elsewhere (the
mesh, the inbox's proposers) gets a route, a mailbox drained onto the bus.

:class:`Sessions` is one part of a :class:`kernel.api.Kernel`, which offers
``register``, ``handshake`` and ``route`` as its own methods.
"""

from __future__ import annotations

import msgspec

from kernel.api.calls import Calls
from kernel.api.wiring import Actors
from kernel.core import wall
from kernel.core.events import Manifest
from kernel.core.text import utf8_problem
from kernel.core.wall import InputInvalid, clip
from kernel.hosting import AgentLike
from kernel.policy.contracts import HandshakeRefused, Session, Verdict
from kernel.runtime.actors import Mailbox, Reply
from kernel.runtime.messages import AgentMessage, CredentialProof, Register, Withdrawal


class Sessions:
    """The sessions this kernel opened, and the mailboxes of the agents hosted or routed.

    Args:
        actors: the registry's mailbox and the agent host.
        calls: sends a handshake and waits for the registry's answer.
        hosts: the mailboxes of the agents hosted or routed, by id (shared with the
            context compiler, which delivers into them).
    """

    def __init__(
        self, actors: Actors, calls: Calls, hosts: dict[str, Mailbox[AgentMessage]]
    ) -> None:
        self._actors = actors
        self._calls = calls
        self._hosts = hosts
        self._sessions: dict[str, Session] = {}

    def token_of(self, agent_id: str) -> str | None:
        """The token of the session this kernel opened last for ``agent_id``, if any."""
        session = self._sessions.get(agent_id)
        return session.token if session is not None else None

    async def register(self, agent: AgentLike, *, credential: str | None = None) -> Session:
        """Hand the agent's manifest to the registry and host the agent in this kernel.

        Raises:
            HandshakeRefused: with VERSION_MISMATCH, UNKNOWN_AGENT, AGENT_SUSPENDED,
                CREDENTIAL_INVALID, ...
        """
        session = await self._handshake(agent.manifest, credential, False)
        agent_id = session.agent_id
        hosts = self._actors.agents
        if agent_id not in self._hosts:
            mailbox: Mailbox[AgentMessage] = Mailbox(f"agent:{agent_id}", self._actors.capacity)
            self._hosts[agent_id] = mailbox
            hosts.host(agent, mailbox)
        elif hosts.hosting(agent_id):
            # Registered again: the new agent gets a crew and a mailbox of its own; the
            # flows the old one held ended with its session (kernel.registry).
            mailbox = Mailbox(f"agent:{agent_id}", self._actors.capacity)
            hosts.retire(agent_id, self._hosts[agent_id], session.token)
            self._hosts[agent_id] = mailbox
            hosts.host(agent, mailbox)
        hosts.sessions[agent_id] = session
        self._sessions[agent_id] = session
        return session

    def route(self, agent_id: str) -> Mailbox[AgentMessage]:
        """Return the mailbox ``agent_id``'s contexts arrive in when it is hosted elsewhere."""
        mailbox = self._hosts.get(agent_id)
        if mailbox is None:
            mailbox = Mailbox(f"agent:{agent_id}", self._actors.capacity)
            self._hosts[agent_id] = mailbox
        return mailbox

    async def handshake(
        self,
        manifest: Manifest,
        *,
        credential: str | CredentialProof | None = None,
        require_credential: bool = False,
    ) -> Session:
        """Register a manifest without hosting the agent (it submits on its own).

        An agent id hosted in this process is displaced by such a handshake: its crew
        stops, and the flows it was thinking about end (INVALID_SESSION, recorded).

        Raises:
            HandshakeRefused: when the registry refuses the manifest.
        """
        session = await self._handshake(manifest, credential, require_credential)
        agent_id = session.agent_id
        agents = self._actors.agents
        if agents.hosting(agent_id):
            agents.retire(agent_id, self._hosts.pop(agent_id), session.token)
        self._sessions[agent_id] = session
        return session

    async def _handshake(
        self,
        manifest: Manifest,
        credential: str | CredentialProof | None,
        require_credential: bool,
    ) -> Session:
        invalid: str | None = None
        if credential is not None and not (
            isinstance(credential, CredentialProof)
            or (isinstance(credential, str) and utf8_problem(credential) is None)
        ):
            credential = ""  # shown but unusable: refused as not the agent's own
        try:
            checked = wall.admit(manifest, wall.ManifestSpec)
            manifest = msgspec.convert(msgspec.to_builtins(checked), Manifest)
        except InputInvalid as exc:
            # Refused, and recorded under ids clipped to what the journal takes.
            agent_id = getattr(manifest, "agent_id", "")
            invalid = f"{exc.field}: {exc.detail}"
            if not isinstance(agent_id, str) or len(agent_id) > wall.MAX_ID:
                invalid += f" (the refusal records the agent id cut to {wall.MAX_ID} characters)"
            version = getattr(manifest, "version", "")
            manifest = Manifest(agent_id=clip(agent_id), version=clip(version, 64))
        reply: Reply[Session | HandshakeRefused] = Reply()
        msg = Register(
            manifest=manifest,
            reply=reply,
            invalid=invalid,
            credential=credential,
            require_credential=require_credential,
            hosted=self._actors.agents.hosting(manifest.agent_id),
        )
        answer = await self._calls.call(self._actors.registry, msg, reply)
        assert isinstance(answer, Session)  # _call raised a refusal
        return answer

    async def withdraw(self, dfid: str, *, agent_id: str, reason: str) -> Verdict:
        """Withdraw flow ``dfid`` as its own agent, while it waits for a human decision.

        What a cancelled MCP task does (kernel.mcp, ``tasks/cancel``): the escalation
        desk aborts the flow with AGENT_DECLINED and ``withdrawn by AGENT: reason``
        (ABORTED), so a human's decision that comes later is refused (FLOW_NOT_ACTIVE)
        and nothing executes. A flow of another agent, one no human is asked about, or
        one a human has already decided is left as it is: REJECTED, FLOW_NOT_ACTIVE.
        """
        reply: Reply[Verdict] = Reply()
        detail = f"withdrawn by {agent_id[:64]}: {reason}"[:500]
        msg = Withdrawal(dfid=dfid, agent_id=agent_id, detail=detail, reply=reply)
        return await self._calls.call(self._actors.escalation, msg, reply)
