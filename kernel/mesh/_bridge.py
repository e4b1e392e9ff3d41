"""The kernel's side of the mesh: handshakes, contexts out, proposals in, verdicts out."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
import nats
import nats.errors
import nats.js.errors
from anyio.abc import TaskGroup
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

from kernel.api import Kernel
from kernel.core.errors import KernelShutdown
from kernel.core.events import Feedback, Manifest
from kernel.core.reasons import ReasonCode
from kernel.mesh._relay import Relay
from kernel.policy.contracts import (
    HandshakeRefused,
    Outcome,
    Proposal,
    Session,
    Verdict,
    to_record,
)
from kernel.registry import credential_matches
from kernel.runtime.actors import Mailbox, MailboxClosed
from kernel.runtime.messages import AgentMessage, Withdraw
from kernel.state.projections import session_hash

log = logging.getLogger("kernel.mesh")
Headers = dict[str, str]

HANDSHAKE_SUBJECT = "dirk.mesh.handshake"
STARTED_SUBJECT = "dirk.mesh.started"
"""Where a kernel says it (re)started: hosts then handshake again (the old sessions ended)."""
WORK_STREAM = "DIRK_WORK"
PROPOSAL_STREAM = "DIRK_PROPOSALS"
VERDICT_STREAM = "DIRK_VERDICTS"
KERNEL_CONSUMER = "kernel"
MAX_MESSAGE = 1 << 20
RETRY_S = 0.25
"""The pause before a publish or fetch is tried again while the client reconnects."""
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,128}")
# What a host may report when its agent ends a flow without a proposal.
_WITHDRAW_CODES = frozenset(
    {ReasonCode.AGENT_DECLINED, ReasonCode.AGENT_ERROR, ReasonCode.REASONING_TIMEOUT}
)


def safe_token(text: object) -> bool:
    """Whether ``text`` may stand as one token of a NATS subject (ids, DFIDs)."""
    return isinstance(text, str) and _TOKEN.fullmatch(text) is not None


def proposal_body(
    proposal: Proposal | None, withdraw: tuple[ReasonCode, str] | None = None
) -> bytes:
    """What a host publishes for one context: the proposal's record, or why it withdraws."""
    if proposal is None:
        code, detail = withdraw or (ReasonCode.AGENT_DECLINED, "no action")
        return json.dumps({"withdraw": {"reason_code": code, "detail": detail[:500]}}).encode()
    return json.dumps({"proposal": msgspec.to_builtins(to_record(proposal))}).encode()


def work_id(journal: str, dfid: str, attempt: int) -> str:
    """The ``Nats-Msg-Id`` of a context and of its proposal: ``<journal_id>:<dfid>:<attempt>``."""
    return f"{journal}:{dfid}:{attempt}"


def verdict_subject(journal: str, dfid: str, attempt: int) -> str:
    """Where the verdict on a flow's attempt is published (one kept per subject)."""
    return f"dirk.verdicts.{journal}.{dfid}.{attempt}"


def auth_tag(token: str, msg_id: str, body: bytes) -> str:
    """The ``Dirk-Auth`` of a proposal: an HMAC of its id and body under the session token."""
    return hmac.new(token.encode(), msg_id.encode() + b"\n" + body, hashlib.sha256).hexdigest()


class MeshConfig(msgspec.Struct, frozen=True, kw_only=True):
    """How the mesh uses JetStream.

    Attributes:
        ack_wait_s: how long a host may hold a context before it is redelivered (at least
            the reasoning timeout; hosts send in-progress acks while they reason).
        max_deliver: how often one context is delivered before JetStream gives up on it.
        batch: proposals the kernel takes from the bus at once.
        relay: publish every committed event on ``dirk.evt.<type>.<dfid>`` (kernel.mesh._relay).
    """

    ack_wait_s: float = 60.0
    max_deliver: int = 5
    batch: int = 64
    relay: bool = True


