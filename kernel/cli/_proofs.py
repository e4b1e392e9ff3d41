"""``dirk checkpoint``, ``prove``, ``witness``, ``export``, ``verify-bundle`` and ``key public``.

What makes a journal provable to someone who does not trust its writer
(docs/proofs.md): a checkpoint signed with the kernel's Ed25519 key, inclusion and
consistency proofs against it, witnesses that cosign only consistent checkpoints, and
one file holding a flow with its proofs. Private keys come from files (``--key-file``)
or the environment, never from a flag's value; only public keys are ever printed.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from kernel.cli._operator import error, error_of
from kernel.cli._read import print_json, say
from kernel.core.events import Event, is_derived
from kernel.core.keys import KeyUnusable, load_private_key, public_text
from kernel.core.merkle import leaf_hash, verify_consistency, verify_inclusion
from kernel.core.notes import (
    ED25519,
    NoteError,
    parse_checkpoint,
    raw_public,
    split_note,
    tlog_proof,
    vkey,
)
from kernel.core.reasons import CliError, ExitCode
from kernel.journal.errors import redact
from kernel.journal.opening import open_journal
from kernel.journal.store import Journal, JournalError
from kernel.proofs.bundle import BundleError, _bare, export_bundle, tlog_proofs, verify_bundle
from kernel.proofs.check import KeySet, read_keys
from kernel.proofs.publish import open_publishers, publish_all
from kernel.proofs.signing import Signer, default_origin, load_signing_key
from kernel.proofs.witness import Witness, WitnessRefused

if TYPE_CHECKING:
    from kernel.proofs.erasure import SubjectKeys


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the proof commands."""
    checkpoint = commands.add_parser(
        "checkpoint", help="sign a checkpoint of the journal's Merkle tree now, and publish it"
    )
    checkpoint.add_argument(
        "--db", required=True, help="the journal: a file or a postgresql:// URL"
    )
    _signing_key(checkpoint)
    checkpoint.add_argument("--origin", help="the log's name (default: dirk/<journal id>)")
    checkpoint.add_argument(
        "--publish",
        action="append",
        default=[],
        metavar="WHERE",
        help="also publish to a directory, postgresql:// or nats://host:port/bucket (repeatable)",
    )
    checkpoint.set_defaults(run=_checkpoint)

    prove = commands.add_parser("prove", help="inclusion or consistency proofs of the tree")
    prove.add_argument("--db", required=True, help="the journal: a file or a postgresql:// URL")
    which = prove.add_mutually_exclusive_group(required=True)
    which.add_argument("--event", type=int, metavar="SEQ", help="prove event SEQ is in the tree")
    which.add_argument("--flow", metavar="DFID", help="prove every event of a flow is in the tree")
    which.add_argument(
        "--consistency",
        nargs=2,
        type=int,
        metavar=("OLD", "NEW"),
        help="prove the tree of OLD events is a prefix of the tree of NEW",
    )
    prove.add_argument("--json", action="store_true", help="the proof as one JSON object")
    prove.add_argument(
        "--tlog-proof",
        metavar="DIR",
        help="also write each event's c2sp.org/tlog-proof@v1 to DIR/event-SEQ.tlog-proof",
    )
    prove.set_defaults(run=_prove)

    witness = commands.add_parser(
        "witness", help="cosign the journal's latest checkpoint if it extends the last cosigned"
    )
    witness.add_argument("--db", required=True, help="the journal: a file or a postgresql:// URL")
    witness.add_argument("--log-key", required=True, metavar="FILE", help="the log's public key")
    witness.add_argument(
        "--key-file", required=True, metavar="FILE", help="the witness's private key (PEM, 0600)"
    )
    witness.add_argument(
        "--state", required=True, metavar="FILE", help="where the witness keeps what it cosigned"
    )
    witness.add_argument("--name", default="witness", help="the witness's key name")
    witness.add_argument(
        "--out", metavar="DIR", help="also write each cosigned checkpoint under this directory"
    )
    witness.set_defaults(run=_witness)

    export = commands.add_parser("export", help="write one flow and its proofs as one file")
    export.add_argument("--db", required=True, help="the journal: a file or a postgresql:// URL")
    export.add_argument("--flow", required=True, metavar="DFID", help="the flow to export")
    export.add_argument("--bundle", required=True, metavar="FILE", help="where to write it")
    export.add_argument(
        "--tlog-proof",
        metavar="DIR",
        help="also write each event as a c2sp.org/tlog-proof@v1 to DIR/event-SEQ.tlog-proof",
    )
    export.set_defaults(run=_export)

    check = commands.add_parser(
        "verify-bundle", help="check an evidence bundle offline with public keys"
    )
    check.add_argument("bundle", metavar="FILE", help="the bundle dirk export wrote")
    check.add_argument(
        "--public-key",
        required=True,
        action="append",
        metavar="FILE",
        help="the log's public key (and witnesses' verifier keys), one a line (repeatable)",
    )
    check.add_argument(
        "--quorum", type=int, default=0, help="witness cosignatures required (default 0)"
    )
    check.add_argument("--json", action="store_true", help="what the bundle proves, as JSON")
    check.set_defaults(run=_verify_bundle)

    key = commands.add_parser(
        "key", help="the public half of a checkpoint or witness key, as verifiers take it"
    )
    key_commands = key.add_subparsers(dest="key_command", required=True, metavar="ACTION")
    public = key_commands.add_parser(
        "public",
        help="print a private key's verifier key (for --public-key, --log-key, a keyring)",
    )
    public.add_argument(
        "--key-file", required=True, metavar="FILE", help="the private key (PEM, 0600)"
    )
    public.add_argument(
        "--name",
        help="print the C2SP verifier key under this name (a witness's --name, a log's"
        " origin) instead of ed25519:...",
    )
    public.set_defaults(run=_key_public)

    erase = commands.add_parser(
        "erase", help="destroy a data subject's keys: its personal fields become unreadable"
    )
    erase.add_argument("--db", required=True, help="the journal: a file or a postgresql:// URL")
    erase.add_argument(
        "--keys",
        metavar="FILE",
        help="the subject key store (default: $DIRK_SUBJECT_KEYS, else"
        " <journal>.keys beside a SQLite journal)",
    )
    target = erase.add_mutually_exclusive_group(required=True)
    target.add_argument("--subject", help="the data subject to erase (as its kind names it)")
    target.add_argument(
        "--expired", action="store_true", help="every subject past its kind's retention"
    )
    erase.add_argument("--operator", help="who erases (recorded)")
    erase.add_argument("--reason", default="", help="why (recorded)")
    erase.add_argument(
        "--list", action="store_true", help="with --expired: only list them, erase nothing"
    )
    erase.set_defaults(run=_erase)


