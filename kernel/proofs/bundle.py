"""Evidence bundles: one flow's events, proven against a signed checkpoint, in one file.

``dirk export --flow DFID --bundle FILE`` writes a JSON document (``dirk-bundle/v1``):

- ``checkpoint``: the signed (and cosigned, if a witness did) checkpoint note that covers
  every event of the flow (c2sp.org/tlog-checkpoint@v1.0.0);
- ``events``: each event of the flow as its seq, its canonical bytes (base64: the bytes
  the chain and the Merkle leaf hash) and its RFC 6962 inclusion proof (base64 hashes,
  from the leaf up);
- ``packs``: the packs (name, version, hash) whose hashes the flow's verdicts record;
- ``keys``: the fingerprints and verifier keys of the checkpoint keys the journal recorded.

:func:`tlog_proofs` gives the same evidence, event by event, as ``c2sp.org/tlog-proof@v1``
texts (``dirk export --tlog-proof DIR``), which other transparency-log tools read.

Anyone holding the log's public key checks it offline (:func:`verify_bundle`, ``dirk
verify-bundle``, or docs/proofs.md's hundred lines of standard library and
``cryptography``): the signature, each leaf computed from the event's own bytes, each
proof, and that every event is the flow's. A field erased since (kernel.proofs.erasure)
is ciphertext in the bundle as in the journal; the proofs hold all the same.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import msgspec

from kernel.core.events import (
    CheckpointKeyChanged,
    Event,
    KernelStarted,
    PackLoaded,
    canonical,
    is_derived,
)
from kernel.core.keys import fingerprint
from kernel.core.merkle import leaf_hash, verify_inclusion
from kernel.core.notes import (
    ED25519,
    Checkpoint,
    NoteError,
    open_note,
    parse_checkpoint,
    split_note,
    tlog_proof,
)
from kernel.journal.store import Journal
from kernel.proofs.check import KeySet

FORMAT = "dirk-bundle/v1"


class BundleError(ValueError):
    """A bundle that cannot be made, or that does not verify, with why."""


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _unb64(text: object) -> bytes:
    if not isinstance(text, str):
        raise BundleError("a bundle's bytes are base64 strings")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise BundleError("a bundle's bytes are base64 strings") from None


def _bare(event: Event) -> bytes:
    """The canonical bytes of an event as read back (its hashes are not part of them)."""
    return canonical(msgspec.structs.replace(event, prev_hash="", hash=""))


async def export_bundle(journal: Journal, dfid: str) -> dict[str, Any]:
    """Return the bundle of flow ``dfid``, proven against the latest checkpoint covering it.

    Raises:
        BundleError: no such flow, or no signed checkpoint covers its last event yet.
    """
    # The rows of the flow: a derived event has none (the row it travels with stands for it).
    read = await journal.flow_events(dfid)
    events = [event for event in read if not is_derived(event)]
    if not events:
        raise BundleError(f"no flow {dfid} in the journal")
    last = events[-1].seq
    heads = [(size, note) for size, note in await journal.tree_heads() if size >= last]
    if not heads:
        raise BundleError(
            f"no signed checkpoint covers event {last} yet: sign one (dirk checkpoint)"
        )
    size, note = heads[-1]
    trees = journal.trees()
    entries = [
        {
            "seq": event.seq,
            "event": _b64(_bare(event)),
            "proof": [_b64(h) for h in await trees.inclusion(event.seq, size)],
        }
        for event in events
    ]
    # The packs its verdicts name, derived ones too (an acceptance carried by its submission).
    packs, keys = await _packs_and_keys(journal, _named(read))
    return {
        "format": FORMAT,
        "origin": parse_checkpoint(split_note(note)[0]).origin,
        "dfid": dfid,
        "checkpoint": note,
        "events": entries,
        "packs": sorted(packs.values(), key=lambda p: (p["name"], p["version"])),
        "keys": keys,
    }


def _named(events: list[Event]) -> set[str]:
    """The hashes of the packs the flow's events name (its verdicts')."""
    return {
        getattr(e.payload, "pack", "")
        for e in events
        if isinstance(getattr(e.payload, "pack", None), str)
    } - {""}


async def _packs_and_keys(
    journal: Journal, named: set[str]
) -> tuple[dict[str, dict[str, str]], list[dict[str, str]]]:
    """The packs of ``named`` the journal loaded, and every checkpoint key it recorded."""
    packs: dict[str, dict[str, str]] = {}
    keys: list[dict[str, str]] = []
    for event in await journal.read(types=["KernelStarted", "PackLoaded", "CheckpointKeyChanged"]):
        match event.payload:
            case KernelStarted(packs=refs):
                found = refs
            case PackLoaded(pack=ref):
                found = [ref]
            case CheckpointKeyChanged(key=key, vkey=vkey):
                keys.append({"fingerprint": fingerprint(key), "key": key, "vkey": vkey})
                found = []
            case _:
                found = []
        for ref in found:
            if ref.hash in named:
                packs[ref.hash] = {"name": ref.name, "version": ref.version, "hash": ref.hash}
    return packs, keys


def tlog_proofs(bundle: dict[str, Any]) -> list[tuple[int, str]]:
    """Return each event of a bundle :func:`export_bundle` made as a ``c2sp.org/tlog-proof@v1``
    text, with its seq: the event's canonical bytes as ``extra``, its index (seq - 1), its
    inclusion proof and the bundle's checkpoint, verbatim (cosignatures included).

    What other transparency-log tools read: each proof stands alone, and its leaf is the
    hash of its ``extra`` bytes, so the proof authenticates them.
    """
    note = bundle["checkpoint"]
    return [
        (
            entry["seq"],
            tlog_proof(
                entry["seq"] - 1,
                [_unb64(h) for h in entry["proof"]],
                note,
                _unb64(entry["event"]),
            ),
        )
        for entry in bundle["events"]
    ]


class BundleChecked(msgspec.Struct, frozen=True, kw_only=True):
    """What a bundle proved: its flow, its events, the checkpoint and who signed it."""

    dfid: str
    origin: str
    size: int
    events: list[int]
    witnesses: int
    packs: list[str]


def verify_bundle(data: bytes, keys: KeySet, quorum: int = 0) -> BundleChecked:
    """Check a bundle offline against public keys; return what it proves.

    Raises:
        BundleError: anything that does not hold, with what.
    """
    bundle = _bundle_of(data)
    note, dfid, entries = bundle["checkpoint"], bundle["dfid"], bundle["events"]
    checkpoint, witnesses = _signed(note, keys, quorum)
    seqs: list[int] = []
    named: set[str] = set()
    for entry in entries:
        seqs.append(_proved_event(entry, checkpoint, dfid, named))
    if not seqs:
        raise BundleError("a bundle holds at least one event")
    listed = {p.get("hash") for p in bundle.get("packs") or [] if isinstance(p, dict)}
    if not named <= listed:
        raise BundleError(
            f"the flow's verdicts name packs the bundle does not list: {sorted(named - listed)}"
        )
    return BundleChecked(
        dfid=dfid,
        origin=checkpoint.origin,
        size=checkpoint.size,
        events=seqs,
        witnesses=witnesses,
        packs=sorted(str(p) for p in listed if p),
    )


def _bundle_of(data: bytes) -> dict[str, Any]:
    """The bundle document, with its checkpoint, dfid and events of the right types."""
    try:
        bundle = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BundleError(f"not a JSON document ({exc})") from None
    if not isinstance(bundle, dict) or bundle.get("format") != FORMAT:
        raise BundleError(f"not a {FORMAT} bundle")
    note, dfid = bundle.get("checkpoint"), bundle.get("dfid")
    entries = bundle.get("events")
    if not isinstance(note, str) or not isinstance(dfid, str) or not isinstance(entries, list):
        raise BundleError("a bundle has a checkpoint, a dfid and events")
    return bundle


def _signed(note: str, keys: KeySet, quorum: int) -> tuple[Checkpoint, int]:
    """The checkpoint the log's key signed, and how many witnesses cosigned it."""
    try:
        text, _ = split_note(note)
        checkpoint = parse_checkpoint(text)
        verifiers = keys.for_log(checkpoint.origin) + keys.for_witnesses()
        _, signatures = open_note(note, verifiers)
    except NoteError as exc:
        raise BundleError(f"the checkpoint does not verify: {exc}") from None
    if not any(s.type == ED25519 and s.name == checkpoint.origin for s in signatures):
        raise BundleError(f"no key given signed the checkpoint as {checkpoint.origin}")
    witnesses = sum(1 for s in signatures if s.type != ED25519)
    if witnesses < quorum:
        raise BundleError(f"{witnesses} witness cosignatures given keys verify; {quorum} needed")
    return checkpoint, witnesses


