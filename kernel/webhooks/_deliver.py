"""Delivering notices to webhooks: signed, retried, recorded, never in the kernel's way.

Each configured :class:`Webhook` has its own bounded queue and its own worker: a slow or
failing receiver delays only its own notices. The kernel's actors never wait for a
webhook: notices come from a journal subscription (which never slows the writer), and a
notice that finds its queue full is dropped and recorded so (WebhookFailed, dropped).
Each delivery ends in one recorded event, WebhookDelivered or WebhookFailed, that names
the hook, never its URL or key.

A generic body is signed with the hook's secret: ``X-Dirk-Signature: t=<unix
seconds>,v1=<hex HMAC-SHA256 of "<t>." + body>``, so a receiver can check it came from
this kernel and refuse an old one replayed (:func:`verify`). ``X-Dirk-Delivery`` is the
notice's id: the same for each retry of one notice, for a receiver that dedupes.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import anyio
import msgspec
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from kernel.core.errors import KernelShutdown
from kernel.core.events import Draft, Event, Payload, WebhookDelivered, WebhookFailed
from kernel.core.ports import Clock
from kernel.core.wall import clip
from kernel.journal.store import Journal, JournalClosed, JournalWriteFailed
from kernel.state.approvals import ApprovalStatus
from kernel.state.projections import Projections
from kernel.webhooks._notices import (
    KINDS,
    Kind,
    Notice,
    generic_body,
    notice_of,
    reminder,
    slack_body,
)

log = logging.getLogger(__name__)

SIGNATURE = "X-Dirk-Signature"
DELIVERY = "X-Dirk-Delivery"


@dataclass(frozen=True)
class Webhook:
    """A place people are told about approvals: a URL, a key to sign with, what to send.

    Args:
        name: what the record calls it (never the URL: a Slack URL is itself a secret).
        url: ``https://...`` (or ``http://`` on a private network, as for a local receiver).
        secret: the HMAC key that signs each body (never recorded, logged or shown).
        style: ``json`` (every field) or ``slack`` (a Slack incoming webhook's body).
        notices: which kinds it gets: ``request``, ``reminder``, ``outcome``.
        remind_after_s: a reminder when an approval has waited this long (None: never)...
        remind_every_s: ... and again this often (None: once) ...
        max_reminders: ... at most this many times.
        max_attempts: tries per notice before WebhookFailed.
        backoff_s, max_backoff_s: the first wait between tries, doubled each time up to this.
        timeout_s: how long one read or write of a try may wait for the receiver.
        deadline_s: how long one whole try may take, connecting, sending and reading the
            answer (a receiver that answers later, or trickles its answer, has failed it).
        max_response_bytes: the most of an answer's body that is read; a receiver that
            answers with more has failed the try (only the status counts, but a receiver
            must not be able to grow the kernel's memory).
        queue: notices that may wait for this hook; more are dropped (and recorded so).
    """

    name: str
    url: str = field(repr=False)
    secret: str | bytes = field(default=b"", repr=False)
    style: Literal["json", "slack"] = "json"
    notices: tuple[Kind, ...] = KINDS
    remind_after_s: float | None = 900.0
    remind_every_s: float | None = 3600.0
    max_reminders: int = 3
    max_attempts: int = 5
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    timeout_s: float = 5.0
    deadline_s: float = 15.0
    max_response_bytes: int = 64 * 1024
    queue: int = 256

    def key(self) -> bytes:
        """The HMAC key as bytes."""
        return _key(self.secret)


def _key(secret: str | bytes) -> bytes:
    """The HMAC key: a configured ``str`` secret is its UTF-8 bytes, as the sender signs."""
    return secret.encode() if isinstance(secret, str) else bytes(secret)


def signature(secret: str | bytes, body: bytes, timestamp: int) -> str:
    """Return the ``X-Dirk-Signature`` value of ``body`` sent at ``timestamp`` (unix seconds).

    ``secret`` is the webhook's configured secret, as text or bytes.
    """
    mac = hmac.new(_key(secret), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(
    secret: str | bytes,
    body: bytes,
    header: str,
    *,
    now_s: float | None = None,
    tolerance_s: int = 300,
) -> bool:
    """Tell whether ``header`` signs ``body`` with ``secret``, sent within ``tolerance_s``.

    What a receiver calls on each request: a wrong key, an altered body, or a body
    replayed later than the tolerance is refused. ``secret`` is the webhook's
    configured secret as it is written in the configuration (text) or as bytes.
    """
    parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    now = time.time() if now_s is None else now_s
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = signature(secret, body, timestamp)
    return hmac.compare_digest(expected, header.strip())


def body_of(hook: Webhook, notice: Notice) -> bytes:
    """The bytes posted for ``notice`` to ``hook`` (sorted keys: the same notice, same bytes)."""
    document = slack_body(notice) if hook.style == "slack" else generic_body(notice, hook.name)
    return msgspec.json.encode(document, order="sorted")


class DeliveryFailed(Exception):
    """One try that did not deliver: a status that is not 2xx, a timeout, a refused connection."""


def post(hook: Webhook, body: bytes, delivery: str) -> int:
    """POST ``body`` to ``hook`` once; return the 2xx status (blocks: run it in a thread).

    The try is bounded twice: each socket read or write by ``hook.timeout_s``, the whole
    try by ``hook.deadline_s`` (a watchdog shuts the socket when it passes, which ends a
    read of a trickled answer); at most ``hook.max_response_bytes`` of the answer is read.

    Raises:
        DeliveryFailed: the receiver answered otherwise, too late, too much, or not at all.
    """
    url = urllib.parse.urlsplit(hook.url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise DeliveryFailed("the URL is not http(s)")
    connection_type = (
        http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    )
    # Real time, not the kernel's clock: a bound on a network try, it decides nothing.
    started = time.monotonic()
    connection = connection_type(
        url.hostname, url.port, timeout=max(0.001, min(hook.timeout_s, hook.deadline_s))
    )
    path = url.path or "/"
    if url.query:
        path += "?" + url.query
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "dirk-webhooks/1",
        DELIVERY: delivery,
        SIGNATURE: signature(hook.key(), body, int(time.time())),
    }
    status, answer = _exchange(connection, hook, started, path, body, headers)
    if len(answer) > hook.max_response_bytes:
        raise DeliveryFailed(f"an answer of more than {hook.max_response_bytes} bytes")
    if not 200 <= status < 300:
        raise DeliveryFailed(f"HTTP {status}")
    return status


def _exchange(
    connection: http.client.HTTPConnection,
    hook: Webhook,
    started: float,
    path: str,
    body: bytes,
    headers: dict[str, str],
) -> tuple[int, bytes]:
    """Connect, send, and read the status and at most the cap (plus one byte) of the answer.

    A watchdog shuts the socket at the hook's deadline, counted from ``started``.
    """
    late = f"no answer within the deadline ({hook.deadline_s:g} s)"
    expired = threading.Event()
    watchdog: threading.Timer | None = None
    response: http.client.HTTPResponse | None = None
    try:
        connection.connect()
        left = hook.deadline_s - (time.monotonic() - started)
        watchdog = threading.Timer(max(0.0, left), _cut, (connection, expired))
        watchdog.daemon = True
        watchdog.start()
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        answer = _read_capped(response, max(0, hook.max_response_bytes) + 1, expired)
    except (OSError, ValueError, http.client.HTTPException) as exc:
        # Never the URL: it may hold a token (Slack's do). Past the deadline it is late,
        # whichever came first: the watchdog's cut, or a socket timeout the deadline
        # shortened (under load the watchdog's thread may run after the read gave up).
        over = expired.is_set() or time.monotonic() - started >= hook.deadline_s
        raise DeliveryFailed(late if over else type(exc).__name__) from None
    finally:
        if watchdog is not None:
            watchdog.cancel()
        if response is not None:
            response.close()  # what was left unread of it, too
        connection.close()
    if expired.is_set():
        raise DeliveryFailed(late)
    return response.status, answer


def _read_capped(response: http.client.HTTPResponse, most: int, expired: threading.Event) -> bytes:
    """Read at most ``most`` bytes of an answer's body, a chunk at a time, until the deadline.

    One read at a time and a look at the deadline between them: a read of many bytes
    would wait for all of them, and a trickle sends them for ever.
    """
    answer = bytearray()
    while len(answer) < most and not expired.is_set():
        chunk = response.read1(min(16384, most - len(answer)))
        if not chunk:
            break
        answer += chunk
    return bytes(answer)


def _cut(connection: http.client.HTTPConnection, expired: threading.Event) -> None:
    """End a try at its deadline: shut its socket, so a blocked read or write returns."""
    expired.set()
    sock = connection.sock
    if sock is not None:
        try:
            # socket.socket's own shutdown, under TLS too: the other thread still uses the
            # SSL object, which SSLSocket.shutdown would take away from under it.
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass  # already closed: the try ended as the deadline came


Post = Callable[[Webhook, bytes, str], int]


async def deliver(hook: Webhook, notice: Notice, send: Post = post) -> Payload:
    """Deliver ``notice`` to ``hook``, retrying with backoff; return the event to record."""
    body = body_of(hook, notice)
    error = ""
    delay = hook.backoff_s
    attempts = max(1, hook.max_attempts)
    for attempt in range(1, attempts + 1):
        try:
            status = await anyio.to_thread.run_sync(
                send, hook, body, f"{hook.name}:{notice.id}", abandon_on_cancel=True
            )
        except DeliveryFailed as exc:
            error = str(exc)
        else:
            return WebhookDelivered(
                hook=hook.name,
                notice=notice.kind,
                about=notice.about,
                status=status,
                attempts=attempt,
                target=notice.target,
            )
        if attempt < attempts:
            # Real time, not the kernel's clock: a backoff toward a network, decides nothing.
            await anyio.sleep(delay)
            delay = min(hook.max_backoff_s, delay * 2)
    return WebhookFailed(
        hook=hook.name,
        notice=notice.kind,
        about=notice.about,
        error=clip(error, 200),
        attempts=attempts,
        target=notice.target,
    )


class Webhooks:
    """The webhooks of one kernel: follows the journal, reminds, delivers, records.

    Args:
        hooks: the configured webhooks.
        journal: the kernel's journal (followed, and where deliveries are recorded).
        projections: the kernel's projections (the approvals still pending, for reminders).
        clock: the kernel's clock: when an approval has waited long enough for a reminder.
        send: one try of a delivery (the HTTP POST; a test may wrap it).
    """

    def __init__(
        self,
        hooks: Sequence[Webhook],
        journal: Journal,
        projections: Projections,
        clock: Clock,
        send: Post = post,
    ) -> None:
        names = [h.name for h in hooks]
        if len(set(names)) != len(names) or not all(names):
            raise ValueError("each webhook needs a name of its own")
        self._hooks = tuple(hooks)
        self._journal = journal
        self._projections = projections
        self._clock = clock
        self._send = send
        self._queues: dict[str, MemoryObjectSendStream[Notice]] = {}
        self._reminded: dict[tuple[str, str], int] = {}

    async def run(self, from_seq: int) -> None:
        """Deliver notices of what commits from ``from_seq`` on, until the kernel stops."""
        try:
            await self._remember()
            async with anyio.create_task_group() as tg:
                for hook in self._hooks:
                    send, receive = anyio.create_memory_object_stream[Notice](hook.queue)
                    self._queues[hook.name] = send
                    tg.start_soon(self._worker, hook, receive, name=f"webhook:{hook.name}")
                tg.start_soon(self._follow, from_seq, name="webhooks:follow")
                if any(h.remind_after_s is not None for h in self._hooks):
                    tg.start_soon(self._remind, name="webhooks:remind")
        except (KernelShutdown, JournalClosed, JournalWriteFailed):
            return
        finally:
            # The queues' sending ends die with their workers; closed, not left to the GC.
            for queue in self._queues.values():
                queue.close()
            self._queues.clear()

    async def _remember(self) -> None:
        """Count the reminders recorded before a restart, so none is sent twice."""
        found = await self._journal.read(types=["WebhookDelivered", "WebhookFailed"])
        for event in found:
            p = event.payload
            if isinstance(p, WebhookDelivered | WebhookFailed) and p.notice == "reminder":
                key = (p.hook, p.target)
                self._reminded[key] = self._reminded.get(key, 0) + 1

    async def _follow(self, from_seq: int) -> None:
        async with self._journal.subscribe(from_seq) as batches:
            async for batch in batches:
                for event in batch:
                    notice = notice_of(event) if _told(event) else None
                    if notice is not None:
                        await self._offer(notice)

    async def _offer(self, notice: Notice) -> None:
        for hook in self._hooks:
            if notice.kind not in hook.notices:
                continue
            try:
                self._queues[hook.name].send_nowait(notice)
            except anyio.WouldBlock:
                dropped = WebhookFailed(
                    hook=hook.name,
                    notice=notice.kind,
                    about=notice.about,
                    error="the queue of notices is full",
                    target=notice.target,
                    attempts=0,
                    dropped=True,
                )
                await self._journal.append([Draft(payload=dropped)])

    async def _worker(self, hook: Webhook, notices: MemoryObjectReceiveStream[Notice]) -> None:
        async with notices:
            async for notice in notices:
                outcome = await deliver(hook, notice, self._send)
                if isinstance(outcome, WebhookFailed):
                    log.warning(
                        "webhook %s: %s not delivered: %s", hook.name, notice.id, outcome.error
                    )
                await self._journal.append([Draft(payload=outcome)])  # type: ignore[arg-type]

    async def _remind(self) -> None:
        tick = min(h.remind_after_s for h in self._hooks if h.remind_after_s is not None)
        while True:
            await self._clock.sleep(max(tick / 4, 0.001))
            now = self._clock.now_ns()
            for dfid in sorted(self._projections.waiting):
                approval = self._projections.approvals.get(dfid)
                if approval is None or approval.status is not ApprovalStatus.PENDING:
                    continue
                waited = now - approval.escalated_ts
                for hook in self._hooks:
                    due = _due(hook, waited)
                    sent = self._reminded.get((hook.name, dfid), 0)
                    if due > sent and "reminder" in hook.notices:
                        self._reminded[(hook.name, dfid)] = due
                        await self._offer_one(hook, reminder(approval, waited, due))

    async def _offer_one(self, hook: Webhook, notice: Notice) -> None:
        try:
            self._queues[hook.name].send_nowait(notice)
        except anyio.WouldBlock:
            pass  # the next tick offers it again: reminders are counted when sent


def _due(hook: Webhook, waited_ns: int) -> int:
    """How many reminders ``hook`` owes an approval that has waited ``waited_ns``."""
    if hook.remind_after_s is None or waited_ns < hook.remind_after_s * 1e9:
        return 0
    if hook.remind_every_s is None:
        return 1
    extra = (waited_ns - hook.remind_after_s * 1e9) // (hook.remind_every_s * 1e9)
    return min(hook.max_reminders, 1 + int(extra))


def _told(event: Event) -> bool:
    """Whether an event may make a notice (what webhooks themselves record makes none)."""
    return not isinstance(event.payload, WebhookDelivered | WebhookFailed)