def _signing_key(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--key-file",
        metavar="PATH",
        help="the checkpoint key (PEM, mode 0600; default: $DIRK_CHECKPOINT_KEY_FILE, else"
        " the PEM text in $DIRK_CHECKPOINT_KEY)",
    )


def public_keys(paths: list[str]) -> KeySet:
    """Read the public keys in the files ``paths``.

    Raises:
        NoteError: a file that cannot be read or holds no key.
    """
    keys: list[Any] = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise NoteError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
        keys += read_keys(text).keys
    return KeySet(tuple(keys))


async def _checkpoint(args: argparse.Namespace) -> int:
    try:
        key = load_signing_key(args.key_file)
    except KeyUnusable as exc:
        return error(CliError.KEY_UNUSABLE, str(exc), ExitCode.USAGE)
    try:
        # Read-only: a kernel may be writing this journal; only tree_heads is written.
        async with open_journal(args.db, readonly=True) as journal:
            signer = Signer(key, args.origin or default_origin(journal.journal_id))
            size = journal.head_seq
            note = signer.sign(size, await journal.trees().root(size))
        await _keep(args.db, size, note)
        async with open_publishers(args.publish) as publishers:
            await publish_all(publishers, signer.origin, size, note)
    except JournalError as exc:
        return error_of(exc, ExitCode.USAGE)
    except NoteError as exc:
        return error(CliError.BAD_ARGUMENT, f"--origin: {exc}", ExitCode.USAGE)
    say(f"checkpoint: signed events 1..{size} of {signer.origin} with {signer.public}")
    # The kernel records the keys it signs with (CheckpointKeyChanged); this command
    # writes no event, so a kernel writing the journal meanwhile is never disturbed.
    sys.stdout.write(note)
    return ExitCode.OK


async def _latest_covering(journal: Journal, seq: int) -> tuple[int, str] | None:
    heads = [(size, note) for size, note in await journal.tree_heads() if size >= seq]
    return heads[-1] if heads else None


