"""The artifact-store port: content-addressed bytes behind one small protocol.

An artifact is a document too large for an agent's context (a hotel's accessibility
statement, a PDF report, a dataset). Its bytes live in an artifact store; the journal
records only its reference (``sha256:<hex>`` of the bytes), its size, media type, a
short summary and who put it (``ArtifactStored``), never the bytes. The store is
content-addressed: the same bytes have the same reference, a put of bytes already held
is a no-op, and bytes that no longer hash to their reference are caught by
``dirk verify`` and refused to agents.

Three stores keep the same contract (tests/artifacts/test_store_contract.py runs it
against each): a SQLite file (:mod:`kernel.artifacts._sqlite`), a PostgreSQL table
(:mod:`kernel.artifacts._postgres`, the ``dir-kernel[postgres]`` extra) and a directory of
files (:mod:`kernel.artifacts._directory`). :func:`open_artifacts` picks one by
location; :func:`artifacts_beside` names the default one beside a journal.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

MAX_ARTIFACT_BYTES = 16 * 1024 * 1024
"""The largest artifact a store takes: each fetch reads and checks it whole."""
REF = re.compile(r"^sha256:[0-9a-f]{64}$")
"""What a reference looks like: ``sha256:`` and 64 lower-case hex digits."""
DIRECTORY = "dir:"
"""The prefix of a directory store's location (a path to an existing directory also is one)."""


class ArtifactStoreError(Exception):
    """The store cannot be used (opened, read or written); the message says why."""

    def __init__(self, location: str, detail: str) -> None:
        super().__init__(f"artifact store {location}: {detail}")
        self.location = location
        self.detail = detail


class ArtifactTooLarge(ValueError):
    """Bytes larger than :data:`MAX_ARTIFACT_BYTES` (or not bytes at all) were put."""


def ref_of(data: bytes) -> str:
    """Return the reference of ``data``: ``sha256:`` and its hex digest."""
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def is_ref(text: object) -> bool:
    """Whether ``text`` is a reference (``sha256:<64 hex>``)."""
    return isinstance(text, str) and REF.fullmatch(text) is not None


def checked(data: object) -> bytes:
    """Return ``data`` as bytes a store takes.

    Raises:
        ArtifactTooLarge: not bytes, or larger than :data:`MAX_ARTIFACT_BYTES`.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ArtifactTooLarge(f"an artifact is bytes, not {type(data).__name__}")
    raw = bytes(data)
    if len(raw) > MAX_ARTIFACT_BYTES:
        raise ArtifactTooLarge(f"{len(raw)} bytes is over the limit of {MAX_ARTIFACT_BYTES}")
    return raw


class ArtifactStore(Protocol):
    """Where artifacts' bytes are kept, by reference.

    Every method raises :class:`ArtifactStoreError` when the store itself fails (never
    the driver's own error); a reference that is not one (:func:`is_ref`) is never
    found. Reads never check the bytes against the reference: the caller does
    (``kernel.state.artifacts``), so a store that was tampered with cannot pass off
    other bytes.
    """

    location: str

    async def put(self, data: bytes) -> str:
        """Keep ``data`` (checked with :func:`checked`); return its reference. Idempotent."""
        ...

    async def get(self, ref: str) -> bytes | None:
        """Return the bytes kept under ``ref``, or None."""
        ...

    async def size(self, ref: str) -> int | None:
        """Return how many bytes are kept under ``ref``, or None."""
        ...

    async def delete(self, ref: str) -> bool:
        """Delete what is kept under ``ref``; return whether there was anything."""
        ...

    async def refs(self) -> list[str]:
        """Return every reference kept, sorted."""
        ...

    async def aclose(self) -> None:
        """Release the store's connections."""
        ...


def _backend(location: str) -> str:
    if location.startswith(("postgresql://", "postgres://")):
        return "kernel.artifacts._postgres"
    if location.startswith(DIRECTORY) or Path(location).is_dir():
        return "kernel.artifacts._directory"
    return "kernel.artifacts._sqlite"


def artifacts_beside(journal: str | os.PathLike[str]) -> str:
    """Return the default artifact store of a journal.

    A PostgreSQL journal keeps its artifacts in a table beside its events (the same
    URL); a SQLite journal ``X.db`` in the file ``X.artifacts.db`` next to it (its own
    file, so no lock of the journal's writer is ever shared with it).
    """
    location = os.fspath(journal)
    if location.startswith(("postgresql://", "postgres://")):
        return location
    path = Path(location)
    return str(path.with_name(f"{path.stem}.artifacts{path.suffix or '.db'}"))


async def connect_artifacts(
    location: str | os.PathLike[str], *, readonly: bool = False
) -> ArtifactStore:
    """Open the artifact store at ``location``; the caller closes it (``aclose``).

    ``location`` is a SQLite file, a ``postgresql://`` URL, or a directory (an existing
    one, or ``dir:PATH``); it is created if absent unless ``readonly``.

    Raises:
        ArtifactStoreError: the store cannot be opened.
    """
    where = os.fspath(location)
    module = importlib.import_module(_backend(where))
    store: ArtifactStore = await module.open_store(where.removeprefix(DIRECTORY), readonly)
    return store


@contextlib.asynccontextmanager
async def open_artifacts(
    location: str | os.PathLike[str], *, readonly: bool = False
) -> AsyncIterator[ArtifactStore]:
    """Open the artifact store at ``location`` for the block (see :func:`connect_artifacts`).

    Raises:
        ArtifactStoreError: the store cannot be opened.
    """
    store = await connect_artifacts(location, readonly=readonly)
    try:
        yield store
    finally:
        await store.aclose()
