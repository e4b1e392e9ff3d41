"""``dirk verify`` and ``dirk anchor``: prove a journal's chain, projections and verdicts."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
from collections.abc import Sequence
from typing import Any

from kernel.artifacts import artifacts_beside
from kernel.audit.reverify import PackPathError, Rejudged
from kernel.audit.verification import verify_all
from kernel.cli._artifacts import check_artifacts, recorded_artifacts
from kernel.cli._operator import error, error_of
from kernel.cli._proofs import public_keys
from kernel.cli._read import print_json, say
from kernel.cli._replay import packs_from, rejudge_verdicts, verdict_lines
from kernel.core.events import DriftBreached
from kernel.core.flow import IllegalTransition
from kernel.core.notes import NoteError
from kernel.core.reasons import CliError, ExitCode
from kernel.journal.errors import redact
from kernel.journal.head import CHAIN_KEY_ENV
from kernel.journal.opening import open_journal
from kernel.journal.store import (
    JournalCorrupt,
    JournalError,
    JournalKeyError,
    chain_key_from,
    chain_key_from_env,
)
from kernel.journal.verify import Anchor, VerifyReport, parse_anchor, verify_journal
from kernel.policy.packs import PolicyPack
from kernel.proofs.check import KeySet, check_checkpoints
from kernel.state.drift import monitors_of, unproven
from kernel.state.snapshots import ProjectionReport


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``verify`` and ``anchor``."""
    verify = commands.add_parser("verify", help="recompute the hash chain and the projections")
    verify.add_argument("--db", required=True, help="the journal: a file or a postgresql:// URL")
    verify.add_argument(
        "--json", action="store_true", help="the outcome and what was found as one JSON object"
    )
    verify.add_argument(
        "--verdicts",
        action="store_true",
        help="also re-judge every recorded verdict with the packs given by --pack",
    )
    verify.add_argument(
        "--pack",
        action="append",
        default=[],
        metavar="PATH",
        help="a pack the journal was judged by: FILE.py[:ATTR] or MODULE[:ATTR] (repeatable)",
    )
    verify.add_argument(
        "--anchor",
        metavar="LINE_OR_FILE",
        help="also prove the journal still holds this anchor (a line from dirk anchor, or a file)",
    )
    verify.add_argument(
        "--artifacts",
        metavar="LOCATION",
        help="the artifact store whose bytes the references must still hash to"
        " (default: beside the journal)",
    )
    verify.add_argument(
        "--public-key",
        action="append",
        default=[],
        metavar="FILE",
        help="check every signed checkpoint with these public keys (the log's, and witnesses'"
        " verifier keys), and that they cover every event (repeatable)",
    )
    verify.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="FILE",
        help="a signed checkpoint kept elsewhere: the journal must still hold the history it"
        " signed (catches truncation, rollback and forks; needs --public-key; repeatable)",
    )
    _key_file_argument(verify)
    verify.set_defaults(run=_verify)

    anchor = commands.add_parser(
        "anchor", help="verify the chain and print its head as one line to keep elsewhere"
    )
    anchor.add_argument("--db", required=True, help="the journal: a file or a postgresql:// URL")
    anchor.add_argument("--json", action="store_true", help="the anchor as one JSON object")
    _key_file_argument(anchor)
    anchor.set_defaults(run=_anchor)


def _key_file_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--key-file",
        metavar="PATH",
        help=f"the chain key of a keyed journal, read from this file (default: ${CHAIN_KEY_ENV})",
    )


def _chain_key(args: argparse.Namespace) -> bytes | None:
    """Return the chain key from ``--key-file`` or the environment (never from argv)."""
    if args.key_file is None:
        return chain_key_from_env(None, args.db)
    try:
        with open(args.key_file, "rb") as file:
            # A trailing newline is the editor's, not the key's.
            return chain_key_from(file.read().rstrip(b"\r\n"), args.db)
    except OSError as exc:
        raise JournalKeyError(args.db, f"the key file cannot be read ({exc.strerror})") from exc


