"""The kernel's side of the mesh: handshakes, contexts out, proposals in, verdicts out.

No bus message, from anyone, may stop the kernel or decide what the journal records.
So every handler here decodes strictly (kernel.mesh._protocol), catches whatever a
message makes it raise, and answers, drops or terminates the message; a message it
refuses before the registry or the DIM sees it is recorded as ``InputRefused``
(``entry`` ``bus.handshake``, ``bus.proposal``, ``bus.result`` or ``bus``) with every
string made printable and clipped.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
import nats.errors
import nats.js.errors
from anyio.abc import TaskGroup
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

from kernel.api import Kernel
from kernel.core.errors import KernelShutdown
from kernel.core.events import Draft, Feedback, InputRefused, Manifest
from kernel.core.fetching import FetchRefused
from kernel.core.reasons import ReasonCode
from kernel.mesh._executor import RemoteAdapter
from kernel.mesh._principal import PRINCIPAL_HEADER, assertion_problem
from kernel.mesh._protocol import (
    ARTIFACT_PREFIX,
    FETCH_DECODER,
    HANDSHAKE_PREFIX,
    HOST_DECODER,
    MAX_NONCE,
    SIGNATURE_HEADER,
    STARTED_SUBJECT,
    ArtifactData,
    ArtifactRefused,
    Challenge,
    Hello,
    Prove,
    Refused,
    Welcome,
    digest_holds,
    fetch_signed,
    parse_work_id,
    proof_message,
    proposal_signed,
    safe_token,
    split_proposal_id,
    verdict_subject,
    work_id,
)
from kernel.mesh._relay import Relay
from kernel.mesh._wire import (
    RETRY_S,
    BusAuth,
    GuardedClient,
    agent_inbox,
    connect,
    ensure_stream,
    printable,
)
from kernel.policy.contracts import HandshakeRefused, Outcome, Session, Verdict
from kernel.registry import credential_matches
from kernel.runtime.actors import Mailbox, MailboxClosed
from kernel.runtime.messages import AgentMessage, CredentialProof, Withdraw
from kernel.state.projections import session_hash

log = logging.getLogger("kernel.mesh")
Headers = dict[str, str]

WORK_STREAM = "DIRK_WORK"
PROPOSAL_STREAM = "DIRK_PROPOSALS"
VERDICT_STREAM = "DIRK_VERDICTS"
KERNEL_CONSUMER = "kernel"
MAX_MESSAGE = 1 << 20
CHALLENGES = 1024
"""Challenges kept at once; the oldest unanswered one is forgotten first."""
# What a host may report when its agent ends a flow without a proposal.
_WITHDRAW_CODES = frozenset(
    {ReasonCode.AGENT_DECLINED, ReasonCode.AGENT_ERROR, ReasonCode.REASONING_TIMEOUT}
)
_ANY = msgspec.json.Decoder()


class MeshConfig(msgspec.Struct, frozen=True, kw_only=True):
    """How the mesh uses JetStream.

    Attributes:
        ack_wait_s: how long a host may hold a context before it is redelivered (at least
            the reasoning timeout; hosts send in-progress acks while they reason).
        max_deliver: how often one context (or proposal) is delivered before JetStream
            gives up on it.
        batch: proposals the kernel takes from the bus at once.
        relay: publish every committed event on ``dirk.evt.<type>.<dfid>`` (kernel.mesh._relay).
    """

    ack_wait_s: float = 60.0
    max_deliver: int = 5
    batch: int = 64
    relay: bool = True


class _Held(msgspec.Struct, frozen=True, kw_only=True):
    session: Session
    key: str
    """The public key the session was proven with: its proposals must be signed by it."""


class Mesh:
    """The kernel's side of the bus; obtain one with :func:`open_mesh`."""

    def __init__(self, kernel: Kernel, nc: GuardedClient, config: MeshConfig) -> None:
        self.kernel = kernel
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.config = config
        self.journal = kernel.journal.journal_id
        """Ids on the bus start with it: DFIDs are unique within a journal, not across them."""
        self.sessions: dict[str, _Held] = {}
        """The session each remote agent's hosts share, by agent id (never on the bus)."""
        self.refused = 0
        """Bus messages refused before the registry or the DIM saw them (each recorded)."""
        self._challenges: OrderedDict[str, str] = OrderedDict()
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
        nc, kernel = self.nc, self.kernel
        async with anyio.create_task_group() as tg:
            self._tg = tg
            # A message the client could not hand over (too large, a slow consumer) is
            # recorded as refused, not lost in silence; so is a remote executor's bad result.
            nc.on_dropped = lambda subject, why: self.refuse_soon("bus", "subject", why, subject)
            for adapter in _remote_adapters(kernel):
                adapter.on_refused = self.refuse
            await nc.subscribe(HANDSHAKE_PREFIX + ".*", queue="kernel", cb=self._on_handshake)
            await nc.subscribe(ARTIFACT_PREFIX + ".*", queue="kernel", cb=self._on_fetch)
            tg.start_soon(self._take_proposals, name="mesh:proposals")
            await nc.publish(STARTED_SUBJECT, kernel.journal.journal_id.encode())
            if self.config.relay:
                self.relay = Relay(kernel.journal, self.js, RETRY_S)
                tg.start_soon(self.relay.run, name="mesh:relay")
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()
                nc.on_dropped = None
                for adapter in _remote_adapters(kernel):
                    adapter.on_refused = None

    async def _streams(self) -> None:
        streams = [
            StreamConfig(
                name=WORK_STREAM, subjects=["dirk.work.>"], retention=RetentionPolicy.WORK_QUEUE
            ),
            StreamConfig(name=PROPOSAL_STREAM, subjects=["dirk.proposals.>"]),
            StreamConfig(
                name=VERDICT_STREAM,
                subjects=["dirk.verdicts.>"],
                max_msgs_per_subject=1,
                allow_direct=True,  # a host reads its own verdicts by subject, nothing else
            ),
        ]
        for config in streams:
            await ensure_stream(self.js, config)

    # --- refusals -----------------------------------------------------------

    async def refuse(
        self,
        entry: str,
        field: str,
        detail: str,
        target: str = "",
        code: ReasonCode = ReasonCode.SCHEMA_INVALID,
    ) -> None:
        """Record a bus message refused before the registry or the DIM saw it.

        Never raises: a kernel that is stopping records nothing more, and says so in the log.
        """
        self.refused += 1
        log.warning("mesh: refused on %s (%s): %s", entry, field, printable(detail, 300))
        payload = InputRefused(
            reason_code=code,
            entry=entry,
            field=printable(field, 64),
            detail=printable(detail),
            target=printable(target, 256),
        )
        try:
            await self.kernel.journal.append([Draft(payload=payload)])
        except Exception as exc:  # the journal's own failure stops the kernel, not this task
            log.warning("mesh: could not record the refusal (%r)", exc)

    def refuse_soon(self, entry: str, field: str, detail: str, target: str = "") -> None:
        """Record a refusal from code that must not wait (a client's read loop)."""
        if self._tg is not None:
            self._tg.start_soon(self.refuse, entry, field, detail, target)

    # --- handshakes -------------------------------------------------------

    async def _on_handshake(self, msg: Msg) -> None:
        agent_id = msg.subject.removeprefix(HANDSHAKE_PREFIX + ".")
        try:
            answer = await self._handshake(agent_id, msg)
        except (KernelShutdown, MailboxClosed):
            answer = Refused(reason_code=ReasonCode.KERNEL_FAULT, detail="the kernel is stopping")
        except Exception as exc:  # a handshake never stops the mesh: refuse it, on record
            log.exception("mesh: a handshake for %r failed", printable(agent_id, 128))
            await self.refuse("bus.handshake", "$", f"{type(exc).__name__}", agent_id)
            answer = Refused(reason_code=ReasonCode.KERNEL_FAULT, detail="the handshake failed")
        if answer is None:
            return
        with contextlib.suppress(nats.errors.Error):
            await msg.respond(msgspec.json.encode(answer))

    async def _handshake(self, agent_id: str, msg: Msg) -> Challenge | Welcome | Refused | None:
        if not safe_token(agent_id):
            await self.refuse("bus.handshake", "subject", "not an agent id", agent_id)
            return None
        # Replies go to the agent's own inbox, which only its hosts may read.
        if not msg.reply.startswith(agent_inbox(agent_id) + "."):
            detail = f"the reply subject is not in {agent_inbox(agent_id)}"
            await self.refuse("bus.handshake", "reply", detail, agent_id, ReasonCode.UNAUTHORIZED)
            return None
        if len(msg.data) > MAX_MESSAGE:
            return await self._refused(agent_id, "$", "larger than a message may be")
        try:
            request = HOST_DECODER.decode(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return await self._refused(agent_id, "$", f"not a handshake: {exc}")
        match request:
            case Hello():
                return self._challenge(agent_id)
            case Prove(manifest=raw, nonce=nonce, signature=signature):
                return await self._prove(agent_id, bytes(raw), nonce, signature)
        return None  # pragma: no cover - the decoder admits only the two

    async def _refused(self, agent_id: str, field: str, detail: str) -> Refused:
        await self.refuse("bus.handshake", field, detail, agent_id)
        return Refused(reason_code=ReasonCode.SCHEMA_INVALID, detail=printable(detail, 300))

    def _challenge(self, agent_id: str) -> Challenge:
        nonce = secrets.token_urlsafe(32)
        self._challenges[nonce] = agent_id
        while len(self._challenges) > CHALLENGES:
            self._challenges.popitem(last=False)
        return Challenge(journal=self.journal, nonce=nonce)

    async def _prove(
        self, agent_id: str, raw: bytes, nonce: str, signature: str
    ) -> Welcome | Refused:
        # One use per challenge, and only by the agent it was given to.
        if len(nonce) > MAX_NONCE or self._challenges.pop(nonce, None) != agent_id:
            return await self._refused(agent_id, "nonce", "not a challenge this kernel gave")
        try:
            manifest = msgspec.json.decode(raw, type=Manifest)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return await self._refused(agent_id, "manifest", f"not a manifest: {exc}")
        if manifest.agent_id != agent_id:
            return await self._refused(agent_id, "manifest.agent_id", "not the subject's agent")
        proof = CredentialProof(
            message=proof_message(self.journal, nonce, agent_id, raw), signature=signature
        )
        async with self._lock:
            held = self.sessions.get(agent_id)
            verifier = self.kernel.projections.credentials.get(agent_id)
            agent = self.kernel.projections.agents.get(agent_id)
            if (
                held is not None
                and agent is not None
                and agent.manifest == manifest
                and credential_matches(verifier, proof)
                and self._live(held)
            ):
                session = held.session  # another host of the same agent joins its session
            else:
                try:
                    session = await self.kernel.handshake(
                        manifest, credential=proof, require_credential=True
                    )
                except HandshakeRefused as exc:
                    return Refused(reason_code=exc.reason_code, detail=exc.detail)
                key = self.kernel.projections.credentials.get(agent_id)
                assert key is not None  # the registry took the proof against it
                self.sessions[agent_id] = _Held(session=session, key=key)
                await self._serve(agent_id)
        return Welcome(
            agent_id=agent_id,
            journal=self.journal,
            kernel_version=session.kernel_version,
            schemas=session.schemas,
            consumer=_pool(agent_id),
        )

    def _live(self, held: _Held) -> bool:
        live = self.kernel.projections.sessions.get(session_hash(held.session.token))
        return live == held.session.agent_id

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

    # --- artifacts ---------------------------------------------------------

    async def _on_fetch(self, msg: Msg) -> None:
        """Answer a host's fetch of an artifact: only one its agent's context referenced."""
        agent_id = msg.subject.removeprefix(ARTIFACT_PREFIX + ".")
        try:
            answer = await self._fetch(agent_id, msg)
        except (KernelShutdown, MailboxClosed):
            answer = ArtifactRefused(
                reason_code=ReasonCode.KERNEL_FAULT, detail="the kernel is stopping"
            )
        except Exception as exc:  # a fetch never stops the mesh: refuse it, on record
            log.exception("mesh: a fetch for %r failed", printable(agent_id, 128))
            await self.refuse("bus.artifact", "$", f"{type(exc).__name__}", agent_id)
            answer = ArtifactRefused(reason_code=ReasonCode.KERNEL_FAULT, detail="the fetch failed")
        if answer is None:
            return
        with contextlib.suppress(nats.errors.Error):
            await msg.respond(msgspec.json.encode(answer))

    async def _fetch(self, agent_id: str, msg: Msg) -> ArtifactData | ArtifactRefused | None:
        if not safe_token(agent_id):
            await self.refuse("bus.artifact", "subject", "not an agent id", agent_id)
            return None
        if not msg.reply.startswith(agent_inbox(agent_id) + "."):
            # Bytes go only to the agent's own inbox, which only its hosts may read.
            detail = f"the reply subject is not in {agent_inbox(agent_id)}"
            await self.refuse("bus.artifact", "reply", detail, agent_id, ReasonCode.UNAUTHORIZED)
            return None
        held = self.sessions.get(agent_id)
        signature = (msg.headers or {}).get(SIGNATURE_HEADER)
        if held is None or not fetch_signed(held.key, msg.subject, msg.data, signature):
            detail = "no session of this agent signed the fetch"
            await self.refuse(
                "bus.artifact", SIGNATURE_HEADER, detail, agent_id, ReasonCode.UNAUTHORIZED
            )
            return ArtifactRefused(reason_code=ReasonCode.UNAUTHORIZED, detail=detail)
        if len(msg.data) > MAX_MESSAGE:
            await self.refuse("bus.artifact", "$", "larger than a message may be", agent_id)
            return ArtifactRefused(reason_code=ReasonCode.SCHEMA_INVALID, detail="too large")
        try:
            ask = FETCH_DECODER.decode(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await self.refuse("bus.artifact", "$", f"not a fetch: {exc}", agent_id)
            return ArtifactRefused(reason_code=ReasonCode.SCHEMA_INVALID, detail="not a fetch")
        try:
            got = await self.kernel.fetch_artifact(
                agent_id, ask.dfid, ask.ref, ask.start, ask.length
            )
        except FetchRefused as exc:  # recorded by the kernel
            return ArtifactRefused(
                reason_code=exc.reason_code, detail=printable(exc.detail, 500), field=exc.field
            )
        return ArtifactData(
            ref=got.ref, start=got.start, data=got.data, size=got.size, media_type=got.media_type
        )

    # --- proposals --------------------------------------------------------

    async def _take_proposals(self) -> None:
        config = ConsumerConfig(
            ack_policy=AckPolicy.EXPLICIT,
            # Never for ever: a message the kernel cannot take is dropped after this many.
            max_deliver=max(self.config.max_deliver, 5),
        )
        sub = await self.js.pull_subscribe(
            "dirk.proposals.>",
            durable=f"{KERNEL_CONSUMER}-{self.journal}",
            stream=PROPOSAL_STREAM,
            config=config,
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
        except (KernelShutdown, MailboxClosed):
            pass  # unacked: the next kernel takes it
        except Exception as exc:  # a proposal never stops the mesh: refuse it, on record
            log.exception("mesh: a proposal on %s failed", printable(msg.subject, 200))
            await self.refuse("bus.proposal", "$", f"{type(exc).__name__}", msg.subject)
            with contextlib.suppress(nats.errors.Error):
                await msg.term()
        finally:
            limit.release()

    async def _judge(self, msg: Msg) -> None:
        agent_id = msg.subject.removeprefix("dirk.proposals.")
        headers = msg.headers or {}
        msg_id = headers.get("Nats-Msg-Id", "")
        work, digest = split_proposal_id(msg_id)
        ids = parse_work_id(work)
        if ids is not None and ids[0] != self.journal:
            await msg.term()  # another kernel's flow (journals may share a bus): not ours
            return
        signature = headers.get(SIGNATURE_HEADER)
        problem = _proposal_problem(agent_id, ids, len(msg.data), digest, signature)
        if problem is not None or ids is None:
            await self.refuse("bus.proposal", "Nats-Msg-Id", problem or "", printable(msg_id, 256))
            await msg.term()
            return
        _, dfid, attempt = ids
        held = self.sessions.get(agent_id)
        authentic = held is not None and proposal_signed(held.key, work, msg.data, signature)
        # A message that is not its session's is submitted under no token: the DIM
        # refuses it (INVALID_SESSION) and records the refusal.
        token = held.session.token if authentic and held is not None else ""
        if token and held is not None and PRINCIPAL_HEADER in headers:
            vouched = headers[PRINCIPAL_HEADER]
            found = await assertion_problem(
                self.kernel.journal, agent_id, held.key, work, msg.data, vouched
            )
            if found is not None:
                await self.refuse("bus.proposal", PRINCIPAL_HEADER, found[1], msg_id, found[0])
                await msg.term()
                return
        verdict = await self._record(token, dfid, attempt, msg.data)
        body = msgspec.json.encode(verdict)
        out = {"Nats-Msg-Id": f"{msg_id}:{msg.metadata.sequence.stream}"}
        subject = verdict_subject(agent_id, self.journal, dfid, attempt)
        await _publish(self.js, subject, body, out)
        # Unacked (the bus went away), the proposal comes back and is answered from the record.
        with contextlib.suppress(nats.errors.Error):
            await msg.ack()

    async def _record(self, token: str, dfid: str, attempt: int, data: bytes) -> Verdict:
        try:
            body = _ANY.decode(data)  # strict: no invalid UTF-8, no lone surrogate
        except msgspec.DecodeError:
            body = None
        withdraw = body.get("withdraw") if isinstance(body, dict) else None
        if isinstance(withdraw, dict) and token:
            code = withdraw.get("reason_code")
            detail = withdraw.get("detail")
            reason = (
                ReasonCode(code)
                if isinstance(code, str) and code in _WITHDRAW_CODES
                else ReasonCode.AGENT_ERROR
            )
            await self.kernel.actors.dim.send(
                Withdraw(
                    dfid=dfid,
                    token=token,
                    attempt=attempt,
                    reason_code=reason,
                    detail=printable(detail, 500) if isinstance(detail, str) else "",
                )
            )
            feedback = Feedback(reason_code=reason, layer="agent")
            return Verdict(outcome=Outcome.ABORTED, dfid=dfid, attempt=attempt, feedback=feedback)
        proposal = body.get("proposal") if isinstance(body, dict) else None
        return await self.kernel.submit(token, dfid, proposal if proposal is not None else data)


def _proposal_problem(
    agent_id: str, ids: tuple[str, str, int] | None, size: int, digest: str, signature: object
) -> str | None:
    """Why a proposal on the bus is refused before the DIM sees it, or None."""
    if not safe_token(agent_id):
        return "the subject names no agent"
    if ids is None:
        return "Nats-Msg-Id is not <journal>:<dfid>:<attempt>"
    if size > MAX_MESSAGE:
        return "larger than a message may be"
    if digest and not digest_holds(digest, signature):
        return "Nats-Msg-Id's digest is not its Dirk-Sig's"
    return None


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


def _remote_adapters(kernel: Kernel) -> list[Any]:
    return [a for a in kernel.actors.adapters.values() if isinstance(a, RemoteAdapter)]


@asynccontextmanager
async def open_mesh(
    kernel: Kernel,
    url: str,
    config: MeshConfig | None = None,
    *,
    reasoning_timeout_s: float | None = None,
    auth: BusAuth | None = None,
) -> AsyncIterator[Mesh]:
    """Connect ``kernel`` to the bus at ``url`` and serve remote agents for the block.

    ``auth`` is the kernel's principal on the bus (its key and TLS); default: from
    ``DIRK_BUS_KEY`` and ``DIRK_BUS_CA`` (:func:`kernel.mesh.kernel_auth`).
    """
    from kernel.mesh._wire import kernel_auth

    config = config or MeshConfig()
    timeout_s = reasoning_timeout_s
    if timeout_s is not None and config.ack_wait_s < timeout_s:
        config = msgspec.structs.replace(config, ack_wait_s=timeout_s)
    nc = await connect(url, name="dirk-kernel", auth=auth or kernel_auth())
    try:
        async with Mesh(kernel, nc, config).serving() as mesh:
            yield mesh
    finally:
        with anyio.CancelScope(shield=True):
            await nc.close()
