"""The end-of-run summary, computed from the journal alone.

Nothing here reads an agent's counters: the summary is a fold of the recorded
events (and the projection they give), so it says what the log can prove, and
`dirk verify` checks the same log.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from kernel import Signing, write_signing_key
from kernel.audit import (
    Budgets,
    Event,
    Grants,
    Projections,
    check_checkpoints,
    fold,
    open_journal,
    read_keys,
    redact,
    verify_journal,
)
from kernel.audit import events as ev
from kernel.policy import format_money

ENDINGS = {"approve": "approved", "override": "approved", "modify": "modified"}


async def read_events(db: Path | str) -> list[Event]:
    """Every event of the journal at ``db``, read-only."""
    async with open_journal(db, readonly=True) as journal:
        return [event async for batch in journal.scan() for event in batch]


def reason_codes(events: Sequence[Event]) -> Counter[str]:
    """Every reason code the log records for a refusal, an escalation or an ending."""
    codes: Counter[str] = Counter()
    for event in events:
        match event.payload:
            case ev.ProposalRejected(feedback=feedback):
                codes[str(feedback.reason_code)] += 1
            case ev.FlowEscalated(reason_code=code) | ev.FlowAborted(reason_code=code):
                codes[str(code)] += 1
            case ev.SubmissionRefused(reason_code=code):
                codes[str(code)] += 1
            case ev.FlowCompensated():
                codes["COMPENSATED"] += 1
    return codes


def escalation_endings(events: Sequence[Event]) -> Counter[str]:
    """How each escalation ended: approved, modified, rejected, expired or still pending."""
    open_: dict[str, int] = {}
    endings: Counter[str] = Counter()
    for event in events:
        dfid = event.dfid or ""
        match event.payload:
            case ev.FlowEscalated():
                open_[dfid] = open_.get(dfid, 0) + 1
            case ev.HumanDecided(decision=decision) if open_.get(dfid):
                open_[dfid] -= 1
                endings[ENDINGS.get(decision, "rejected")] += 1
            case ev.FlowAborted() if open_.get(dfid):
                open_[dfid] -= 1
                endings["expired" if event.payload.reason_code == "EXPIRED" else "aborted"] += 1
    endings["pending"] += sum(open_.values())
    return +endings


def money_spent(projections: Projections, now_ns: int) -> dict[str, str]:
    """What each money budget spent (within its window, at ``now_ns``), formatted."""
    spent = projections.domain(Budgets)
    shown: dict[str, str] = {}
    for pool in sorted(spent.spent_in):
        name = pool.split(":")[2].split("@")[0]
        scope = ":".join(pool.split(":")[3:])
        currency = pool.split(":")[1]
        shown[f"{name} ({scope})"] = format_money(spent.spent(pool, now_ns), currency)
    return shown


def quorum_votes(events: Sequence[Event]) -> dict[str, int]:
    """Votes cast on approvals that needed more than one operator, and quorums met."""
    votes = [e.payload for e in events if isinstance(e.payload, ev.ApprovalVoted)]
    return {"votes": len(votes), "met": sum(v.met for v in votes)}


def grant_uses(projections: Projections) -> dict[str, str]:
    """Each standing grant's uses so far, as ``used of uses``."""
    grants = projections.domain(Grants).grants.values()
    return {g.grant: f"{g.used} of {g.uses} ({g.status})" for g in grants}


def projection_hash(projections: Projections) -> str:
    """The journal's projection hash (ESAA's), as ``dirk state`` and checkpoints compute it."""
    return projections.digest()


def key_files(files: Path) -> tuple[Path, Path]:
    """Where a run keeps its checkpoint key and its public half: beside its files."""
    return files.with_name(f"{files.stem}.checkpoint.pem"), files.with_name(
        f"{files.stem}.checkpoint.pub"
    )


def checkpoint_signing(files: Path) -> Signing:
    """Make the run's checkpoint key (kept beside its files, mode 0600) and sign with it."""
    private, public = key_files(files)
    if not private.exists():
        public.write_text(write_signing_key(private) + "\n")
    # Signed when the run ends: the examples' clock jumps ahead on every sleep, so a
    # signing cadence on it would move the simulation's time.
    return Signing(key_file=str(private), every_s=None)


def public_key_of(files: Path) -> Path | None:
    """The public key a run signed its checkpoints with, if it made one."""
    public = key_files(files)[1]
    return public if public.exists() else None


async def checkpoints_line(db: Path | str, public_key: Path, events: int) -> tuple[bool, str]:
    """Check the journal's signed checkpoints with the public key alone; say what they cover."""
    keys = read_keys(await anyio.Path(public_key).read_text())
    async with open_journal(db, readonly=True) as journal:
        checked = await check_checkpoints(await journal.tree_heads(), events, keys, journal.trees())
    if not checked.ok:
        return False, "; ".join(checked.problems)
    return True, f"signed; the latest covers all {checked.covered} events"


