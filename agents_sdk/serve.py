"""The host side of the agent mesh: run agents in this process, reached over NATS.

::

    DIRK_CREDENTIAL_TRADER=dirk_... python -m agents_sdk.serve \\
        --bus nats://127.0.0.1:4222 examples.trading:Trader [module:AgentClass ...]

Each agent's credential (``dirk agent AGENT --issue-credential``) is read from
``DIRK_CREDENTIAL_<AGENT_ID>`` (upper case, ``-`` as ``_``) or else
``DIRK_AGENT_CREDENTIAL``, and never sent anywhere: it seeds the agent's key
(kernel.registry.agent_key), which is both its identity on the bus (an nkey: the
server's config lists its public half) and what it signs with. Each agent gets its
own connection and reply inbox (``_INBOX.agent.<agent_id>``), handshakes by signing
the kernel's challenge (kernel.mesh._protocol), and then ``--concurrency`` workers
take contexts from its pool's work queue (``dirk.work.<agent_id>``), call
``decide``, publish the proposal signed (``Dirk-Sig``) with ``Nats-Msg-Id =
<journal_id>:<dfid>:<attempt>:<digest of Dirk-Sig>`` (kernel.mesh.proposal_id), wait
for the kernel's verdict and only then ack the context. Any number of host processes
may serve the same agent; a host that dies costs a redelivery to another one, and a
context whose proposal was already recorded is answered from the verdict stream,
never decided or judged again. ``--ca`` (or ``DIRK_BUS_CA``) trusts a TLS server's
CA. :func:`serve` is the same as an API.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import ssl
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import msgspec
import nats.errors
import nats.js.errors
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from agents_sdk.agent import Agent
from kernel import (
    ArtifactSlice,
    FetchRefused,
    HandshakeRefused,
    Outcome,
    Proposal,
    ReasonCode,
    Verdict,
    WorkingContext,
)
from kernel.mesh import (
    FETCHED_DECODER,
    PROPOSAL_STREAM,
    RETRY_S,
    SIGNATURE_HEADER,
    STARTED_SUBJECT,
    VERDICT_STREAM,
    WORK_STREAM,
    ArtifactRefused,
    BusAuth,
    Challenge,
    FetchArtifact,
    Hello,
    Prove,
    Refused,
    Welcome,
    agent_inbox,
    agent_key,
    artifact_subject,
    connect,
    current_fetcher,
    fetch_signature,
    handshake_subject,
    proof_message,
    proposal_body,
    proposal_id,
    proposal_signature,
    sign_proof,
    verdict_subject,
    work_id,
)

log = logging.getLogger("agents_sdk.serve")

FETCH_S = 5.0
"""How long one fetch waits on the server for a context before asking again."""
HANDSHAKE_S = 30.0
"""How long each leg of a handshake waits for the kernel."""
FETCH_ARTIFACT_S = 30.0
"""How long an artifact fetch waits for the kernel's answer."""
_ANSWERS = msgspec.json.Decoder(Challenge | Welcome | Refused)


def credential_for(agent_id: str, env: Mapping[str, str] = os.environ) -> str | None:
    """Return the credential of ``agent_id`` from the environment, or None."""
    name = "DIRK_CREDENTIAL_" + agent_id.upper().replace("-", "_")
    return env.get(name) or env.get("DIRK_AGENT_CREDENTIAL")


def _answer(data: bytes) -> Challenge | Welcome | Refused:
    try:
        answer: Challenge | Welcome | Refused = _ANSWERS.decode(data)
        return answer
    except (msgspec.DecodeError, msgspec.ValidationError):
        return Refused(reason_code=ReasonCode.SCHEMA_INVALID, detail="not a kernel's answer")