def _signed_args(args: argparse.Namespace) -> tuple[KeySet, list[str]] | None:
    """Return the public keys and the checkpoints kept elsewhere that were given, if any."""
    if not args.public_key:
        return None
    keys = public_keys(args.public_key)
    earlier = []
    for path in args.checkpoint:
        with open(path, encoding="utf-8") as file:
            earlier.append(file.read())
    return keys, earlier


def _tree_line(report: VerifyReport) -> str:
    if not report.tree_stored:
        kept = "the store keeps none yet: a journal from before trees, built on its next open"
    else:
        kept = "its stored nodes match the events"
    heads = len(report.tree_heads)
    return (
        f"verify: tree ok (root {report.tree_root[:16]}; {kept}; {heads} signed checkpoints"
        " match the events)"
    )


def _anchor_arg(args: argparse.Namespace) -> Anchor | None:
    if args.anchor is None:
        return None
    text = args.anchor
    if not text.startswith("dirk-anchor ") and os.path.isfile(text):
        with open(text, encoding="utf-8", errors="replace") as file:
            text = file.read()
    return parse_anchor(text)


async def _failed_file(
    command: str, db: str, problem: str, found: dict[str, Any] | None = None
) -> None:
    """Print one FAILED line for a file that is not a readable journal, naming the condition."""
    code = ""
    try:
        async with open_journal(db, readonly=True):
            pass
    except JournalError as exc:
        code, problem = f"{exc.code}: ", exc.detail
    except Exception as exc:
        code, problem = f"{JournalCorrupt.code}: ", f"{problem} ({exc!r})"
    # A journal that opens fails for what verify found (a key, an anchor), said as it is.
    say(f"{command}: FAILED: {code}journal {redact(db)}: {problem}")
    if found is not None:
        found["failure"] = {"code": code.removesuffix(": ") or None, "problem": problem}


async def _anchor(args: argparse.Namespace) -> int:
    try:
        key = _chain_key(args)
    except JournalKeyError as exc:
        return error_of(exc, ExitCode.USAGE)
    report = await verify_journal(args.db, chain_key=key)
    if not report.ok:
        if report.first_bad_seq is None:
            await _failed_file("anchor", args.db, report.problem)
        else:
            say(f"anchor: FAILED at seq {report.first_bad_seq}: {report.problem}")
        return ExitCode.FAILED
    anchor = report.anchor()
    if args.json:
        print(
            json.dumps(
                {"ok": True, "anchor": anchor.line(), "seq": anchor.seq, "hash": anchor.hash}
            )
        )
    else:
        say(anchor.line())
    return ExitCode.OK


async def _verify(args: argparse.Namespace) -> int:
    """``dirk verify``: lines for people, or with ``--json`` one document of what was found.

    The document has fixed keys: ``ok``; ``events`` and ``head`` (what checked out);
    ``chain`` (``ok``, ``first_bad_seq``, ``problem``, ``head_record``, ``keyed``),
    ``projections`` (``ok``, ``digest``, ``checkpoints``, ``snapshots``, ``problems``),
    ``anchor`` (``seq``, ``hash``, ``ok``) and ``verdicts`` (see ``--verdicts``), each
    null when that part was not checked (or could not be: the chain failed first);
    ``failure`` (``code``, ``problem``) when the journal is no readable journal; and
    ``lines``, what the text output says, for people reading the JSON.
    """
    if not args.json:
        return await _verify_text(args)
    said = io.StringIO()
    found: dict[str, Any] = {}
    with contextlib.redirect_stdout(said):
        status = await _verify_text(args, found)
    report: VerifyReport | None = found.get("chain")
    replay: ProjectionReport | None = found.get("projections")
    anchor: Anchor | None = found.get("anchor")
    result: Rejudged | None = found.get("verdicts")
    document: dict[str, Any] = {
        "ok": status == ExitCode.OK,
        "events": report.events if report is not None else 0,
        "head": report.head if report is not None else "",
        "chain": None
        if report is None
        else {
            "ok": report.ok,
            "first_bad_seq": report.first_bad_seq,
            "problem": report.problem,
            "head_record": report.head_record,
            "keyed": report.keyed,
        },
        "projections": None
        if replay is None
        else {
            "ok": replay.ok,
            "digest": replay.digest,
            "checkpoints": replay.checkpoints,
            "snapshots": replay.snapshots,
            "problems": list(replay.problems),
        },
        "anchor": None
        if anchor is None
        else {"seq": anchor.seq, "hash": anchor.hash, "ok": bool(report and report.ok)},
        "verdicts": None if result is None else _verdicts_document(result),
        "failure": found.get("failure"),
        "lines": said.getvalue().splitlines(),
    }
    print_json(document)
    return status


