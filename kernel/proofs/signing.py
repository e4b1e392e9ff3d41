"""Signed checkpoints: the kernel signs its Merkle tree's root with its Ed25519 key.

A checkpoint (c2sp.org/tlog-checkpoint@v1.0.0) names the journal's origin, a tree size
and its root, signed as a C2SP note under the origin's name (kernel.core.notes). The
kernel signs one every :attr:`Signing.every_s` seconds on its clock while the journal
grows, and one covering everything when it stops; ``dirk checkpoint`` signs one on
demand. Each is kept beside the events (``tree_heads``, outside the chain: a checkpoint
is its own proof) and published to the places configured (kernel.proofs.publish).

The private key comes from a file (PEM, PKCS#8, mode 0600: kernel.core.keys) or from
``DIRK_CHECKPOINT_KEY`` (the PEM text) and lives only in the :class:`Signer`: it is never
put in an event, a span, a log line or an error message; the journal records only the
public half, and each change of key (:class:`~kernel.core.events.CheckpointKeyChanged`).
Verifying needs only public keys (kernel.proofs.check).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import msgspec
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kernel.core.events import CheckpointKeyChanged, Draft
from kernel.core.keys import KeyUnusable, load_private_key, public_text, write_private_key
from kernel.core.notes import ED25519, checkpoint_text, raw_public, sign, vkey
from kernel.core.ports import Clock
from kernel.journal.store import Journal, JournalClosed, JournalError
from kernel.proofs.publish import Publisher, publish_all

log = logging.getLogger(__name__)

KEY_ENV = "DIRK_CHECKPOINT_KEY"
"""The environment variable holding the checkpoint key as PEM text."""
KEY_FILE_ENV = "DIRK_CHECKPOINT_KEY_FILE"
"""The environment variable naming the checkpoint key's file."""
EVERY_S = 1.0


class Signing(msgspec.Struct, frozen=True, kw_only=True):
    """How the kernel signs checkpoints of its journal.

    Attributes:
        key_file: the Ed25519 private key (PEM, PKCS#8, mode 0600); None: the file named
            by ``DIRK_CHECKPOINT_KEY_FILE``, else the PEM text in ``DIRK_CHECKPOINT_KEY``.
        origin: the log's name in its checkpoints (a URL without scheme, no spaces, no
            ``+``); None: ``dirk/<journal id>``.
        every_s: how often (on the kernel's clock) a checkpoint is signed while the
            journal grows; None: only when the kernel stops (one always is then), and on
            demand (``dirk checkpoint``). A simulation whose clock jumps ahead on each
            sleep (the examples') signs only at the end, so as not to move its time.
        publish: where each checkpoint goes besides the journal: a directory, a
            ``postgresql://`` URL, a ``nats://host:port/bucket`` URL (kernel.proofs.publish).
    """

    key_file: str | None = None
    origin: str | None = None
    every_s: float | None = EVERY_S
    publish: tuple[str, ...] = ()


def signing_from_env() -> Signing | None:
    """Return signing configured by the environment, or None when no key is set there."""
    if os.environ.get(KEY_FILE_ENV) or os.environ.get(KEY_ENV):
        return Signing()
    return None


def load_signing_key(key_file: str | None) -> Ed25519PrivateKey:
    """Return the checkpoint key from ``key_file``, else from the environment.

    Raises:
        KeyUnusable: no key given, or one that is not an Ed25519 private key (the message
            names where it came from, never its content).
    """
    path = key_file or os.environ.get(KEY_FILE_ENV)
    if path:
        return load_private_key(Path(path))
    text = os.environ.get(KEY_ENV)
    if not text:
        raise KeyUnusable(f"no checkpoint key: give a key file or set {KEY_ENV}")
    try:
        key = serialization.load_pem_private_key(text.encode(), password=None)
    except (ValueError, TypeError):
        raise KeyUnusable(f"{KEY_ENV} is not a private key in PEM (PKCS#8)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyUnusable(f"{KEY_ENV} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def write_signing_key(path: Path) -> str:
    """Write a new checkpoint key to ``path`` (mode 0600, never overwritten); return its
    public half (``ed25519:...``), what verifiers are given."""
    return public_text(write_private_key(path))


def default_origin(journal_id: str) -> str:
    """Return the origin of a journal's checkpoints when none is configured."""
    return f"dirk/{journal_id}"


class Signer:
    """Signs checkpoints of one journal's tree under one origin. Holds the private key."""

    __slots__ = ("_key", "origin", "public", "vkey")

    def __init__(self, key: Ed25519PrivateKey, origin: str) -> None:
        self._key = key
        self.origin = origin
        self.public = public_text(key)
        self.vkey = vkey(origin, ED25519, raw_public(key))

    def __repr__(self) -> str:
        return f"Signer(origin={self.origin!r}, public={self.public!r})"

    def sign(self, size: int, root: bytes) -> str:
        """Return the signed checkpoint note of the tree of ``size`` events with ``root``."""
        return sign(checkpoint_text(self.origin, size, root), self.origin, self._key)


async def record_key(journal: Journal, signer: Signer) -> CheckpointKeyChanged | None:
    """Record the signer's key unless it is the one the journal recorded last (a rotation)."""
    recorded = await journal.read(types=["CheckpointKeyChanged"])
    previous = ""
    for event in recorded:
        if (
            isinstance(event.payload, CheckpointKeyChanged)
            and event.payload.origin == signer.origin
        ):
            previous = event.payload.key
    if previous == signer.public:
        return None
    changed = CheckpointKeyChanged(
        origin=signer.origin, key=signer.public, vkey=signer.vkey, previous=previous
    )
    await journal.append([Draft(payload=changed)])
    return changed


async def sign_head(
    journal: Journal, signer: Signer, publishers: Sequence[Publisher] = ()
) -> tuple[int, str]:
    """Sign, keep and publish a checkpoint of the journal's whole tree; return size and note.

    The journal must be open for writing (its tree's root is at hand).
    """
    size, root = journal.head_seq, journal.tree_root
    if root is None:
        raise JournalClosed(journal.path, "opened read-only: sign with dirk checkpoint")
    note = signer.sign(size, root)
    await journal.store_tree_head(size, note)
    await publish_all(publishers, signer.origin, size, note)
    return size, note


async def run_signing(
    journal: Journal, signer: Signer, clock: Clock, every_s: float, publishers: Sequence[Publisher]
) -> None:
    """Sign a checkpoint every ``every_s`` seconds while the journal grows (a kernel task)."""
    signed = -1
    while True:
        await clock.sleep(every_s)
        if journal.head_seq == signed or journal.failed:
            continue
        try:
            signed, _ = await sign_head(journal, signer, publishers)
        except JournalError as exc:
            # Signing is a proof for outsiders, not a step of any flow: a failed one is said
            # and tried again on the next round, never a reason to stop the kernel.
            log.warning("a checkpoint was not signed: %s", exc.detail)
            continue