async def handshake(nc: Client, agent: Agent, credential: str | None) -> Welcome:
    """Handshake ``agent`` with the kernel over ``nc``: prove the credential, never send it.

    ``nc`` must reply on the agent's own inbox (``inbox_prefix=agent_inbox(agent_id)``):
    the kernel answers nowhere else.

    Raises:
        HandshakeRefused: the kernel refused it (CREDENTIAL_INVALID, UNKNOWN_AGENT, ...).
    """
    agent_id = agent.manifest.agent_id
    subject = handshake_subject(agent_id)
    hello = await nc.request(subject, msgspec.json.encode(Hello()), timeout=HANDSHAKE_S)
    challenge = _answer(hello.data)
    if isinstance(challenge, Refused):
        raise HandshakeRefused(challenge.reason_code, challenge.detail)
    if not isinstance(challenge, Challenge):
        raise HandshakeRefused(ReasonCode.SCHEMA_INVALID, "the kernel did not challenge")
    manifest = msgspec.json.encode(agent.manifest)
    message = proof_message(challenge.journal, challenge.nonce, agent_id, manifest)
    signature = sign_proof(credential, message) if credential is not None else ""
    prove = Prove(manifest=msgspec.Raw(manifest), nonce=challenge.nonce, signature=signature)
    reply = await nc.request(subject, msgspec.json.encode(prove), timeout=HANDSHAKE_S)
    answer = _answer(reply.data)
    if isinstance(answer, Refused):
        raise HandshakeRefused(answer.reason_code, answer.detail)
    if not isinstance(answer, Welcome):
        raise HandshakeRefused(ReasonCode.SCHEMA_INVALID, "the kernel did not answer the proof")
    return answer