def _verdicts_document(result: Rejudged) -> dict[str, Any]:
    """``verify --verdicts --json``: the re-judged verdicts, those that differ, and why."""
    return {
        "ok": not result.mismatches and not result.changes,
        "judged": result.judged,
        "not_compared": result.skipped,
        "mismatches": result.mismatches,
        "changes": result.changes,
    }


async def _verify_text(args: argparse.Namespace, found: dict[str, Any] | None = None) -> int:
    refused = _flags_refused(args)
    if refused is not None:
        return refused
    inputs = _inputs(args)
    if isinstance(inputs, int):
        return inputs
    anchor, signed, key = inputs
    verified = await _verified(args, key, anchor, signed is not None, found)
    if isinstance(verified, int):
        return verified
    report, replay = verified
    _say_chain_notes(report, anchor)
    if signed is not None and not await _signatures_ok(args.db, report, signed):
        return ExitCode.FAILED
    say(
        f"verify: chain ok, projections ok (digest {replay.digest[:16]};"
        f" {replay.checkpoints} checkpoints, {replay.snapshots} snapshots match replay)"
    )
    if not await _artifacts_ok(args):
        return ExitCode.FAILED
    if args.verdicts:
        judged = await _verdicts_judged(args, found)
        if judged is not None:
            return judged
    say(f"verify: ok events={report.events} head={report.head}")
    return ExitCode.OK


async def _verified(
    args: argparse.Namespace,
    key: bytes | None,
    anchor: Anchor | None,
    public_only: bool,
    found: dict[str, Any] | None,
) -> tuple[VerifyReport, ProjectionReport] | int:
    """The chain's report and the projections' replay when both hold, else the exit code."""
    try:
        # The chain, then one fold from scratch of the projections, checked against every
        # checkpoint and snapshot: both from one read of the journal.
        report, replay = await verify_all(
            args.db, chain_key=key, anchor=anchor, public_only=public_only
        )
    except (JournalError, IllegalTransition, ValueError) as exc:
        # The chain checked out, so only what lies outside it (snapshots) can be at fault.
        code = str(getattr(exc, "code", JournalCorrupt.code))
        say(f"verify: FAILED: {code}: {exc}")
        if found is not None:
            found["failure"] = {"code": code, "problem": str(exc)}
        return ExitCode.FAILED
    if found is not None:
        found["chain"], found["projections"], found["anchor"] = report, replay, anchor
    if not report.ok and report.first_bad_seq is None:
        # Not a readable journal rather than a bad event: opening it names the condition.
        await _failed_file("verify", args.db, report.problem, found)
        return ExitCode.FAILED
    if not report.ok:
        say(f"verify: FAILED at seq {report.first_bad_seq}: {report.problem}")
        return ExitCode.FAILED
    if replay is None:  # the journal did not open, though its chain checked out
        await _failed_file("verify", args.db, "it does not open", found)
        return ExitCode.FAILED
    if not replay.ok:
        for problem in replay.problems:
            say(f"verify: FAILED {problem}")
        return ExitCode.FAILED
    return report, replay


def _flags_refused(args: argparse.Namespace) -> int | None:
    """The exit code of flags that do not go together, or None."""
    if args.verdicts and not args.pack:
        return error(
            CliError.BAD_ARGUMENT, "--verdicts needs the packs: --pack PATH", ExitCode.USAGE
        )
    if args.pack and not args.verdicts:
        # Silently ignored, it would read as "the verdicts were checked against this pack".
        return error(
            CliError.BAD_ARGUMENT,
            "--pack names the packs --verdicts re-judges with: give --verdicts too",
            ExitCode.USAGE,
        )
    if args.checkpoint and not args.public_key:
        return error(
            CliError.BAD_ARGUMENT,
            "--checkpoint is checked with the log's public key: give --public-key too",
            ExitCode.USAGE,
        )
    return None


