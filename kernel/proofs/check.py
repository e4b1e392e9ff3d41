"""Checking a journal's signed checkpoints with public keys only.

``dirk verify --public-key`` runs :func:`check_checkpoints` after the chain and the tree
checked out (:func:`kernel.journal.verify.verify_journal` recomputes both from the
events and compares every stored checkpoint's root). What it adds:

- every stored checkpoint is signed by a given key (a forged one, or one signed by a
  key nobody gave, fails), and all name one origin;
- the latest covers every event: events after it are nobody's word but the file's,
  which is how an append forged with everything but the private key is caught;
- each checkpoint kept elsewhere (``--checkpoint``: published, a witness's, a ticket)
  still holds: a journal that ends before it was truncated or rolled back, one whose
  tree at its size has another root was rewritten: a forked history.

Verifying never needs a key that can sign.
"""

from __future__ import annotations

import base64

import msgspec

from kernel.core.keys import KeyUnusable, parse_public
from kernel.core.notes import (
    ED25519,
    NoteError,
    Verifier,
    cosigner,
    log_verifiers,
    open_note,
    parse_checkpoint,
    parse_vkey,
    raw_public,
    split_note,
)
from kernel.journal.tree import TreeReader


class KeySet(msgspec.Struct, frozen=True):
    """Public keys given to a verifier: raw log keys (named by the origin) and vkeys."""

    keys: tuple[Verifier | bytes, ...]

    def for_log(self, origin: str) -> list[Verifier]:
        """The verifiers of a log's signature lines under ``origin``."""
        return log_verifiers(
            origin, [k for k in self.keys if not isinstance(k, Verifier) or k.type == ED25519]
        )

    def for_witnesses(self) -> list[Verifier]:
        """The verifiers of witness cosignature lines (a 0x01 vkey's 0x04 twin included)."""
        found = []
        for key in self.keys:
            if isinstance(key, Verifier):
                found.append(key if key.type != ED25519 else cosigner(key))
        return found


def read_keys(text: str) -> KeySet:
    """Return the public keys in ``text``: one a line, ``ed25519:...`` or a C2SP vkey.

    Blank lines and ``#`` comments are skipped; a keyring line (``name role ed25519:...``)
    gives its key.

    Raises:
        NoteError: a line that is no key, or no key at all.
    """
    keys: list[Verifier | bytes] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        word = next((w for w in line.split() if w.startswith("ed25519:")), None)
        try:
            if word is not None:
                keys.append(raw_public(parse_public(word)))
            else:
                keys.append(parse_vkey(line))
        except (KeyUnusable, NoteError) as exc:
            raise NoteError(f"not a public key: {exc}") from None
    if not keys:
        raise NoteError("no public key in it (ed25519:... or a C2SP verifier key a line)")
    return KeySet(tuple(keys))


class CheckpointsChecked(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of :func:`check_checkpoints`: problems (none when ok) and what held."""

    problems: list[str]
    lines: list[str]
    origin: str = ""
    covered: int = 0
    first_bad_seq: int | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def _opened(note: str, keys: KeySet) -> tuple[str, int, bytes, int]:
    """Return a note's origin, size, root and how many witnesses cosigned it."""
    text, _ = split_note(note)
    checkpoint = parse_checkpoint(text)
    verifiers = keys.for_log(checkpoint.origin) + keys.for_witnesses()
    _, signatures = open_note(note, verifiers)
    if not any(s.type == ED25519 and s.name == checkpoint.origin for s in signatures):
        raise NoteError(f"no given key signed it as {checkpoint.origin}")
    witnesses = sum(1 for s in signatures if s.type != ED25519)
    return checkpoint.origin, checkpoint.size, checkpoint.root, witnesses


class _Findings:
    """What a check of checkpoints found so far: problems, what held, the first bad event."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.lines: list[str] = []
        self.first_bad: int | None = None


async def check_checkpoints(
    heads: list[tuple[int, str]],
    events: int,
    keys: KeySet,
    trees: TreeReader,
    earlier: list[str] = (),  # type: ignore[assignment]
) -> CheckpointsChecked:
    """Check the journal's stored checkpoints and ``earlier`` ones against ``keys``.

    ``heads`` and ``events`` come from a :class:`~kernel.journal.verify.VerifyReport`
    that was ok (so each stored checkpoint's root is the events'); ``trees`` gives the
    journal's root at the size of each earlier checkpoint.
    """
    found = _Findings()
    origins, covered = _check_stored(heads, keys, found)
    if len(origins) > 1:
        found.problems.append(f"checkpoints of several origins: {', '.join(sorted(origins))}")
    origin = min(origins) if origins else ""
    _check_coverage(bool(heads), covered, events, found)
    for note in earlier:
        await _check_earlier(note, keys, origin, events, trees, found)
    if not found.problems:
        found.lines.insert(
            0,
            f"signatures ok: {len(heads)} signed checkpoints of {origin}, the latest covers"
            f" events 1..{covered}",
        )
    return CheckpointsChecked(
        problems=found.problems,
        lines=found.lines,
        origin=origin,
        covered=covered,
        first_bad_seq=found.first_bad,
    )


def _check_stored(
    heads: list[tuple[int, str]], keys: KeySet, found: _Findings
) -> tuple[set[str], int]:
    """Open each stored checkpoint: the origins that signed them and the size they cover."""
    origins: set[str] = set()
    covered = 0
    for size, note in heads:
        try:
            origin, _, _, witnesses = _opened(note, keys)
        except NoteError as exc:
            found.problems.append(
                f"the checkpoint of size {size} is not signed by a key given: {exc}"
            )
            found.first_bad = found.first_bad if found.first_bad is not None else size
            continue
        origins.add(origin)
        covered = max(covered, size)
        if witnesses:
            found.lines.append(f"checkpoint {size}: cosigned by {witnesses} witness(es) given")
    return origins, covered


def _check_coverage(signed: bool, covered: int, events: int, found: _Findings) -> None:
    """The latest signed checkpoint covers every event, or the rest is the file's word."""
    if not signed:
        found.problems.append(
            "no signed checkpoint: nothing in it is signed (the kernel signs with a key)"
        )
    elif covered < events and not found.problems:
        found.problems.append(
            f"events {covered + 1}..{events} are not covered by any signed checkpoint:"
            " appended after the last one the kernel signed, or not by the kernel"
        )
        found.first_bad = covered + 1


async def _check_earlier(
    note: str, keys: KeySet, origin: str, events: int, trees: TreeReader, found: _Findings
) -> None:
    """A checkpoint kept elsewhere still holds: same origin, not past the end, same root."""
    try:
        kept_origin, size, root, _ = _opened(note, keys)
    except NoteError as exc:
        found.problems.append(f"a checkpoint kept elsewhere does not verify: {exc}")
        return
    if origin and kept_origin != origin:
        found.problems.append(f"a checkpoint kept elsewhere is of {kept_origin}, not {origin}")
        return
    if size > events:
        found.problems.append(
            f"a checkpoint kept elsewhere covers {size} events, the journal ends at {events}:"
            " it was truncated or rolled back"
        )
        found.first_bad = events + 1
        return
    if await trees.root(size) != root:
        found.problems.append(
            f"events 1..{size} are not those of the checkpoint kept elsewhere (root"
            f" {base64.b64encode(root).decode()[:12]}...): a forked or rewritten history"
        )
        found.first_bad = size
        return
    found.lines.append(f"checkpoint kept elsewhere ok: events 1..{size} are the ones it signed")