class _Hosted:
    def __init__(self, agent: Agent, nc: Client, credential: str | None, welcome: Welcome) -> None:
        self.agent = agent
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.credential = credential
        self.key: Ed25519PrivateKey | None = agent_key(credential) if credential else None
        self.agent_id = welcome.agent_id
        self.consumer = welcome.consumer
        self.decided = 0
        """Contexts this host's agent decided (the tests count them)."""

    async def work(self, progress_s: float) -> None:
        sub = await self.js.pull_subscribe_bind(durable=self.consumer, stream=WORK_STREAM)
        while True:
            try:
                [msg] = await sub.fetch(1, timeout=FETCH_S)
            except TimeoutError:  # nats.errors.TimeoutError, or asyncio's from a fetch
                continue
            except nats.errors.Error as exc:  # reconnecting: the next fetch resumes
                log.warning("fetching work failed (%r); retrying", exc)
                await anyio.sleep(RETRY_S)
                continue
            try:
                await self.handle(msg, progress_s)
            except nats.errors.Error as exc:
                # Unacked: the context comes back (to this host or another) after ack_wait,
                # and a proposal that was recorded is answered from the verdict stream.
                log.warning("flow context not finished (%r); it will be redelivered", exc)

    async def handle(self, msg: Msg, progress_s: float) -> None:
        try:
            ctx = msgspec.json.decode(msg.data, type=WorkingContext)
        except (msgspec.DecodeError, msgspec.ValidationError):
            await msg.term()  # not a context: never deliver it again
            return
        # Ids are the kernel's: its journal, the flow, the attempt (the work message's id).
        msg_id = (msg.headers or {}).get("Nats-Msg-Id", "")
        journal = msg_id.partition(":")[0]
        subject = verdict_subject(self.agent_id, journal, ctx.dfid, ctx.attempt)
        answers = await self.nc.subscribe(subject, max_msgs=1)
        try:
            # A first delivery has no proposal recorded yet (a host publishes one only after
            # a delivery): the verdict stream is asked only when the context comes back.
            redelivered = msg.metadata.num_delivered > 1
            verdict = await self._recorded(subject) if redelivered else None
            if verdict is None:
                body = await self._decide(ctx, msg, progress_s)
                work = work_id(journal, ctx.dfid, ctx.attempt)
                headers = {"Nats-Msg-Id": work}
                if self.key is not None:
                    signature = proposal_signature(self.key, work, body)
                    # An id no other agent can publish first (the stream is every agent's).
                    headers = {"Nats-Msg-Id": proposal_id(work, signature)}
                    headers[SIGNATURE_HEADER] = signature
                ack = await self.js.publish(
                    f"dirk.proposals.{self.agent_id}", body, stream=PROPOSAL_STREAM, headers=headers
                )
                # A fresh proposal's verdict comes on the subscription made before it was
                # published; a duplicate's may have been published before that: read it.
                looked = not (redelivered or ack.duplicate)
                verdict = await self._verdict(subject, answers, msg, progress_s, looked)
            else:
                log.info("flow %s attempt %s was judged already", ctx.dfid, ctx.attempt)
        finally:
            await answers.unsubscribe()
        if verdict.outcome is Outcome.REFUSED:
            log.warning("proposal for %s refused: %s", ctx.dfid, verdict.reason_code)
        await msg.ack_sync()  # only now: the kernel has recorded the proposal

    async def fetch(self, dfid: str, ref: str, start: int, length: int | None) -> ArtifactSlice:
        """Ask the kernel for a range of an artifact, signed with the agent's key.

        Raises:
            FetchRefused: the kernel refused it (it recorded why), or did not answer.
        """
        subject = artifact_subject(self.agent_id)
        body = msgspec.json.encode(FetchArtifact(dfid=dfid, ref=ref, start=start, length=length))
        headers = {}
        if self.key is not None:
            headers[SIGNATURE_HEADER] = fetch_signature(self.key, subject, body)
        try:
            reply = await self.nc.request(
                subject, body, timeout=FETCH_ARTIFACT_S, headers=headers or None
            )
            answer = FETCHED_DECODER.decode(reply.data)
        except (nats.errors.Error, TimeoutError, msgspec.DecodeError, msgspec.ValidationError):
            raise FetchRefused(
                ReasonCode.ARTIFACT_MISSING, "the kernel did not answer the fetch"
            ) from None
        if isinstance(answer, ArtifactRefused):
            raise FetchRefused(answer.reason_code, answer.detail, answer.field or "ref")
        return ArtifactSlice(
            ref=answer.ref,
            start=answer.start,
            data=answer.data,
            size=answer.size,
            media_type=answer.media_type,
        )

    async def _decide(self, ctx: WorkingContext, msg: Msg, progress_s: float) -> bytes:
        fetching = current_fetcher.set(self.fetch)
        try:
            return await self._decide_fetching(ctx, msg, progress_s)
        finally:
            current_fetcher.reset(fetching)

    async def _decide_fetching(self, ctx: WorkingContext, msg: Msg, progress_s: float) -> bytes:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_keep_alive, msg, progress_s)
            try:
                proposal: Proposal | None = await self.agent.decide(ctx)
                self.decided += 1
                body = proposal_body(proposal)
            except Exception as exc:  # the agent's failure ends its flow, not the host
                log.warning("agent %s failed on flow %s: %r", self.agent_id, ctx.dfid, exc)
                detail = f"{type(exc).__name__}: {exc}"
                body = proposal_body(None, (ReasonCode.AGENT_ERROR, detail))
            tg.cancel_scope.cancel()
        return body

    async def _recorded(self, subject: str) -> Verdict | None:
        try:
            raw = await self.js.get_last_msg(VERDICT_STREAM, subject, direct=True)
        except nats.js.errors.NotFoundError:
            return None
        return msgspec.json.decode(raw.data or b"", type=Verdict)

    async def _verdict(
        self, subject: str, answers: Any, msg: Msg, progress_s: float, fresh: bool
    ) -> Verdict:
        while True:
            if fresh:
                # Published after our subscription: it arrives on it (the stream keeps it too).
                try:
                    answer = await answers.next_msg(timeout=progress_s)
                    return msgspec.json.decode(answer.data, type=Verdict)
                except TimeoutError:  # nats.errors.TimeoutError, or asyncio's
                    await msg.in_progress()
                    fresh = False  # from now on, ask the stream too (a reconnect loses messages)
                continue
            # Published after our subscription, or before it (a duplicate proposal).
            verdict = await self._recorded(subject)
            if verdict is not None:
                return verdict
            try:
                await answers.next_msg(timeout=progress_s)
            except TimeoutError:  # nats.errors.TimeoutError, or asyncio's from a fetch
                await msg.in_progress()


