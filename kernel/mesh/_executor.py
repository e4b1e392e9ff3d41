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
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import anyio
import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

from kernel.adapters.contract import Adapter, AdapterError, Receipt
from kernel.core.events import ExecutionIntent
from kernel.mesh._bridge import RETRY_S

log = logging.getLogger("kernel.mesh")

INTENT_STREAM = "DIRK_INTENTS"
RESULT_STREAM = "DIRK_RESULTS"
FETCH_S = 5.0
"""How long one pull for an intent waits before it is asked again."""
PROGRESS_PER_ACK_WAIT = 4
"""In-progress acks an executor sends per ``ack_wait`` while it carries out an intent."""


class Result(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What an executor publishes for one intent: a receipt, or the adapter's error."""

    key: str
    receipt: Receipt | None = None
    error: str = ""
    transient: bool = False
    outcome_unknown: bool = False


def result_subject(key: str) -> str:
    """The subject of the result for intent ``key`` (hashed: a key may hold any character)."""
    return "dirk.results." + hashlib.sha256(key.encode()).hexdigest()[:40]


def _consumer(adapter: str) -> str:
    return f"exec-{adapter}"


async def _streams(js: JetStreamContext, adapter: str, ack_wait_s: float, max_deliver: int) -> None:
    streams = [
        StreamConfig(
            name=INTENT_STREAM, subjects=["dirk.intents.>"], retention=RetentionPolicy.WORK_QUEUE
        ),
        StreamConfig(name=RESULT_STREAM, subjects=["dirk.results.>"], max_msgs_per_subject=1),
    ]
    for config in streams:
        try:
            await js.add_stream(config)
        except nats.js.errors.BadRequestError:
            await js.update_stream(config)
    consumer = ConsumerConfig(
        durable_name=_consumer(adapter),
        filter_subject=f"dirk.intents.{adapter}",
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait_s,
        max_deliver=max_deliver,
    )
    await js.add_consumer(INTENT_STREAM, consumer)


async def _recorded(js: JetStreamContext, key: str) -> Result | None:
    try:
        raw = await js.get_last_msg(RESULT_STREAM, result_subject(key))
    except nats.js.errors.NotFoundError:
        return None
    return msgspec.json.decode(raw.data or b"", type=Result)


class RemoteAdapter:
    """An adapter whose effects an executor process carries out over the bus.

    Args:
        url: the NATS server.
        name: the adapter's name (its queue is ``dirk.intents.<name>``).
        result_timeout_s: how long one call waits for its result before the outcome
            counts as unknown (the engine then retries with the same key).
        ack_wait_s: how long an executor may hold an intent without an in-progress ack
            before it is redelivered; also how often a call waiting for its result
            reads the result stream (a notification lost in a reconnect).
        max_deliver: how often one intent is delivered at most.
    """

    def __init__(
        self,
        url: str,
        name: str,
        *,
        result_timeout_s: float = 30.0,
        ack_wait_s: float = 30.0,
        max_deliver: int = 10,
    ) -> None:
        self.url = url
        self.name = name
        self.result_timeout_s = result_timeout_s
        self.ack_wait_s = ack_wait_s
        self.max_deliver = max_deliver
        self._nc: Client | None = None
        self._lock = anyio.Lock()

    async def _js(self) -> JetStreamContext:
        async with self._lock:
            if self._nc is None or self._nc.is_closed:
                nc = await nats.connect(self.url, name=f"dirk-adapter-{self.name}")
                js = nc.jetstream()
                await _streams(js, self.name, self.ack_wait_s, self.max_deliver)
                self._nc = nc
            return self._nc.jetstream()

    async def close(self) -> None:
        """Close the connection (the kernel's owner calls this after the kernel closed)."""
        if self._nc is not None:
            await self._nc.close()

    async def _answer(self, js: JetStreamContext, key: str, answers: Subscription) -> Result:
        """Wait for the result of ``key``: it arrives on ``answers``, or is in the stream.

        The result is taken from the message itself: the stream may store it a moment
        after its subscribers got it. Every ``ack_wait_s`` without one, the stream is
        read too (a notification lost in a reconnect costs one ``ack_wait``, not the
        whole ``result_timeout_s``).
        """
        while True:
            try:
                answer = await answers.next_msg(timeout=self.ack_wait_s)
            except TimeoutError:  # nats.errors.TimeoutError, or asyncio's
                recorded = await _recorded(js, key)
                if recorded is not None:
                    return recorded
                continue
            try:
                result = msgspec.json.decode(answer.data, type=Result)
            except msgspec.DecodeError:
                continue  # not a result (anyone may publish here): wait on
            if result.key == key:
                return result

    async def execute(self, intent: ExecutionIntent) -> Receipt:
        """Publish ``intent`` to the executors and return the receipt one of them publishes."""
        try:
            js = await self._js()
            assert self._nc is not None
            answers = await self._nc.subscribe(result_subject(intent.key))
            try:
                result = await _recorded(js, intent.key)
                if result is None:
                    headers = {"Nats-Msg-Id": intent.key[:200]}
                    body = msgspec.json.encode(intent)
                    await js.publish(f"dirk.intents.{self.name}", body, headers=headers)
                    with anyio.move_on_after(self.result_timeout_s):
                        result = await self._answer(js, intent.key, answers)
            finally:
                await answers.unsubscribe()
        except nats.errors.Error as exc:
            raise AdapterError(f"the bus failed: {exc!r}", transient=True) from exc
        if result is None:
            raise AdapterError("no executor answered in time", transient=True)
        if result.receipt is None:
            raise AdapterError(
                result.error or "the executor failed",
                transient=result.transient,
                outcome_unknown=result.outcome_unknown,
            )
        return result.receipt


async def serve_executor(
    url: str,
    name: str,
    adapter: Adapter,
    *,
    ack_wait_s: float = 30.0,
    max_deliver: int = 10,
    ready: anyio.Event | None = None,
) -> None:
    """Carry out the intents of adapter ``name`` with ``adapter`` until cancelled.

    While an intent is carried out the executor tells JetStream so (an in-progress
    ack every ``ack_wait_s / PROGRESS_PER_ACK_WAIT``): an adapter slower than
    ``ack_wait_s`` keeps its intent, which is neither handed to a second executor
    meanwhile nor spends ``max_deliver``. Only an executor that dies, or loses the
    bus, gives its intent back.
    """
    nc = await nats.connect(url, name=f"dirk-executor-{name}", max_reconnect_attempts=-1)
    try:
        js = nc.jetstream()
        await _streams(js, name, ack_wait_s, max_deliver)
        sub = await js.pull_subscribe_bind(durable=_consumer(name), stream=INTENT_STREAM)
        if ready is not None:
            ready.set()
        progress_s = ack_wait_s / PROGRESS_PER_ACK_WAIT
        while True:
            try:
                [msg] = await sub.fetch(1, timeout=FETCH_S)
            except TimeoutError:  # nats.errors.TimeoutError, or asyncio's from a fetch
                continue
            except nats.errors.Error as exc:  # reconnecting: the next fetch resumes
                log.warning("fetching intents failed (%r); retrying", exc)
                await anyio.sleep(RETRY_S)
                continue
            try:
                await _carry_out(js, adapter, msg, progress_s)
            except nats.errors.Error as exc:
                # Unacked: the intent comes back after ack_wait (to this executor or
                # another), and a result that was stored answers it without a second call.
                log.warning("intent not finished (%r); it will be redelivered", exc)
    finally:
        with anyio.CancelScope(shield=True):  # cancelled is how it ends: close all the same
            await nc.close()


async def _carry_out(js: JetStreamContext, adapter: Adapter, msg: Msg, progress_s: float) -> None:
    """Carry out one delivered intent: its stored result, or the adapter's; then ack."""
    try:
        intent = msgspec.json.decode(msg.data, type=ExecutionIntent)
    except msgspec.DecodeError:
        log.warning("not an intent on %s; terminated", msg.subject)
        await msg.term()  # never deliver it again
        return
    log.info("intent %s delivery %d", intent.key, msg.metadata.num_delivered)
    failure: nats.errors.Error | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_keep_alive, msg, progress_s)
        try:
            result = await _recorded(js, intent.key)
            if result is None:
                result = await _run(adapter, intent)
                headers = {"Nats-Msg-Id": f"result:{intent.key}"[:200]}
                await js.publish(
                    result_subject(intent.key), msgspec.json.encode(result), headers=headers
                )
        except nats.errors.Error as exc:
            failure = exc  # raised outside the task group, as itself
        tg.cancel_scope.cancel()
    if failure is not None:
        raise failure
    await msg.ack_sync()  # only once the result is stored
    log.info("intent %s done", intent.key)


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
