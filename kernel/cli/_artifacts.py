"""``dirk artifacts``: the documents a journal references, and collecting the unreferenced.

The journal holds references (``ArtifactStored``); the bytes are in the artifact store
beside it (``--artifacts``, by default ``X.artifacts.db`` next to journal ``X.db``, the
same database for a PostgreSQL journal). Listing and ``--dry-run`` read both; ``--gc``
changes them only through the operator inbox, as every operator's change does: a signed
request the running kernel applies once, recording ``ArtifactsCollected`` (who, why,
what) before it deletes any bytes. ``dirk verify`` calls :func:`check_artifacts`.
"""

from __future__ import annotations

import argparse
from typing import Any

from kernel.artifacts import ArtifactStoreError, artifacts_beside, open_artifacts, ref_of
from kernel.cli._operator import (
    add_key_argument,
    error,
    fold_journal,
    post_request,
    refused,
    wait_seconds,
)
from kernel.cli._read import print_json, say
from kernel.core.reasons import ExitCode, ReasonCode
from kernel.inbox import CollectArtifactsRequest, RequestRefused
from kernel.inbox.prepare import checked
from kernel.journal.opening import open_journal
from kernel.state.artifacts import Artifacts, ArtifactState, collectable, live
from kernel.state.projections import Projections


def add_commands(commands: Any) -> None:
    """Add ``artifacts`` to the ``dirk`` parser's subcommands."""
    artifacts = commands.add_parser(
        "artifacts",
        help="list the artifacts a journal references; collect the unreferenced (via the inbox)",
    )
    artifacts.add_argument("--db", required=True, help="the journal: a file or a postgresql:// URL")
    artifacts.add_argument(
        "--artifacts", metavar="LOCATION", help="the artifact store (default: beside the journal)"
    )
    artifacts.add_argument(
        "--gc",
        action="store_true",
        help="collect what no open flow's context, state fact or memory fact references",
    )
    artifacts.add_argument(
        "--dry-run", action="store_true", help="with --gc: only list what would be collected"
    )
    artifacts.add_argument("--operator", help="who collects (recorded; required with --gc)")
    artifacts.add_argument("--reason", help="why (recorded; required with --gc)")
    artifacts.add_argument(
        "--wait",
        type=wait_seconds,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for the kernel to apply it and report the outcome",
    )
    add_key_argument(artifacts)
    artifacts.add_argument("--json", action="store_true", help="one JSON object")
    artifacts.set_defaults(run=_artifacts)


def _facts(projections: Projections) -> list[Any]:
    values = [fact.value for fact in projections.state.values()]
    return values + [fact.value for fact in projections.memory.facts.values()]


async def recorded_artifacts(db: str) -> ArtifactState:
    """Fold the artifact references of the journal at ``db`` (its artifact events only)."""
    projections = Projections(domains=(Artifacts,))
    async with open_journal(db, readonly=True) as journal:
        projections.apply(await journal.read(types=["ArtifactStored", "ArtifactsCollected"]))
    return projections.artifacts


async def check_artifacts(state: ArtifactState, location: str) -> list[str]:
    """Return one line per stored artifact whose bytes are missing or no longer hash to it.

    Every artifact the journal recorded and did not collect is read whole and hashed.
    """
    if not state.stored:
        return []
    problems = []
    try:
        async with open_artifacts(location, readonly=True) as store:
            for ref, record in sorted(state.stored.items()):
                data = await store.get(ref)
                if data is None:
                    problems.append(f"artifact {ref} (#{record.seq}): missing from the store")
                elif ref_of(data) != ref:
                    problems.append(
                        f"artifact {ref} (#{record.seq}): its bytes no longer hash to it"
                    )
    except ArtifactStoreError as exc:
        return [f"artifacts: {len(state.stored)} referenced, unchecked: {exc.detail}"]
    return problems


async def _artifacts(args: argparse.Namespace) -> int:
    projections = await fold_journal(args.db)
    location = args.artifacts or artifacts_beside(args.db)
    if args.gc and not args.dry_run:
        return await _collect(args)
    if args.gc:
        return await _would_collect(args, projections, location)
    return _list(args, projections)


async def _would_collect(args: argparse.Namespace, projections: Projections, location: str) -> int:
    """``--gc --dry-run``: the stored artifacts a collection would take, nothing taken."""
    try:
        async with open_artifacts(location, readonly=True) as store:
            held = await store.refs()
    except ArtifactStoreError as exc:
        return error(ReasonCode.ARTIFACT_MISSING, exc.detail)
    going = collectable(projections.artifacts, _facts(projections), held)
    if args.json:
        print_json({"collectable": going})
    else:
        say(*(f"would collect {ref}" for ref in going) or ["nothing to collect"])
    return ExitCode.OK


def _list(args: argparse.Namespace, projections: Projections) -> int:
    """Every artifact the journal stored, live (referenced) or not."""
    state = projections.artifacts
    kept = live(state, _facts(projections))
    rows = [
        {
            "ref": ref,
            "size": record.size,
            "media_type": record.media_type,
            "summary": record.summary,
            "by": record.by,
            "seq": record.seq,
            "live": ref in kept,
        }
        for ref, record in sorted(state.stored.items())
    ]
    if args.json:
        print_json({"artifacts": rows, "collected": sorted(state.collected)})
        return ExitCode.OK
    for row in rows:
        status = "live" if row["live"] else "unreferenced"
        say(
            f"{row['ref']} {row['size']} bytes {row['media_type']} by {row['by'] or '?'}"
            f" (#{row['seq']}, {status}): {row['summary']}"
        )
    if not rows:
        say("no artifacts")
    return ExitCode.OK


async def _collect(args: argparse.Namespace) -> int:
    if not args.operator or not args.reason:
        return error(
            ReasonCode.SCHEMA_INVALID,
            "collecting names the --operator and a --reason",
            ExitCode.USAGE,
        )
    try:
        request = checked(CollectArtifactsRequest(operator=args.operator, reason=args.reason))
    except RequestRefused as exc:
        return refused(exc)
    return await post_request(args, request, "collecting unreferenced artifacts")
