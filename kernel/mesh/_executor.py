"""Remote executors: an adapter that is a service on the bus.

The kernel side is :class:`RemoteAdapter`, an ordinary adapter: the engine has
already committed the intent's start (record first) when it calls
``execute``, which publishes the intent on the work queue
``dirk.intents.<adapter>`` (``DIRK_INTENTS``, ``Nats-Msg-Id`` = the intent's
key) and waits for its result on ``DIRK_RESULTS``; the engine then records it
exactly as a local adapter's. No result in time is a transient error whose
outcome is unknown: the engine retries with the same key, and a result that
arrived meanwhile answers the retry.

The executor side is :func:`serve_executor` (``python -m kernel.mesh.executor
--bus URL --adapter NAME module:factory``): it takes intents from the adapter's
queue, runs them against the outside world with the real adapter, publishes
each result under the intent's key and only then acks. While the adapter runs,
the executor sends in-progress acks, so a slow adapter keeps its intent: it is
neither redelivered to a second executor meanwhile nor spends ``max_deliver``.
A failure of the bus leaves the intent unacked and the executor goes on. An
executor killed after the effect and before its result gets the intent again
(it, or another): the real adapter must deduplicate on ``intent.key``, as
every adapter must, so the effect happens once.

Results are signed. Each adapter's executors are provisioned with one Ed25519 key
(kernel.core.keys, ``--key``); the kernel's ``RemoteAdapter`` is given its public half
(``executor_key``) and takes only a result with that key's signature (``Dirk-Sig``) of
the adapter, the intent key and the result: whatever else arrives on the result subject,
or is stored there, is refused and recorded (``InputRefused``, entry ``bus.result``),
never taken as the outcome. An executor reading a stored result checks it the same way
and carries the intent out itself if it does not verify. The receipt the engine records
keeps the public key and the signature (``detail["dirk.executor"]``), so anyone can check
a recorded success later (:func:`recorded_result_holds`). The kernel creates the streams
and the consumer; an executor only binds to it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
import nats
import nats.errors
import nats.js.errors
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

from kernel.adapters.contract import Adapter, AdapterError, Receipt
from kernel.core import keys
from kernel.core.events import ExecutionIntent, ExecutionSucceeded, canonical
from kernel.core.reasons import ReasonCode
from kernel.mesh._protocol import SIGNATURE_HEADER, safe_token
from kernel.mesh._wire import (
    RETRY_S,
    BusAuth,
    GuardedClient,
    connect,
    ensure_stream,
    executor_inbox,
    kernel_auth,
    printable,
)

log = logging.getLogger("kernel.mesh")

INTENT_STREAM = "DIRK_INTENTS"
RESULT_STREAM = "DIRK_RESULTS"
RESULT_CONTEXT = "dirk.executor.result"
"""What an executor's signature is for (kernel.core.keys keeps purposes apart)."""
PROOF_DETAIL = "dirk.executor"
"""The receipt detail entry that keeps the executor's public key and signature."""
FETCH_S = 5.0
"""How long one pull for an intent waits before it is asked again."""
PROGRESS_PER_ACK_WAIT = 4
"""In-progress acks an executor sends per ``ack_wait`` while it carries out an intent."""
MAX_RESULT = 1 << 20

Signed = tuple["Result", str]
"""A result and the signature that made it genuine."""
Refusal = Callable[[str, str, str, str, ReasonCode], Awaitable[None]]
"""Records a refused bus message: (entry, field, detail, target, reason code)."""


