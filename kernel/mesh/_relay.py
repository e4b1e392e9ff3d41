"""The relay: every committed journal event, published for other services to react to.

Events go to the ``DIRK_EVENTS`` stream on ``dirk.evt.<type>.<dfid>`` (``_`` for
an event outside any flow) with ``Nats-Msg-Id = <journal_id>:<seq>``, in seq
order, each only once it is committed (the journal stays the record). The
relay's position (the last seq JetStream acknowledged) is kept per journal in
the ``DIRK_RELAY`` key-value bucket: a restarted relay resumes after it, and
what it publishes again between its last stored position and a crash is
dropped by JetStream's duplicate window on the same message id.
"""

from __future__ import annotations

import logging
import re

import anyio
import msgspec
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from nats.js.kv import KeyValue

from kernel.core.events import Event, event_type, is_derived
from kernel.journal.store import Journal

log = logging.getLogger("kernel.mesh")

EVENT_STREAM = "DIRK_EVENTS"
POSITION_BUCKET = "DIRK_RELAY"
_SUBJECT_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,128}")


def subject_of(event: Event) -> str:
    """The subject ``event`` is published on."""
    dfid = event.dfid if event.dfid and _SUBJECT_TOKEN.fullmatch(event.dfid) else "_"
    return f"dirk.evt.{event_type(event.payload)}.{dfid}"


class Relay:
    """Publishes a journal's committed events; :attr:`position` is the last one acknowledged."""

    def __init__(self, journal: Journal, js: JetStreamContext, retry_s: float) -> None:
        self.journal = journal
        self.js = js
        self.position = 0
        self._retry_s = retry_s
        self._moved = anyio.Event()
        self._key = re.sub(r"[^A-Za-z0-9_-]", "_", journal.journal_id)

    async def wait_for(self, seq: int) -> None:
        """Wait until the event ``seq`` (and every one before it) is published."""
        while self.position < seq:
            await self._moved.wait()

    async def _bucket(self) -> KeyValue:
        try:
            return await self.js.key_value(POSITION_BUCKET)
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError):
            return await self.js.create_key_value(bucket=POSITION_BUCKET, history=1)

    async def _start(self) -> KeyValue:
        """Make sure the stream and the position bucket exist; read the last position."""
        try:
            await self.js.add_stream(StreamConfig(name=EVENT_STREAM, subjects=["dirk.evt.>"]))
        except nats.js.errors.BadRequestError:
            pass  # exists
        bucket = await self._bucket()
        try:
            entry = await bucket.get(self._key)
            self.position = int(entry.value or b"0")
        except nats.js.errors.KeyNotFoundError:
            self.position = 0
        return bucket

    async def run(self) -> None:
        while True:
            # The server may be slow to answer (a timeout) or briefly away: the relay
            # waits and asks again, as it does for each publish, and never ends the mesh.
            try:
                bucket = await self._start()
                break
            except nats.errors.Error as exc:
                log.warning("relay: reading its position failed (%r); retrying", exc)
                await anyio.sleep(self._retry_s)
        journal_id = self.journal.journal_id
        async with self.journal.subscribe(self.position + 1) as batches:
            async for batch in batches:
                nth = 0
                for event in batch:
                    # A derived event shares its row's seq: an id of its own ("+" for the
                    # first a row stands for, "++" for the second), or the stream would
                    # drop it as a duplicate of that row.
                    nth = nth + 1 if is_derived(event) else 0
                    msg_id = f"{journal_id}:{event.seq}" + "+" * nth
                    headers = {"Nats-Msg-Id": msg_id}
                    body = msgspec.json.encode(event)
                    while True:
                        try:
                            await self.js.publish(subject_of(event), body, headers=headers)
                            break
                        except nats.errors.Error as exc:
                            log.warning("relay: publish failed (%r); retrying", exc)
                            await anyio.sleep(self._retry_s)
                self.position = batch[-1].seq
                while True:
                    try:
                        await bucket.put(self._key, str(self.position).encode())
                        break
                    except nats.errors.Error as exc:
                        log.warning("relay: storing the position failed (%r); retrying", exc)
                        await anyio.sleep(self._retry_s)
                self._moved.set()
                self._moved = anyio.Event()