async def _prove(args: argparse.Namespace) -> int:
    if args.consistency is not None and args.tlog_proof:
        return error(
            CliError.BAD_ARGUMENT,
            "--tlog-proof proves events (--event, --flow), not consistency",
            ExitCode.USAGE,
        )
    try:
        async with open_journal(args.db, readonly=True) as journal:
            if args.consistency is not None:
                old, new = args.consistency
                return await _prove_consistency(journal, old, new, args.json)
            events = await _selected(journal, args)
            if isinstance(events, int):
                return events
            proven = await _inclusions(journal, events)
            if isinstance(proven, int):
                return proven
            proofs, size, note = proven
    except JournalError as exc:
        return error_of(exc, ExitCode.USAGE)
    root = parse_checkpoint(split_note(note)[0]).root
    for event, proof in proofs:
        # Never print a proof that does not hold: the store's nodes may have been altered.
        if not verify_inclusion(event.seq - 1, size, leaf_hash(_bare(event)), proof, root):
            return error(
                CliError.PROOF_FAILED,
                f"the proof of event {event.seq} does not match the signed checkpoint of {size}"
                " events: run dirk verify",
            )
    return _print_proofs(args, proofs, size, note, root)


async def _selected(journal: Journal, args: argparse.Namespace) -> list[Event] | int:
    """The events ``dirk prove`` was asked for (--event or --flow), or the error's status."""
    if args.event is not None:
        within = 1 <= args.event <= journal.head_seq
        events = await journal.read(args.event, args.event + 1) if within else []
        if not events:
            return error(CliError.UNKNOWN_SEQ, f"no event {args.event} in the journal")
        return events
    events = await journal.flow_events(args.flow)
    if not events:
        return error(CliError.UNKNOWN_FLOW, f"no flow {args.flow} in the journal")
    return events


async def _inclusions(
    journal: Journal, events: list[Event]
) -> tuple[list[tuple[Event, list[bytes]]], int, str] | int:
    """Each event's proof against the latest checkpoint covering them, its size and note."""
    covering = await _latest_covering(journal, events[-1].seq)
    if covering is None:
        return error(
            CliError.NO_CHECKPOINT,
            f"no signed checkpoint covers event {events[-1].seq}: dirk checkpoint signs one",
        )
    size, note = covering
    trees = journal.trees()
    # A derived event (a FlowClosed with no row of its own) is proven by its row's.
    rows = [event for event in events if not is_derived(event)]
    return [(event, await trees.inclusion(event.seq, size)) for event in rows], size, note


def _print_proofs(
    args: argparse.Namespace,
    proofs: list[tuple[Event, list[bytes]]],
    size: int,
    note: str,
    root: bytes,
) -> int:
    """Print proofs that hold (as JSON, or as tlog-proofs), and write them under --tlog-proof."""
    if args.tlog_proof:
        texts = [(e.seq, tlog_proof(e.seq - 1, proof, note, _bare(e))) for e, proof in proofs]
        failed = _write_tlog_proofs(args.tlog_proof, texts)
        if failed is not None:
            return failed
    if args.json:
        print_json(
            {
                "size": size,
                "root": base64.b64encode(root).decode(),
                "checkpoint": note,
                "events": [
                    {
                        "seq": event.seq,
                        "index": event.seq - 1,
                        "event": base64.b64encode(_bare(event)).decode(),
                        "leaf": leaf_hash(_bare(event)).hex(),
                        "proof": [h.hex() for h in proof],
                    }
                    for event, proof in proofs
                ],
            }
        )
        return ExitCode.OK
    for n, (event, proof) in enumerate(proofs):
        if n:
            sys.stdout.write("\n")
        # c2sp.org/tlog-proof@v1, the event's canonical bytes as its extra data.
        sys.stdout.write(tlog_proof(event.seq - 1, proof, note, _bare(event)))
    return ExitCode.OK


async def _prove_consistency(journal: Journal, old: int, new: int, as_json: bool) -> int:
    if not 0 < old <= new <= journal.head_seq:
        return error(
            CliError.BAD_ARGUMENT,
            f"need 0 < OLD <= NEW <= {journal.head_seq} (the journal's events)",
            ExitCode.USAGE,
        )
    trees = journal.trees()
    proof = await trees.consistency(old, new)
    old_root, new_root = await trees.root(old), await trees.root(new)
    if not verify_consistency(old, new, proof, old_root, new_root):
        return error(CliError.PROOF_FAILED, "the tree's stored nodes do not hold: run dirk verify")
    if as_json:
        print_json(
            {
                "old": old,
                "new": new,
                "old_root": base64.b64encode(old_root).decode(),
                "new_root": base64.b64encode(new_root).decode(),
                "proof": [base64.b64encode(h).decode() for h in proof],
            }
        )
        return ExitCode.OK
    # The body of a tlog-witness add-checkpoint request, before its checkpoint.
    sys.stdout.write(f"old {old}\n" + "".join(base64.b64encode(h).decode() + "\n" for h in proof))
    return ExitCode.OK