class Result(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What an executor publishes for one intent: a receipt, or the adapter's error."""

    key: str
    receipt: Receipt | None = None
    error: str = ""
    transient: bool = False
    outcome_unknown: bool = False


def result_subject(adapter: str, key: str) -> str:
    """The subject of the result for intent ``key`` (hashed: a key may hold any character)."""
    return f"dirk.results.{adapter}." + hashlib.sha256(key.encode()).hexdigest()[:40]


def _signed_bytes(adapter: str, result: Result) -> bytes:
    return canonical({"adapter": adapter, "result": msgspec.to_builtins(result)})


def sign_result(key: Ed25519PrivateKey, adapter: str, result: Result) -> str:
    """Return the executor's signature of ``result`` for ``adapter`` (its ``Dirk-Sig``)."""
    return keys.sign(key, RESULT_CONTEXT, _signed_bytes(adapter, result))


def result_holds(public: str, adapter: str, result: Result, signature: object) -> bool:
    """Whether ``signature`` is ``public``'s signature of ``result`` for ``adapter``.

    Never raises: a malformed result, key or signature does not verify.
    """
    if not isinstance(signature, str):
        return False
    try:
        signed = _signed_bytes(adapter, result)
    except (TypeError, ValueError, UnicodeEncodeError):
        return False
    return keys.verify(public, RESULT_CONTEXT, signed, signature)


def recorded_result_holds(event: ExecutionSucceeded, adapter: str, public: str) -> bool:
    """Whether a recorded success carries ``public``'s signature of what it records."""
    detail = dict(event.detail)
    proof = detail.pop(PROOF_DETAIL, None)
    if not isinstance(proof, dict) or proof.get("key") != public:
        return False
    result = Result(key=event.key, receipt=Receipt(external_id=event.external_id, detail=detail))
    return result_holds(public, adapter, result, proof.get("signature"))


def _consumer(adapter: str) -> str:
    return f"exec-{adapter}"


async def _streams(js: JetStreamContext, adapter: str, ack_wait_s: float, max_deliver: int) -> None:
    """Create the executors' streams and ``adapter``'s consumer (the kernel's job)."""
    streams = [
        StreamConfig(
            name=INTENT_STREAM, subjects=["dirk.intents.>"], retention=RetentionPolicy.WORK_QUEUE
        ),
        StreamConfig(
            name=RESULT_STREAM,
            subjects=["dirk.results.>"],
            max_msgs_per_subject=1,
            allow_direct=True,  # an executor reads its own adapter's results by subject
        ),
    ]
    for config in streams:
        await ensure_stream(js, config)
    consumer = ConsumerConfig(
        durable_name=_consumer(adapter),
        filter_subject=f"dirk.intents.{adapter}",
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait_s,
        max_deliver=max_deliver,
    )
    await js.add_consumer(INTENT_STREAM, consumer)


def _decode(data: bytes | None) -> Result | None:
    if data is None or len(data) > MAX_RESULT:
        return None
    try:
        return msgspec.json.decode(data, type=Result)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


async def _stored(js: JetStreamContext, adapter: str, key: str) -> tuple[Result | None, str]:
    """The result stored for ``key`` and its signature, if any (not yet checked)."""
    try:
        raw = await js.get_last_msg(RESULT_STREAM, result_subject(adapter, key), direct=True)
    except nats.js.errors.NotFoundError:
        return None, ""
    signature = (raw.headers or {}).get(SIGNATURE_HEADER, "")
    return _decode(raw.data), signature if isinstance(signature, str) else ""


class RemoteAdapter:
    """An adapter whose effects an executor process carries out over the bus.

    Args:
        url: the NATS server.
        name: the adapter's name (its queue is ``dirk.intents.<name>``).
        executor_key: the public key (``ed25519:...``) its executors sign results with;
            a result without that signature is refused.
        auth: the kernel's principal on the bus (default: ``DIRK_BUS_KEY``, ``DIRK_BUS_CA``).
        result_timeout_s: how long one call waits for its result before the outcome
            counts as unknown (the engine then retries with the same key).
        ack_wait_s: how long an executor may hold an intent without an in-progress ack
            before it is redelivered; also how often a call waiting for its result
            reads the result stream (a notification lost in a reconnect).
        max_deliver: how often one intent is delivered at most.

    Raises:
        KeyUnusable: ``executor_key`` is not a public key.
        ValueError: ``name`` cannot stand in a subject.
    """

    def __init__(
        self,
        url: str,
        name: str,
        *,
        executor_key: str,
        auth: BusAuth | None = None,
        result_timeout_s: float = 30.0,
        ack_wait_s: float = 30.0,
        max_deliver: int = 10,
    ) -> None:
        if not safe_token(name):
            raise ValueError(f"adapter {name!r}: a name on the bus is 1-128 of A-Z a-z 0-9 _ -")
        keys.parse_public(executor_key)
        self.url = url
        self.name = name
        self.executor_key = executor_key
        self.auth = auth
        self.result_timeout_s = result_timeout_s
        self.ack_wait_s = ack_wait_s
        self.max_deliver = max_deliver
        self.on_refused: Refusal | None = None
        """Where refused results are recorded (kernel.mesh.open_mesh sets it)."""
        self.refused = 0
        """Results refused since the adapter was made."""
        self._nc: GuardedClient | None = None
        self._lock = anyio.Lock()

    async def _js(self) -> JetStreamContext:
        async with self._lock:
            if self._nc is None or self._nc.is_closed:
                auth = self.auth or kernel_auth()
                nc = await connect(self.url, name=f"dirk-adapter-{self.name}", auth=auth)
                await _streams(nc.jetstream(), self.name, self.ack_wait_s, self.max_deliver)
                self._nc = nc
            return self._nc.jetstream()

    async def connect(self) -> None:
        """Connect and create the streams and the executors' consumer now, not at the first call."""
        await self._js()

    async def close(self) -> None:
        """Close the connection (the kernel's owner calls this after the kernel closed)."""
        if self._nc is not None:
            await self._nc.close()

    async def _refuse(self, key: str, detail: str) -> None:
        self.refused += 1
        log.warning("adapter %s: refused a result for %s: %s", self.name, key, detail)
        if self.on_refused is not None:
            target = f"{self.name}:{printable(key, 200)}"
            await self.on_refused("bus.result", "Dirk-Sig", detail, target, ReasonCode.UNAUTHORIZED)

    async def _genuine(
        self, key: str, result: Result | None, signature: str, where: str
    ) -> Signed | None:
        """Return ``result`` if its executors signed it for ``key``; else refuse it, on record."""
        if result is None:
            await self._refuse(key, f"{where}: not a result")
            return None
        if result.key != key:
            await self._refuse(key, f"{where}: the result of another intent")
            return None
        if not result_holds(self.executor_key, self.name, result, signature):
            await self._refuse(key, f"{where}: not signed by the executors' key")
            return None
        return result, signature

    async def _recorded(self, js: JetStreamContext, key: str) -> Signed | None:
        result, signature = await _stored(js, self.name, key)
        if result is None and not signature:
            return None
        return await self._genuine(key, result, signature, "stored")

    async def _answer(self, js: JetStreamContext, key: str, answers: Subscription) -> Signed:
        """Wait for the genuine result of ``key``: it arrives on ``answers``, or is in the stream.

        The result is taken from the message itself: the stream may store it a moment
        after its subscribers got it. Every ``ack_wait_s`` without one, the stream is
        read too (a notification lost in a reconnect costs one ``ack_wait``, not the
        whole ``result_timeout_s``). A message that is not the executors' signed result
        is refused, recorded, and waited past.
        """
        while True:
            try:
                answer = await answers.next_msg(timeout=self.ack_wait_s)
            except TimeoutError:  # nats.errors.TimeoutError, or asyncio's
                recorded = await self._recorded(js, key)
                if recorded is not None:
                    return recorded
                continue
            signature = (answer.headers or {}).get(SIGNATURE_HEADER, "")
            genuine = await self._genuine(key, _decode(answer.data), signature, "published")
            if genuine is not None:
                return genuine

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        """Publish ``intent`` to the executors and return the receipt one of them signed."""
        signed: Signed | None = None
        try:
            js = await self._js()
            assert self._nc is not None
            answers = await self._nc.subscribe(result_subject(self.name, intent.key))
            try:
                signed = await self._recorded(js, intent.key)
                if signed is None:
                    headers = {"Nats-Msg-Id": intent.key[:200]}
                    body = msgspec.json.encode(intent)
                    await js.publish(f"dirk.intents.{self.name}", body, headers=headers)
                    with anyio.move_on_after(self.result_timeout_s):
                        signed = await self._answer(js, intent.key, answers)
            finally:
                await answers.unsubscribe()
        except nats.errors.Error as exc:
            raise AdapterError(f"the bus failed: {exc!r}", transient=True) from exc
        if signed is None:
            raise AdapterError("no executor answered in time", transient=True)
        result, signature = signed
        if result.receipt is None:
            raise AdapterError(
                result.error or "the executor failed",
                transient=result.transient,
                outcome_unknown=result.outcome_unknown,
            )
        # The record keeps the proof: anyone with the public key can check it later.
        proof = {"key": self.executor_key, "signature": signature}
        detail = {**result.receipt.detail, PROOF_DETAIL: proof}
        return Receipt(external_id=result.receipt.external_id, detail=detail)


async def serve_executor(
    url: str,
    name: str,
    adapter: Adapter,
    *,
    key: Ed25519PrivateKey,
    tls: Any = None,
    ack_wait_s: float = 30.0,
    ready: anyio.Event | None = None,
) -> None:
    """Carry out the intents of adapter ``name`` with ``adapter`` until cancelled.

    ``key`` is the executors' key: the bus knows it as this adapter's executor (its
    nkey), and every result is signed with it. The kernel creates the streams and the
    consumer; the executor binds to it and waits until it exists.

    While an intent is carried out the executor tells JetStream so (an in-progress
    ack every ``ack_wait_s / PROGRESS_PER_ACK_WAIT``): an adapter slower than
    ``ack_wait_s`` keeps its intent, which is neither handed to a second executor
    meanwhile nor spends ``max_deliver``. Only an executor that dies, or loses the
    bus, gives its intent back.
    """
    auth = BusAuth(key=key, inbox=executor_inbox(name), tls=tls)
    nc = await connect(url, name=f"dirk-executor-{name}", auth=auth)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe_bind(durable=_consumer(name), stream=INTENT_STREAM)
        if ready is not None:
            ready.set()
        progress_s = ack_wait_s / PROGRESS_PER_ACK_WAIT
        public = keys.public_text(key)
        while True:
            try:
                [msg] = await sub.fetch(1, timeout=FETCH_S)
            except TimeoutError:  # nats.errors.TimeoutError, or asyncio's from a fetch
                continue
            except nats.errors.Error as exc:  # reconnecting, or no consumer yet: ask again
                log.warning("fetching intents failed (%r); retrying", exc)
                await anyio.sleep(RETRY_S)
                continue
            try:
                await _carry_out(js, name, key, public, adapter, msg, progress_s)
            except nats.errors.Error as exc:
                # Unacked: the intent comes back after ack_wait (to this executor or
                # another), and a result that was stored answers it without a second call.
                log.warning("intent not finished (%r); it will be redelivered", exc)
    finally:
        with anyio.CancelScope(shield=True):  # cancelled is how it ends: close all the same
            await nc.close()


async def _carry_out(
    js: JetStreamContext,
    name: str,
    key: Ed25519PrivateKey,
    public: str,
    adapter: Adapter,
    msg: Msg,
    progress_s: float,
) -> None:
    """Carry out one delivered intent: its stored result, or the adapter's; then ack."""
    try:
        intent = msgspec.json.decode(msg.data, type=ExecutionIntent)
    except (msgspec.DecodeError, msgspec.ValidationError):
        log.warning("not an intent on %s; terminated", msg.subject)
        await msg.term()  # never deliver it again
        return
    log.info("intent %s delivery %d", printable(intent.key, 200), msg.metadata.num_delivered)
    failure: nats.errors.Error | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_keep_alive, msg, progress_s)
        try:
            stored, signature = await _stored(js, name, intent.key)
            genuine = (
                stored is not None
                and stored.key == intent.key
                and result_holds(public, name, stored, signature)
            )
            if not genuine and (stored is not None or signature):
                # Not ours: whatever is stored there does not answer the intent.
                log.warning("intent %s: a stored result not signed by us; ignored", intent.key)
            if not genuine:
                result = _encodable(await _run(adapter, intent))
                headers = {
                    "Nats-Msg-Id": f"result:{intent.key}"[:200],
                    SIGNATURE_HEADER: sign_result(key, name, result),
                }
                await js.publish(
                    result_subject(name, intent.key), msgspec.json.encode(result), headers=headers
                )
        except nats.errors.Error as exc:
            failure = exc  # raised outside the task group, as itself
        tg.cancel_scope.cancel()
    if failure is not None:
        raise failure
    await msg.ack_sync()  # only once the result is stored
    log.info("intent %s done", printable(intent.key, 200))