class Mesh:
    """The kernel's side of the bus; obtain one with :func:`open_mesh`."""

    def __init__(self, kernel: Kernel, nc: Client, config: MeshConfig) -> None:
        self.kernel = kernel
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.config = config
        self.journal = kernel.journal.journal_id
        """Ids on the bus start with it: DFIDs are unique within a journal, not across them."""
        self.sessions: dict[str, Session] = {}
        """The session each remote agent's hosts share, by agent id."""
        self._tg: TaskGroup | None = None
        self._lock = anyio.Lock()
        self._served: set[str] = set()
        self.relay: Relay | None = None
        """The relay of committed events, when the config asks for one."""

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[Mesh]:
        """Serve remote agents on the bus for the body of the block: handshakes, contexts,
        proposals and, when configured, the relay of committed events."""
        await self._streams()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await self.nc.subscribe(HANDSHAKE_SUBJECT, queue="kernel", cb=self._on_handshake)
            tg.start_soon(self._take_proposals, name="mesh:proposals")
            await self.nc.publish(STARTED_SUBJECT, self.kernel.journal.journal_id.encode())
            if self.config.relay:
                self.relay = Relay(self.kernel.journal, self.js, RETRY_S)
                tg.start_soon(self.relay.run, name="mesh:relay")
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()

    async def _streams(self) -> None:
        streams = [
            StreamConfig(
                name=WORK_STREAM, subjects=["dirk.work.>"], retention=RetentionPolicy.WORK_QUEUE
            ),
            StreamConfig(name=PROPOSAL_STREAM, subjects=["dirk.proposals.>"]),
            StreamConfig(name=VERDICT_STREAM, subjects=["dirk.verdicts.>"], max_msgs_per_subject=1),
        ]
        for config in streams:
            try:
                await self.js.add_stream(config)
            except nats.js.errors.BadRequestError:
                await self.js.update_stream(config)

    # --- handshakes -------------------------------------------------------

    async def _on_handshake(self, msg: Msg) -> None:
        try:
            answer = await self._handshake(msg.data)
        except (KernelShutdown, MailboxClosed):
            answer = {"refused": ReasonCode.KERNEL_FAULT, "detail": "the kernel is stopping"}
        await msg.respond(json.dumps(answer).encode())

    async def _handshake(self, data: bytes) -> dict[str, Any]:
        try:
            request = json.loads(data) if len(data) <= MAX_MESSAGE else {}
            manifest = msgspec.convert(request["manifest"], Manifest)
            credential = request.get("credential")
        except (ValueError, TypeError, KeyError, msgspec.ValidationError) as exc:
            return {"refused": ReasonCode.SCHEMA_INVALID, "detail": f"not a handshake: {exc}"[:300]}
        agent_id = manifest.agent_id
        if not safe_token(agent_id):
            detail = "an agent id on the bus is 1-128 of A-Z a-z 0-9 _ -"
            return {"refused": ReasonCode.SCHEMA_INVALID, "detail": detail}
        async with self._lock:
            held = self.sessions.get(agent_id)
            verifier = self.kernel.projections.credentials.get(agent_id)
            agent = self.kernel.projections.agents.get(agent_id)
            if (
                held is not None
                and agent is not None
                and agent.manifest == manifest
                and credential_matches(verifier, credential)
                and held.token in self._live_tokens(agent_id)
            ):
                session = held  # another host of the same agent joins its session
            else:
                try:
                    session = await self.kernel.handshake(
                        manifest,
                        credential=credential if isinstance(credential, str) else "",
                        require_credential=True,
                    )
                except HandshakeRefused as exc:
                    return {"refused": exc.reason_code, "detail": exc.detail}
                self.sessions[agent_id] = session
                await self._serve(agent_id)
        return {
            "agent_id": agent_id,
            "token": session.token,
            "kernel_version": session.kernel_version,
            "schemas": session.schemas,
            "consumer": _pool(agent_id),
        }

    def _live_tokens(self, agent_id: str) -> set[str]:
        held = self.sessions.get(agent_id)
        if held is None:
            return set()
        live = self.kernel.projections.sessions.get(session_hash(held.token))
        return {held.token} if live == agent_id else set()

    async def _serve(self, agent_id: str) -> None:
        """Make ``agent_id``'s pool consumer and start sending its contexts to the bus."""
        config = ConsumerConfig(
            durable_name=_pool(agent_id),
            filter_subject=f"dirk.work.{agent_id}",
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.config.ack_wait_s,
            max_deliver=self.config.max_deliver,
        )
        await self.js.add_consumer(WORK_STREAM, config)
        if agent_id in self._served:
            return
        self._served.add(agent_id)
        mailbox = self.kernel.route(agent_id)
        assert self._tg is not None
        self._tg.start_soon(self._forward, agent_id, mailbox, name=f"mesh:{agent_id}")

    async def _forward(self, agent_id: str, mailbox: Mailbox[AgentMessage]) -> None:
        """Publish each context addressed to ``agent_id`` on its work subject."""
        while True:
            ctx = await mailbox.receive()
            body = msgspec.json.encode(ctx)
            headers = {"Nats-Msg-Id": work_id(self.journal, ctx.dfid, ctx.attempt)}
            # Until JetStream has it: the id makes a retry of a publish that did land a no-op.
            await _publish(self.js, f"dirk.work.{agent_id}", body, headers)

    # --- proposals --------------------------------------------------------

    async def _take_proposals(self) -> None:
        sub = await self.js.pull_subscribe(
            "dirk.proposals.>", durable=f"{KERNEL_CONSUMER}-{self.journal}", stream=PROPOSAL_STREAM
        )
        assert self._tg is not None
        limit = anyio.Semaphore(self.config.batch)
        while True:
            try:
                msgs = await sub.fetch(self.config.batch, timeout=5.0)
            except TimeoutError:  # nats.errors.TimeoutError, or asyncio's from a fetch
                continue
            except nats.errors.Error as exc:  # reconnecting: the next fetch resumes
                log.warning("mesh: fetching proposals failed (%r); retrying", exc)
                await anyio.sleep(RETRY_S)
                continue
            for msg in msgs:
                await limit.acquire()
                self._tg.start_soon(self._judge_and_release, msg, limit)

    async def _judge_and_release(self, msg: Msg, limit: anyio.Semaphore) -> None:
        try:
            await self._judge(msg)
        finally:
            limit.release()

    async def _judge(self, msg: Msg) -> None:
        agent_id = msg.subject.removeprefix("dirk.proposals.")
        msg_id = (msg.headers or {}).get("Nats-Msg-Id", "")
        journal, _, rest = msg_id.partition(":")
        dfid, _, attempt_text = rest.rpartition(":")
        if journal != self.journal:
            await msg.term()  # another kernel's (or a forger's) id: not this journal's flow
            return
        if not safe_token(dfid) or not attempt_text.isdigit() or len(msg.data) > MAX_MESSAGE:
            log.warning("mesh: dropped a proposal without a usable id on %s", msg.subject)
            await msg.term()
            return
        attempt = int(attempt_text)
        held = self.sessions.get(agent_id)
        tag = (msg.headers or {}).get("Dirk-Auth", "")
        authentic = held is not None and hmac.compare_digest(
            tag, auth_tag(held.token, msg_id, msg.data)
        )
        # A message that is not its session's is submitted under no token: the DIM
        # refuses it (INVALID_SESSION) and records the refusal.
        token = held.token if authentic and held is not None else ""
        verdict = await self._record(token, dfid, attempt, msg.data)
        body = msgspec.json.encode(verdict)
        headers = {"Nats-Msg-Id": f"{msg_id}:{msg.metadata.sequence.stream}"}
        await _publish(self.js, verdict_subject(self.journal, dfid, attempt), body, headers)
        # Unacked (the bus went away), the proposal comes back and is answered from the record.
        with contextlib.suppress(nats.errors.Error):
            await msg.ack()

    async def _record(self, token: str, dfid: str, attempt: int, data: bytes) -> Verdict:
        try:
            body = json.loads(data)
        except ValueError:
            body = None
        withdraw = body.get("withdraw") if isinstance(body, dict) else None
        if isinstance(withdraw, dict) and token:
            code = withdraw.get("reason_code")
            detail = withdraw.get("detail")
            reason = ReasonCode(code) if code in _WITHDRAW_CODES else ReasonCode.AGENT_ERROR
            await self.kernel.actors.dim.send(
                Withdraw(
                    dfid=dfid,
                    token=token,
                    attempt=attempt,
                    reason_code=reason,
                    detail=detail[:500] if isinstance(detail, str) else "",
                )
            )
            feedback = Feedback(reason_code=reason, layer="agent")
            return Verdict(outcome=Outcome.ABORTED, dfid=dfid, attempt=attempt, feedback=feedback)
        proposal = body.get("proposal") if isinstance(body, dict) else None
        return await self.kernel.submit(token, dfid, proposal if proposal is not None else data)


async def _publish(js: JetStreamContext, subject: str, body: bytes, headers: Headers) -> None:
    """Publish until JetStream acknowledges (the client reconnects underneath)."""
    while True:
        try:
            await js.publish(subject, body, headers=headers)
            return
        except nats.errors.Error as exc:
            log.warning("mesh: publish failed (%r); retrying", exc)
            await anyio.sleep(RETRY_S)


def _pool(agent_id: str) -> str:
    return f"pool-{agent_id}"


@asynccontextmanager
async def open_mesh(
    kernel: Kernel,
    url: str,
    config: MeshConfig | None = None,
    *,
    reasoning_timeout_s: float | None = None,
) -> AsyncIterator[Mesh]:
    """Connect ``kernel`` to the bus at ``url`` and serve remote agents for the block."""
    config = config or MeshConfig()
    timeout_s = reasoning_timeout_s
    if timeout_s is not None and config.ack_wait_s < timeout_s:
        config = msgspec.structs.replace(config, ack_wait_s=timeout_s)
    nc = await nats.connect(url, name="dirk-kernel", max_reconnect_attempts=-1)
    try:
        async with Mesh(kernel, nc, config).serving() as mesh:
            yield mesh
    finally:
        await nc.close()