def _witness_of(args: argparse.Namespace) -> Witness | int:
    """The witness ``dirk witness`` runs as (its key, the log's key, its state), or a status."""
    try:
        keys = public_keys([args.log_key])
        key = load_private_key(Path(args.key_file))
    except NoteError as exc:
        return error(CliError.KEY_UNUSABLE, f"--log-key: {exc}", ExitCode.USAGE)
    except KeyUnusable as exc:
        return error(CliError.KEY_UNUSABLE, str(exc), ExitCode.USAGE)
    try:
        return Witness(args.name, key, list(keys.keys), Path(args.state))
    except WitnessRefused as exc:
        return error(CliError.WITNESS_REFUSED, exc.detail, ExitCode.USAGE)


async def _witness(args: argparse.Namespace) -> int:
    witness = _witness_of(args)
    if isinstance(witness, int):
        return witness
    try:
        async with open_journal(args.db, readonly=True) as journal:
            heads = await journal.tree_heads()
            if not heads:
                return error(CliError.NO_CHECKPOINT, "the journal has no signed checkpoint")
            size, note = heads[-1]
            old = witness.size
            if witness.state is not None and size == old and note == witness.state.note:
                say(f"witness: nothing new (events 1..{size} cosigned already)")
                return ExitCode.OK
            proof = await journal.trees().consistency(old, size) if 0 < old <= size else []
    except JournalError as exc:
        return error_of(exc, ExitCode.USAGE)
    try:
        cosigned = witness.add_checkpoint(old, proof, note, int(time.time()))
    except WitnessRefused as exc:
        return error(CliError.WITNESS_REFUSED, f"{exc.status}: {exc.detail}")
    await _keep_cosigned(args, size, note, cosigned)
    say(f"witness: cosigned events 1..{size} (after {old}) as {args.name}")
    sys.stdout.write(cosigned)
    return ExitCode.OK


async def _keep_cosigned(args: argparse.Namespace, size: int, note: str, cosigned: str) -> None:
    """Keep the cosigned checkpoint beside the journal, and publish it under --out."""
    try:
        await _keep(args.db, size, cosigned)
    except (JournalError, NoteError) as exc:
        say(f"witness: note: the journal keeps its own copy ({getattr(exc, 'detail', exc)})")
    if args.out:
        async with open_publishers([args.out]) as publishers:
            origin = parse_checkpoint(split_note(note)[0]).origin
            await publishers[0].publish(origin, size, cosigned)


async def _keep(location: str, size: int, note: str) -> None:
    """Keep a (co)signed checkpoint beside the journal's events, never writing an event."""
    from kernel.journal.port import backend_for

    backend: Any = backend_for(location)
    await anyio.to_thread.run_sync(backend.add_tree_head, location, size, note)


def _write_tlog_proofs(folder: str, proofs: list[tuple[int, str]]) -> int | None:
    """Write each proof to ``<folder>/event-<seq>.tlog-proof``, never over a file.

    Returns None once all are written, else the status after printing the error.
    """
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        for seq, text in proofs:
            where = Path(folder) / f"event-{seq}.tlog-proof"
            fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as out:
                out.write(text.encode())
    except OSError as exc:
        named = exc.filename or folder
        return error(
            CliError.BAD_ARGUMENT, f"--tlog-proof {named}: {exc.strerror or exc}", ExitCode.USAGE
        )
    return None


async def _key_public(args: argparse.Namespace) -> int:
    try:
        key = load_private_key(Path(args.key_file))
    except KeyUnusable as exc:
        return error(CliError.KEY_UNUSABLE, str(exc), ExitCode.USAGE)
    if args.name is None:
        print(public_text(key))
        return ExitCode.OK
    try:
        print(vkey(args.name, ED25519, raw_public(key)))
    except NoteError as exc:
        return error(CliError.BAD_ARGUMENT, f"--name: {exc}", ExitCode.USAGE)
    return ExitCode.OK