def _encodable(result: Result) -> Result:
    """The result as it can be published and signed (a receipt's odd detail is noted, not sent)."""
    try:
        canonical(msgspec.to_builtins(result))
    except (TypeError, ValueError, UnicodeEncodeError, msgspec.EncodeError) as exc:
        if result.receipt is None:
            return Result(
                key=result.key,
                error=printable(result.error, 500),
                transient=True,
                outcome_unknown=True,
            )
        note = {"unrecordable": printable(f"{type(exc).__name__}: {exc}", 300)}
        receipt = Receipt(external_id=printable(result.receipt.external_id, 256), detail=note)
        return Result(key=result.key, receipt=receipt)
    return result


async def _keep_alive(msg: Msg, every_s: float) -> None:
    """Tell JetStream the intent is still being carried out (a slow adapter keeps it)."""
    while True:
        await anyio.sleep(every_s)
        try:
            await msg.in_progress()
        except nats.errors.Error as exc:  # reconnecting: the next one may pass
            log.warning("in-progress ack failed (%r)", exc)


async def _run(adapter: Adapter, intent: ExecutionIntent) -> Result:
    try:
        receipt = await adapter.execute(intent)
    except AdapterError as exc:
        return Result(
            key=intent.key,
            error=str(exc)[:500],
            transient=exc.transient,
            outcome_unknown=exc.outcome_unknown,
        )
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"[:500]
        return Result(key=intent.key, error=detail, transient=True, outcome_unknown=True)
    return Result(key=intent.key, receipt=receipt)


def _load(spec: str) -> Any:
    import importlib

    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)()
