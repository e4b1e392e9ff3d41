"""Who is on the bus, and a client no message can stop.

Every principal on the bus (the kernel, the hosts of one agent, the executors of one
adapter, a reader of the relay) is one Ed25519 key (kernel.core.keys). Its NATS
identity is the same key written as an *nkey*: the server's config holds only the
public half (``U...``), and the client signs the server's per-connection nonce, so the
secret never leaves its host (a password would cross the wire in clear). An agent's
key is seeded by its credential (kernel.registry.agent_key), so the public key the
journal records for the agent (``CredentialIssued``) is also its NATS user:
:mod:`kernel.mesh._config` writes the server's config from it.

Each principal gets its own reply inbox, ``_INBOX.<role>[.<name>]``, that only it may
read (the server's subscribe permissions): request replies never cross the bus
readable to others.

:class:`GuardedClient` is nats.py's client with two changes. It signs with the key
above (no PyNaCl needed), and it drops a message that nats.py cannot build (a
subject, reply subject or header status line that is not UTF-8 ends nats.py 2.16's
read loop for good while the connection still reports itself connected), and a
stored message carrying a forged status line; a stored one is terminated, so it is
not delivered again. The kernel hears of each drop and records it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import os
import ssl
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
import nats.errors
import nats.js.errors
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StreamConfig

from kernel.core import keys
from kernel.core.wall import MAX_DETAIL, clip

log = logging.getLogger("kernel.mesh")

KERNEL_INBOX = "_INBOX.kernel"
CONNECT_ATTEMPTS = 3
"""Tries of the first connection: a refused credential is an error, never an endless retry
(nats.py retries for ever with ``max_reconnect_attempts=-1``); reconnects are endless."""

RECONNECT_WAIT_S = 2.0
"""The pause between reconnects after the first connection (nats.py's default)."""

RETRY_S = 0.25
"""The pause before a publish or fetch is tried again while the client reconnects."""

_PREFIX_SEED = 18 << 3
_PREFIX_USER = 20 << 3
_HDR_LINE = len(b"NATS/1.0")
_STATUS_SPACE = 0x20


def printable(text: object, limit: int = MAX_DETAIL) -> str:
    """Return ``text`` as text the journal can always hold: valid UTF-8, clipped."""
    shown = text if isinstance(text, str) else repr(text)
    return clip(shown.encode("utf-8", "backslashreplace").decode("utf-8"), limit)


async def ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    """Create the stream, or bring an existing one to ``config``."""
    try:
        await js.add_stream(config)
    except nats.js.errors.BadRequestError:
        await js.update_stream(config)


def agent_inbox(agent_id: str) -> str:
    """The reply inbox only the hosts of ``agent_id`` may read."""
    return f"_INBOX.agent.{agent_id}"


def executor_inbox(adapter: str) -> str:
    """The reply inbox only the executors of ``adapter`` may read."""
    return f"_INBOX.exec.{adapter}"


def reader_inbox(name: str) -> str:
    """The reply inbox only the relay reader ``name`` may read."""
    return f"_INBOX.reader.{name}"


# --- nkeys: an Ed25519 key as NATS writes it ------------------------------------


def _crc16(data: bytes) -> int:
    # CRC-16/XMODEM, as the nkeys format uses.
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _b32(raw: bytes) -> str:
    return base64.b32encode(raw + _crc16(raw).to_bytes(2, "little")).decode().rstrip("=")


def nkey_public(public: str) -> str:
    """Return the NATS nkey user (``U...``) of a public key written ``ed25519:...``.

    Raises:
        KeyUnusable: ``public`` is not a public key.
    """
    raw = keys.parse_public(public).public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return _b32(bytes([_PREFIX_USER]) + raw)


def nkey_seed(key: Ed25519PrivateKey) -> str:
    """Return the key as an nkey seed (``SU...``), for other NATS tools; keep it secret."""
    raw = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    head = bytes([_PREFIX_SEED | (_PREFIX_USER >> 5), (_PREFIX_USER & 31) << 3])
    return _b32(head + raw)


def _key_of_seed(seed: str) -> Ed25519PrivateKey:
    text = seed.strip()
    try:
        raw = base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError):
        raise keys.KeyUnusable("not an nkey seed") from None
    body, crc = raw[:-2], raw[-2:]
    if len(body) != 34 or _crc16(body).to_bytes(2, "little") != crc:
        raise keys.KeyUnusable("not an nkey seed (length or checksum)")
    return Ed25519PrivateKey.from_private_bytes(body[2:])


# --- the principal of one connection ---------------------------------------------


class BusAuth(msgspec.Struct, frozen=True, kw_only=True):
    """Who one connection to the bus is, and how its traffic is protected.

    Attributes:
        key: the principal's key; None connects without a NATS identity (a server
            without users only).
        inbox: the reply inbox prefix only this principal may read.
        tls: the TLS context (trust the server's CA); a ``tls://`` URL without one
            uses the system's CAs.
    """

    key: Ed25519PrivateKey | None = None
    inbox: str = KERNEL_INBOX
    tls: ssl.SSLContext | None = None


def tls_from_env(env: dict[str, str] | None = None) -> ssl.SSLContext | None:
    """Return a context trusting the CA file ``DIRK_BUS_CA`` names, or None."""
    ca = (env if env is not None else os.environ).get("DIRK_BUS_CA")
    return ssl.create_default_context(cafile=ca) if ca else None