async def summarize(
    db: Path | str, example_kinds: Sequence[str] = (), public_key: Path | None = None
) -> dict[str, Any]:
    """Return the run's summary, read from the journal at ``db``.

    With ``public_key`` the signed checkpoints are checked with it too (``dirk verify
    --public-key``): ``verified`` then covers them.
    """
    events = await read_events(db)
    projections = fold(events)
    flows = projections.flows.values()
    duplicates = Counter(
        e.payload.source for e in events if isinstance(e.payload, ev.DuplicateSuppressed)
    )
    duplicates["adapter"] = sum(
        int(e.payload.detail.get("duplicates_absorbed", 0))
        for e in events
        if isinstance(e.payload, ev.ExecutionSucceeded | ev.CompensationSucceeded)
    )
    compensated = [f.dfid for f in flows if f.status == "COMPENSATED"]
    interesting = compensated or [
        f.dfid for f in flows if f.proposal and f.proposal.kind in example_kinds
    ]
    report = await verify_journal(db)
    now = events[-1].ts if events else 0
    signed, checkpoints = True, "not signed (no key)"
    verify = f"dirk verify --db {redact(str(db))}"
    if public_key is not None and report.ok:
        signed, checkpoints = await checkpoints_line(db, public_key, report.events)
        verify += f" --public-key {public_key}"
    return {
        "budget_used": money_spent(projections, now),
        "quorum_votes": quorum_votes(events),
        "grant_uses": grant_uses(projections),
        # The journal's events, as its head counts them: a FlowClosed derived from its
        # success (kernel.core.events.with_derived) is read but has no row of its own.
        "events": events[-1].seq if events else 0,
        "flows": dict(sorted(Counter(str(f.status) for f in flows).items())),
        "reason_codes": dict(sorted(reason_codes(events).items())),
        "effects_executed": sum(isinstance(e.payload, ev.ExecutionSucceeded) for e in events),
        "duplicates_prevented": sum(duplicates.values()),
        "duplicates_by_source": dict(sorted((+duplicates).items())),
        "escalations": sum(isinstance(e.payload, ev.FlowEscalated) for e in events),
        "escalation_endings": dict(sorted(escalation_endings(events).items())),
        "needs_review": len({e.dfid for e in events if isinstance(e.payload, ev.FlowFlagged)}),
        "compensations": sum(isinstance(e.payload, ev.CompensationSucceeded) for e in events),
        "flows_compensated": len(compensated),
        "projection_hash": projection_hash(projections),
        "verified": report.ok and signed,
        "checkpoints": checkpoints,
        # A database URL is shown without its password, as dirk shows it.
        "inspect": f"dirk show {interesting[0]} --db {redact(str(db))}" if interesting else "",
        "verify": verify,
    }


def show(title: str, summary: dict[str, Any], as_json: bool) -> None:
    """Print the summary: as lines for people, or as one JSON object on the last line."""
    if as_json:
        print(json.dumps(summary, sort_keys=True))
        return
    print(f"{title}: {summary['events']} events")
    print(f"  flows by final state   {summary['flows']}")
    print(f"  reason codes           {summary['reason_codes']}")
    print(f"  effects executed       {summary['effects_executed']}")
    print(
        f"  duplicates prevented   {summary['duplicates_prevented']}"
        f" {summary['duplicates_by_source']}"
    )
    print(f"  escalations            {summary['escalations']} {summary['escalation_endings']}")
    print(f"  flagged for review     {summary['needs_review']} flows (soft guards)")
    print(f"  budget used            {summary['budget_used'] or 'no money budget'}")
    votes = summary["quorum_votes"]
    print(f"  quorum votes           {votes['votes']} cast, {votes['met']} quorums met")
    print(f"  grant uses             {summary['grant_uses'] or 'no standing grant'}")
    print(
        f"  compensations          {summary['compensations']} steps undone in"
        f" {summary['flows_compensated']} flows"
    )
    for key, label in sorted(summary.items()):
        if key.startswith("story."):
            print(f"  {key[6:]:<22} {label}")
    print(f"  projection hash        {summary['projection_hash']}")
    print(f"  checkpoints            {summary['checkpoints']}")
    print(f"  journal verified       {summary['verified']}")
    if summary["inspect"]:
        print(f"inspect a flow:  {summary['inspect']}")
    print(f"verify the log:  {summary['verify']}")
    sys.stdout.flush()


def journal_and_files(db: str | None, name: str) -> tuple[Path | str, Path]:
    """Return where ``--db`` puts the journal (a file, or a ``postgresql://`` URL as given),
    and the file beside which the run's simulated systems keep their own state."""
    if db and db.startswith(("postgresql://", "postgres://")):
        return db, Path(tempfile.mkdtemp(prefix="dirk-")) / name
    path = Path(db) if db else Path(tempfile.mkdtemp(prefix="dirk-")) / name
    return path, path