async def _export(args: argparse.Namespace) -> int:
    try:
        async with open_journal(args.db, readonly=True) as journal:
            bundle = await export_bundle(journal, args.flow)
    except JournalError as exc:
        return error_of(exc, ExitCode.USAGE)
    except BundleError as exc:
        code = CliError.UNKNOWN_FLOW if "no flow" in str(exc) else CliError.NO_CHECKPOINT
        return error(code, str(exc))
    data = json.dumps(bundle, indent=1, sort_keys=True).encode() + b"\n"
    if args.tlog_proof:
        failed = _write_tlog_proofs(args.tlog_proof, tlog_proofs(bundle))
        if failed is not None:
            return failed
    try:
        fd = os.open(args.bundle, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exc:
        return error(
            CliError.BAD_ARGUMENT, f"--bundle {args.bundle}: {exc.strerror}", ExitCode.USAGE
        )
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    say(
        f"export: flow {args.flow}: {len(bundle['events'])} events proven against the checkpoint"
        f" of {parse_checkpoint(split_note(bundle['checkpoint'])[0]).size} events of"
        f" {redact(args.db)} -> {args.bundle} ({len(data)} bytes)"
    )
    return ExitCode.OK


async def _verify_bundle(args: argparse.Namespace) -> int:
    try:
        keys = public_keys(args.public_key)
    except NoteError as exc:
        return error(CliError.KEY_UNUSABLE, f"--public-key: {exc}", ExitCode.USAGE)
    try:
        data = await anyio.Path(args.bundle).read_bytes()
    except OSError as exc:
        return error(CliError.BAD_ARGUMENT, f"{args.bundle}: {exc.strerror}", ExitCode.USAGE)
    try:
        checked = verify_bundle(data, keys, args.quorum)
    except BundleError as exc:
        say(f"verify-bundle: FAILED: {exc}")
        return ExitCode.FAILED
    if args.json:
        print_json({"ok": True, "dfid": checked.dfid, "origin": checked.origin,
                    "size": checked.size, "events": checked.events,
                    "witnesses": checked.witnesses, "packs": checked.packs})  # fmt: skip
        return ExitCode.OK
    say(
        f"verify-bundle: ok: flow {checked.dfid}, events {', '.join(map(str, checked.events))}"
        f" are in the tree of {checked.size} events of {checked.origin}, signed by a key given"
        f" ({checked.witnesses} witness cosignatures); packs {', '.join(checked.packs) or '-'}"
    )
    return ExitCode.OK


async def _erase(args: argparse.Namespace) -> int:
    from kernel.proofs.erasure import ErasureError, SubjectKeys, keys_location

    bad = _erase_arguments(args)
    if bad is not None:
        return bad
    location = keys_location(args.db, args.keys)
    if location is None or not await anyio.Path(location).exists():
        return error(
            CliError.KEY_UNUSABLE,
            f"no subject key store at {location or '(none given)'}: --keys FILE",
            ExitCode.USAGE,
        )
    try:
        keys = SubjectKeys(location)
    except ErasureError as exc:
        return error(CliError.KEY_UNUSABLE, str(exc), ExitCode.USAGE)
    try:
        if args.subject is not None:
            targets = [(args.subject, "")]
        else:
            targets = _past_retention(keys)
            if args.list:
                for subject, why in targets:
                    say(f"erase: {subject} is past its {why}")
                say(f"erase: {len(targets)} subjects past their retention")
                return ExitCode.OK
        for subject, why in targets:
            count = keys.erase(subject, args.operator, args.reason, why)
            say(
                f"erase: {subject}: {count} keys destroyed; the kernel records it"
                " (SubjectErased) when it runs"
            )
    finally:
        keys.close()
    return ExitCode.OK


def _erase_arguments(args: argparse.Namespace) -> int | None:
    """Refuse ``dirk erase``'s arguments that are no ids or free text (the status), or None."""
    from kernel.core.text import free_text_problem, id_problem

    for name in ("subject", "operator"):
        value = getattr(args, name)
        problem = id_problem(value) if value is not None else None
        if problem:
            return error(CliError.BAD_ARGUMENT, f"--{name}: {problem}", ExitCode.USAGE)
    problem = free_text_problem(args.reason)
    if problem:
        return error(CliError.BAD_ARGUMENT, f"--reason: {problem}", ExitCode.USAGE)
    if not args.list and not args.operator:
        return error(CliError.BAD_ARGUMENT, "an erasure names its --operator", ExitCode.USAGE)
    return None


def _past_retention(keys: SubjectKeys) -> list[tuple[str, str]]:
    """The subjects whose key was last used longer ago than their retention, with why."""
    now = time.time_ns()
    return [
        (subject, f"retention {retention:g} s")
        for subject, used, retention in keys.subjects()
        if retention is not None and used + int(retention * 1e9) < now
    ]