def kernel_auth(
    key_file: str | None = None, tls: ssl.SSLContext | None = None, inbox: str = KERNEL_INBOX
) -> BusAuth:
    """Return the kernel's identity: its key file (``DIRK_BUS_KEY``) and TLS (``DIRK_BUS_CA``).

    Raises:
        KeyUnusable: the key file cannot be used (missing, readable by others, not Ed25519).
    """
    from pathlib import Path

    path = key_file or os.environ.get("DIRK_BUS_KEY")
    key = keys.load_private_key(Path(path)) if path else None
    return BusAuth(key=key, inbox=inbox, tls=tls or tls_from_env())


Dropped = Callable[[str, str], None]
"""Told of each message the client dropped: (its subject as text, why)."""


class GuardedClient(Client):
    """nats.py's client, signing with a dirk key and dropping messages it cannot build."""

    def __init__(self, key: Ed25519PrivateKey | None = None) -> None:
        super().__init__()
        self._dirk_key = key
        self.on_dropped: Dropped | None = None
        self.dropped = 0
        """Messages dropped since the client was made."""
        self.violations: list[str] = []
        """The server's permission refusals this client was told of (the last 100)."""
        self.refusals = 0
        """Permission refusals in all."""
        self._told = asyncio.Event()

    def note_violation(self, text: str) -> None:
        """Keep a permission refusal the server sent (nats.py's ``error_cb`` calls this)."""
        self.violations = [*self.violations[-99:], text]
        self.refusals += 1
        self._told.set()

    async def wait_violations(self, count: int) -> list[str]:
        """Wait until the server refused this client ``count`` times in all; return them."""
        while self.refusals < count:
            self._told.clear()
            await self._told.wait()
        return list(self.violations)

    def _setup_nkeys_connect(self) -> None:
        # Sign the server's nonce with our own key: the nkey format is just its encoding.
        key = self._dirk_key or _key_of_seed(self._nkeys_seed_str or "")
        self._public_nkey = nkey_public(keys.public_text(key))

        def sign(nonce: str) -> bytes:
            return base64.b64encode(key.sign(nonce.encode()))

        self._signature_cb = sign

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes
    ) -> None:
        problem = _problem(subject, reply, headers)
        if problem is None:
            try:
                await super()._process_msg(sid, subject, reply, data, headers)
                return
            except Exception as exc:  # whatever a message makes nats.py raise ends its read loop
                problem = f"nats.py could not take it ({type(exc).__name__})"
        self.dropped += 1
        shown = subject.decode("utf-8", "backslashreplace")[:200]
        log.warning("bus: dropped a message on %r: %s", shown, problem)
        if reply.startswith(b"$JS.ACK.") and reply.isascii():
            # A stored message comes back until max_deliver: end it (the ack subject is the
            # server's own, so it is safe to use).
            with contextlib.suppress(nats.errors.Error):
                await self.publish(reply.decode("ascii"), b"+TERM")
        if self.on_dropped is not None:
            self.on_dropped(shown, problem)


async def _abandon(nc: GuardedClient) -> None:
    transport = getattr(nc, "_transport", None)
    with contextlib.suppress(Exception):
        await nc.close()
    if transport is not None:
        with contextlib.suppress(Exception):
            transport.close()
            await transport.wait_closed()


def _problem(subject: bytes, reply: bytes, headers: bytes | None) -> str | None:
    for name, value in (("subject", subject), ("reply subject", reply)):
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return f"its {name} is not UTF-8"
    if headers and len(headers) > _HDR_LINE and headers[_HDR_LINE] == _STATUS_SPACE:
        if reply.startswith(b"$JS.ACK."):
            # The server's own status messages never come with an ack subject: a stored
            # message with one would pass for "no messages" and come back for ever.
            return "a stored message with a status line"
        try:
            headers.decode("utf-8")
        except UnicodeDecodeError:
            return "its status line is not UTF-8"
    return None


async def connect(
    url: str, *, name: str, auth: BusAuth, reconnect: bool = True, **options: Any
) -> GuardedClient:
    """Connect to the bus at ``url`` as ``auth``'s principal; return the client.

    The first connection is tried :data:`CONNECT_ATTEMPTS` times (a refused credential
    fails here, with the server's word in the log); after that the client reconnects
    for ever unless ``reconnect`` is False.

    Raises:
        nats.errors.Error: (or OSError) the server cannot be reached or refused the login.
    """
    nc = GuardedClient(auth.key)

    async def on_error(exc: Exception) -> None:
        text = str(exc)
        if "permissions violation" in text.lower():
            nc.note_violation(text)
        log.warning("bus %s: %s", name, text)

    if auth.key is not None:
        options["nkeys_seed_str"] = nkey_seed(auth.key)
    if auth.tls is not None:
        options["tls"] = auth.tls
    try:
        await nc.connect(
            url,
            name=name,
            inbox_prefix=auth.inbox,
            error_cb=on_error,
            max_reconnect_attempts=CONNECT_ATTEMPTS,
            reconnect_time_wait=0.5,  # type: ignore[arg-type]  # nats.py takes seconds as float
            allow_reconnect=True,
            **options,
        )
    except BaseException:
        # nats.py leaves the last socket open when it gives up: close it here, not in a
        # finalizer that would run at some random later moment.
        with anyio.CancelScope(shield=True):
            await _abandon(nc)
        raise
    # nats.py reads these on each reconnect: from now on, never give up, and pace it.
    nc.options["max_reconnect_attempts"] = -1 if reconnect else 0
    nc.options["reconnect_time_wait"] = RECONNECT_WAIT_S
    return nc
