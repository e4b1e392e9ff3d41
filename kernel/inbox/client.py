"""Writing to the inbox: a signer, the rows it posts, and what the kernel made of them.

A client (``dirk decide``, the console, the MCP server) holds a :class:`Signer`: a
private key, the name the keyring knows it by, and the id of the journal it signs
for. :meth:`Signer.post` signs a request and inserts its row; :func:`taken_seq` tells
when the kernel took a row, and :func:`answer_of` what the event that took it says.

Where a key comes from: ``--key PATH`` (or ``DIRK_KEY``), a key file, or a directory
holding ``<name>.key`` files (one per operator, as ``dirk operator add`` writes them).
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kernel.core import events as ev
from kernel.core.keys import KeyUnusable, load_private_key, public_text
from kernel.inbox.keyring import Keyring, KeyringError, read_keyring
from kernel.inbox.proof import sign
from kernel.inbox.requests import DecideRequest, InboxRequest, decode_row
from kernel.journal.inbox_store import open_inbox
from kernel.journal.opening import open_journal

KEY_ENV = "DIRK_KEY"
"""The environment variable naming a key file, or a directory of ``<name>.key`` files."""


def key_file(given: str | os.PathLike[str] | None, name: str) -> Path:
    """Return the key file of ``name``: ``given`` (or ``DIRK_KEY``), or ``<name>.key`` in it.

    Raises:
        KeyUnusable: no key given, and ``DIRK_KEY`` is not set.
    """
    where = given if given is not None else os.environ.get(KEY_ENV)
    if not where:
        raise KeyUnusable(
            f"no key to sign with: --key FILE (or a directory of NAME.key files), or {KEY_ENV};"
            " dirk operator add NAME makes one"
        )
    path = Path(where)
    return path / f"{name}.key" if path.is_dir() else path


class Signer:
    """A private key that signs inbox requests for one journal, under one name.

    Args:
        location: the journal (a file or a server URL) whose inbox it posts to.
        journal_id: that journal's id (what a signature binds a request to).
        key: the private key.
        name: the name the kernel's keyring holds the key's public half under.
    """

    def __init__(self, location: str, journal_id: str, key: Ed25519PrivateKey, name: str) -> None:
        self.location = location
        self.journal_id = journal_id
        self.name = name
        self.public = public_text(key)
        self._key = key

    def row(self, request: InboxRequest, now_ns: int) -> bytes:
        """Return the signed row for ``request``, stamped as signed at ``now_ns``.

        Raises:
            InputInvalid: the kernel's wall would refuse the request.
        """
        return sign(
            request, key=self._key, signer=self.name, journal_id=self.journal_id, signed_ns=now_ns
        )

    def post(self, request: InboxRequest, now_ns: int) -> int:
        """Sign ``request`` at ``now_ns`` and insert its row; return the row's id (blocks).

        ``now_ns`` is the signing time the kernel judges the request's validity window on
        (the machine's clock, or the clock of the kernel a door runs beside); run it in a
        thread.

        Raises:
            InputInvalid: the kernel's wall would refuse the request (nothing posted).
            JournalError: the inbox cannot be written.
        """
        body = self.row(request, now_ns)
        with open_inbox(self.location) as store:
            return store.insert(body, now_ns)

    def trusted_by(self, keyring: Keyring) -> str | None:
        """Return why ``keyring`` would refuse this signer's requests, or None."""
        known = keyring.get(self.name)
        if known is None:
            return f"the keyring names no {self.name!r}: dirk operator add {self.name}"
        if known.key != self.public:
            return f"the keyring holds another key for {self.name!r}"
        return None


async def open_signer(location: str, key: str | os.PathLike[str] | None, name: str) -> Signer:
    """Return a signer for the journal at ``location`` with ``name``'s key (see :func:`key_file`).

    Raises:
        KeyUnusable: no key, an unreadable one, or one that others may read.
        JournalError: the journal cannot be read (its id is what a signature binds to).
    """
    private = load_private_key(key_file(key, name))
    async with open_journal(location, readonly=True) as journal:
        journal_id = journal.journal_id
    return Signer(location, journal_id, private, name)


def keyring_problem(signer: Signer, keyring_path: str | None) -> str | None:
    """Return why the kernel's keyring (when this client can read it) refuses ``signer``."""
    path = keyring_path or os.environ.get("DIRK_KEYRING")
    if not path:
        return None
    try:
        keyring = read_keyring(path)
    except KeyringError:
        return None  # the kernel's to judge; maybe not this client's to read
    return signer.trusted_by(keyring)


def pending(location: str) -> list[tuple[int, InboxRequest]]:
    """Return the requests waiting in the inbox (rows that do not decode are left out)."""
    found = []
    with open_inbox(location, readonly=True) as store:
        rows = store.rows(pending=True)
    for row in rows:
        try:
            found.append((row.id, decode_row(row.body).request))
        except ValueError:
            continue
    return found


def queued_dfids(location: str) -> set[str]:
    """Return the DFIDs a decision waits in the inbox for (reads only)."""
    return {r.dfid for _, r in pending(location) if isinstance(r, DecideRequest)}


def taken_seq(location: str, row_id: int) -> int | None:
    """Return the seq of the event that took inbox row ``row_id`` (None: not taken yet)."""
    with open_inbox(location, readonly=True) as store:
        return store.taken_seq(row_id)


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    """What the kernel made of a request: APPLIED or REFUSED, with the code and the event."""

    verdict: str
    seq: int
    reason_code: str = ""
    field: str = ""
    detail: str = ""


def answer_of(event: ev.Event | None, seq: int) -> Answer:
    """Return what ``event`` (the one that took a row, at ``seq``) says of the request."""
    payload = event.payload if event is not None else None
    if isinstance(payload, ev.DecisionRefused | ev.AmendmentRefused):
        return Answer(
            verdict="REFUSED", seq=seq, reason_code=str(payload.reason_code), detail=payload.detail
        )
    if isinstance(payload, ev.InputRefused):
        return Answer(
            verdict="REFUSED",
            seq=seq,
            reason_code=str(payload.reason_code),
            field=payload.field,
            detail=payload.detail,
        )
    return Answer(verdict="APPLIED" if payload is not None else "UNKNOWN", seq=seq)


async def read_answer(location: str, seq: int) -> tuple[ev.Event | None, Answer]:
    """Read the event at ``seq`` and what it says of the request it took."""
    async with open_journal(location, readonly=True) as journal:
        found = await journal.read(seq, seq + 1) if seq > 0 else []
    event = found[0] if found else None
    return event, answer_of(event, seq)