async def _keep_alive(msg: Msg, every_s: float) -> None:
    """Tell JetStream the context is still being worked on (long LLM calls)."""
    while True:
        await anyio.sleep(every_s)
        await msg.in_progress()


async def serve(
    url: str,
    agents: Sequence[Agent],
    *,
    credentials: Mapping[str, str] | None = None,
    concurrency: int = 8,
    progress_s: float = 10.0,
    tls: ssl.SSLContext | None = None,
    ready: anyio.Event | None = None,
) -> None:
    """Host ``agents`` for the kernel at ``url`` until cancelled.

    Args:
        credentials: each agent's credential by id (default: from the environment).
        concurrency: contexts each agent decides at once in this process.
        progress_s: how often a long ``decide`` tells JetStream it is still at work.
        tls: the TLS context for the bus (trust its server's CA).
        ready: set once every agent has handshaken.

    Raises:
        HandshakeRefused: when the kernel refuses an agent's handshake.
    """
    hosted: list[_Hosted] = []
    try:
        for agent in agents:
            agent_id = agent.manifest.agent_id
            credential = (credentials or {}).get(agent_id) or credential_for(agent_id)
            key = agent_key(credential) if credential else None
            auth = BusAuth(key=key, inbox=agent_inbox(agent_id), tls=tls)
            nc = await connect(url, name=f"dirk-agent-{agent_id}", auth=auth)
            try:
                welcome = await handshake(nc, agent, credential)
            except BaseException:
                await nc.close()
                raise
            hosted.append(_Hosted(agent, nc, credential, welcome))

        def rejoin(h: _Hosted) -> Any:
            async def on_started(_: Msg) -> None:
                # The kernel restarted: its sessions ended; handshake again, keep working.
                try:
                    await handshake(h.nc, h.agent, h.credential)
                except (HandshakeRefused, nats.errors.Error) as exc:
                    log.warning("agent %s could not handshake again: %r", h.agent_id, exc)
                    return
                log.info("agent %s handshook again with a restarted kernel", h.agent_id)

            return on_started

        for h in hosted:
            await h.nc.subscribe(STARTED_SUBJECT, cb=rejoin(h))
        async with anyio.create_task_group() as tg:
            for host in hosted:
                for n in range(concurrency):
                    tg.start_soon(host.work, progress_s, name=f"{host.agent_id}:{n}")
            if ready is not None:
                ready.set()
    finally:
        with anyio.CancelScope(shield=True):
            for h in hosted:
                await h.nc.close()


def load(spec: str) -> Agent:
    """Instantiate ``module:AgentClass``."""
    module_name, _, name = spec.partition(":")
    cls = getattr(importlib.import_module(module_name), name)
    agent: Agent = cls()
    return agent


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents_sdk.serve", description=__doc__)
    parser.add_argument("--bus", default=os.environ.get("DIRK_BUS"), help="the NATS URL")
    parser.add_argument("--ca", default=os.environ.get("DIRK_BUS_CA"), help="the bus's CA file")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("agents", nargs="+", metavar="module:AgentClass")
    args = parser.parse_args(argv)
    if not args.bus:
        parser.error("--bus (or DIRK_BUS) names the kernel's NATS server")
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    agents = [load(spec) for spec in args.agents]
    tls = ssl.create_default_context(cafile=args.ca) if args.ca else None

    async def run() -> None:
        ready = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: serve(args.bus, agents, concurrency=args.concurrency, tls=tls, ready=ready)
            )
            await ready.wait()
            print("READY", flush=True)

    try:
        anyio.run(run)
    except HandshakeRefused as exc:
        print(f"error: {exc.reason_code}: {exc.detail}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        refused = [e for e in group.exceptions if isinstance(e, HandshakeRefused)]
        if refused:
            print(f"error: {refused[0].reason_code}: {refused[0].detail}", file=sys.stderr)
            return 1
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