def _proved_event(entry: Any, checkpoint: Checkpoint, dfid: str, named: set[str]) -> int:
    """Check one event's proof of inclusion and that it is the flow's; return its seq.

    The pack its verdict names, if any, joins ``named``.
    """
    if not isinstance(entry, dict) or not isinstance(entry.get("seq"), int):
        raise BundleError("each event has a seq, its bytes and its proof")
    seq, body = entry["seq"], _unb64(entry.get("event"))
    proof = [_unb64(h) for h in entry.get("proof") or []]
    if not verify_inclusion(seq - 1, checkpoint.size, leaf_hash(body), proof, checkpoint.root):
        raise BundleError(f"event {seq} is not in the signed tree (its proof fails)")
    event = _event_of(body, seq, dfid)
    payload = event.get("payload")
    if isinstance(payload, dict) and isinstance(payload.get("pack"), str) and payload["pack"]:
        named.add(payload["pack"])
    return seq  # type: ignore[no-any-return]


def _event_of(body: bytes, seq: int, dfid: str) -> dict[str, Any]:
    """The proven bytes read as event ``seq`` of flow ``dfid``, or refused."""
    try:
        event = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise BundleError(f"event {seq}'s bytes are not JSON") from None
    if not isinstance(event, dict) or event.get("seq") != seq or event.get("dfid") != dfid:
        raise BundleError(f"event {seq} is not event {seq} of flow {dfid}")
    return event