def _inputs(
    args: argparse.Namespace,
) -> tuple[Anchor | None, tuple[KeySet, list[str]] | None, bytes | None] | int:
    """The anchor, the signed checkpoints' keys and the chain key, or a usage error's code."""
    try:
        anchor = _anchor_arg(args)
    except ValueError as exc:
        return error(CliError.BAD_ARGUMENT, f"--anchor: {exc}", ExitCode.USAGE)
    try:
        signed = _signed_args(args)
    except (NoteError, OSError, UnicodeDecodeError) as exc:
        what = getattr(exc, "strerror", None) or exc
        return error(CliError.KEY_UNUSABLE, f"--public-key/--checkpoint: {what}", ExitCode.USAGE)
    try:
        key = _chain_key(args)
    except JournalKeyError as exc:
        # A key that cannot be read or used: verify cannot run as given (docs/integrity.md).
        return error_of(exc, ExitCode.USAGE)
    return anchor, signed, key


def _say_chain_notes(report: VerifyReport, anchor: Anchor | None) -> None:
    if not report.head_record:
        say(
            "verify: note: no head record (a journal from before head records): a removed tail"
            " is not detectable until a kernel opens it for writing; keep an anchor"
        )
    if anchor is not None:
        say(f"verify: anchor ok: event {anchor.seq} ({anchor.hash[:16]}) is in the journal")
    say(_tree_line(report))
    if not report.chain_checked:
        say(
            "verify: note: a keyed chain, checked without its key: its HMACs are not"
            " recomputed; the signed checkpoints below vouch for every event"
        )


async def _signatures_ok(db: str, report: VerifyReport, signed: tuple[KeySet, list[str]]) -> bool:
    """Check the signed checkpoints against the chain's tree heads, saying what was found."""
    keys, earlier = signed
    async with open_journal(db, readonly=True) as journal:
        checked = await check_checkpoints(
            report.tree_heads, report.events, keys, journal.trees(), earlier
        )
    if not checked.ok:
        at = "" if checked.first_bad_seq is None else f" at seq {checked.first_bad_seq}"
        for problem in checked.problems:
            say(f"verify: FAILED{at}: {problem}")
        return False
    say(*(f"verify: {line}" for line in checked.lines))
    return True


async def _artifacts_ok(args: argparse.Namespace) -> bool:
    """Check that every artifact the journal references is stored and hashes to it."""
    referenced = await recorded_artifacts(args.db)
    problems = await check_artifacts(referenced, args.artifacts or artifacts_beside(args.db))
    if problems:
        for problem in problems:
            say(f"verify: FAILED {problem}")
        return False
    if referenced.stored:
        say(f"verify: artifacts ok ({len(referenced.stored)} referenced, every one hashes)")
    return True


async def _verdicts_judged(args: argparse.Namespace, found: dict[str, Any] | None) -> int | None:
    """Judge the verdicts again with ``--pack``: None if they all agree, else the exit code."""
    try:
        result = await rejudge_verdicts(args.db, args.pack)
    except PackPathError as exc:
        return error_of(exc, ExitCode.USAGE)
    if found is not None:
        found["verdicts"] = result
    ok, lines = verdict_lines(result)
    say(*lines)
    drift_ok = await _breaches_derived(args.db, packs_from(args.pack))
    return None if ok and drift_ok else ExitCode.FAILED


async def _breaches_derived(db: str, packs: Sequence[PolicyPack]) -> bool:
    """Whether every recorded drift breach re-derives from the journal (kernel.state.drift)."""
    async with open_journal(db, readonly=True) as journal:
        if not await journal.read(types=["DriftBreached"]):
            return True  # none recorded: nothing read, nothing said
        events = await journal.read()
    failed = unproven(events, monitors_of(packs))
    say(*(f"verify: FAILED drift breach at seq {seq}: {why}" for seq, why in failed))
    breaches = sum(isinstance(e.payload, DriftBreached) for e in events)
    word = "FAILED" if failed else "ok"
    say(f"verify: drift breaches {word}: {breaches - len(failed)} of {breaches} re-derived")
    return not failed
