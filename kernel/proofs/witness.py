"""A witness: cosigns a log's checkpoint only if it is consistent with the last it cosigned.

The rules of c2sp.org/tlog-witness@v1.0.0's ``add-checkpoint``, for one log: a witness
keeps the latest checkpoint it cosigned (:class:`WitnessState`, a file it writes
atomically) and, for a new one, wants the log's signature (403 otherwise), the old size
it keeps (409), a new size not below it (400), and an RFC 6962 consistency proof from
its root to the new one (422 if it fails, or if the size is the same and the root is
not). Only then does it sign a tlog-cosignature/v1 line and move its state forward.
So a writer that truncates its journal and grows it again, or rewrites any event, is
refused by every witness that saw the history it rewrote; a checkpoint cosigned by
witnesses proves the history it names was the only one they were shown.

``dirk witness`` runs one against a journal it can read (the journal gives the
consistency proof; the witness trusts only its own state and the proof's check).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kernel.core.merkle import EMPTY_ROOT, verify_consistency
from kernel.core.notes import (
    ED25519,
    Checkpoint,
    NoteError,
    Verifier,
    cosign,
    merge,
    open_note,
    parse_checkpoint,
    split_note,
)


class WitnessRefused(Exception):
    """A checkpoint the witness does not cosign; ``status`` is tlog-witness's HTTP status."""

    def __init__(self, status: int, detail: str, size: int | None = None) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail
        self.size = size


class WitnessState(msgspec.Struct, frozen=True, kw_only=True):
    """The latest checkpoint a witness cosigned for its log (the note, cosignature included)."""

    origin: str
    size: int
    root: bytes
    note: str


class Witness:
    """Cosigns checkpoints of one log (its ``log_keys``) as ``name`` with ``key``."""

    def __init__(
        self,
        name: str,
        key: Ed25519PrivateKey,
        log_keys: Sequence[Verifier | bytes],
        state_path: Path,
        origin: str | None = None,
    ) -> None:
        self.name = name
        self._key = key
        self._log_keys = list(log_keys)
        self._path = state_path
        self._origin = origin
        self.state = self._load()

    def __repr__(self) -> str:
        return f"Witness(name={self.name!r}, state={str(self._path)!r})"

    def _load(self) -> WitnessState | None:
        try:
            raw = self._path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return msgspec.json.decode(raw, type=WitnessState)
        except msgspec.DecodeError as exc:
            # A damaged state is no state to trust; starting over would cosign anything.
            raise WitnessRefused(
                500, f"the witness's state {self._path} is unreadable ({exc})"
            ) from None

    def _save(self, state: WitnessState) -> None:
        folder = self._path.parent
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".witness.")
        with os.fdopen(fd, "wb") as out:
            out.write(msgspec.json.encode(state))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self._path)

    @property
    def size(self) -> int:
        """The size of the latest checkpoint cosigned (0: none yet)."""
        return 0 if self.state is None else self.state.size

    def add_checkpoint(self, old: int, proof: Sequence[bytes], note: str, now_s: int) -> str:
        """Check ``note`` against the state; cosign it and keep it; return the cosigned note.

        Raises:
            WitnessRefused: with tlog-witness's status: 403 no log signature, 404 another
                origin, 409 ``old`` is not the size kept (``size`` says it), 400 a smaller
                tree, 422 an inconsistent one.
        """
        try:
            text, _ = split_note(note)
            checkpoint = parse_checkpoint(text)
        except NoteError as exc:
            raise WitnessRefused(400, f"not a checkpoint ({exc})") from None
        origin = self._origin or (self.state.origin if self.state else checkpoint.origin)
        if checkpoint.origin != origin:
            raise WitnessRefused(404, f"this witness follows {origin}, not {checkpoint.origin}")
        self._check_signed(note, origin)
        if old != self.size:
            raise WitnessRefused(409, f"the witness is at size {self.size}, not {old}", self.size)
        if checkpoint.size < old:
            raise WitnessRefused(
                400, f"size {checkpoint.size} is below the {old} events already cosigned"
            )
        self._check_extends(old, proof, checkpoint)
        line = cosign(text, self.name, self._key, now_s)
        cosigned = merge(note, text + "\n" + line)
        self._save(
            WitnessState(origin=origin, size=checkpoint.size, root=checkpoint.root, note=cosigned)
        )
        self.state = self._load()
        return cosigned

    def _check_signed(self, note: str, origin: str) -> None:
        """Refuse (403) a note no key of the log signed."""
        verifiers = [
            k if isinstance(k, Verifier) else Verifier(origin, ED25519, k) for k in self._log_keys
        ]
        try:
            _, signatures = open_note(note, verifiers)
        except NoteError as exc:
            raise WitnessRefused(403, f"not signed by the log's key ({exc})") from None
        if not any(s.type == ED25519 for s in signatures):
            raise WitnessRefused(403, "not signed by the log's key")

    def _check_extends(self, old: int, proof: Sequence[bytes], checkpoint: Checkpoint) -> None:
        """Refuse (422) a tree that does not extend the one cosigned at size ``old``."""
        if old == 0:
            if proof:
                raise WitnessRefused(422, "from size 0 the proof is empty")
            if checkpoint.size == 0 and checkpoint.root != EMPTY_ROOT:
                raise WitnessRefused(422, "an empty tree has the root SHA-256()")
            return
        assert self.state is not None
        if not verify_consistency(old, checkpoint.size, proof, self.state.root, checkpoint.root):
            raise WitnessRefused(
                422,
                f"the tree of {checkpoint.size} events does not extend the {old} cosigned:"
                " a truncated, rewritten or forked history",
            )
