"""``dirk beliefs`` and the proposition half of ``dirk why``: governed beliefs, read from a journal.

Both fold the journal (``--at SEQ``: as it stood after event SEQ, through the
snapshots ``dirk state`` uses) and show what the belief graph holds: each
proposition with its state, confidence and evidence; or one proposition's
transitions, each with the evidence (id and seq) that caused it. Scores print as
six-decimal strings, exactly as recorded (micro-units).
"""

from __future__ import annotations

import argparse
from typing import Any

from kernel.cli._operator import error
from kernel.cli._read import print_json, say
from kernel.core.reasons import CliError, ExitCode
from kernel.journal.opening import open_journal
from kernel.state.beliefs.graph import BeliefGraph, PropositionRecord
from kernel.state.beliefs.scoring import show
from kernel.state.snapshots import state_at


def add_commands(commands: Any) -> None:
    """Add ``beliefs`` to the ``dirk`` parser's subcommands (``why``: kernel.cli._replay)."""
    beliefs = commands.add_parser(
        "beliefs", help="propositions with their belief state, confidence and evidence"
    )
    beliefs.add_argument("--db", required=True, help="the journal file")
    beliefs.add_argument(
        "--at", type=int, metavar="SEQ", help="as after event SEQ (default: the end)"
    )
    beliefs.add_argument("--task", help="only the propositions of this task")
    beliefs.add_argument("--json", action="store_true", help="the propositions as one object")
    beliefs.set_defaults(run=_beliefs)


async def _graph(db: str, at: int | None) -> tuple[BeliefGraph, int] | int:
    async with open_journal(db, readonly=True) as journal:
        if at is not None and not 0 <= at <= journal.head_seq:
            return error(CliError.UNKNOWN_SEQ, f"{db} has events 1..{journal.head_seq}")
        projections = await state_at(journal, at)
    return projections.beliefs, projections.last_seq


def _evidence(graph: BeliefGraph, p: PropositionRecord) -> list[dict[str, Any]]:
    rows = []
    refuted = graph.refuted(p.proposition)
    for stance, items in (("supports", p.support), ("contradicts", p.contradiction)):
        for item in items:
            row = {"stance": stance, "group": item.group, "seq": item.seq, "at_ns": item.at_ns}
            if stance == "contradicts" and item.observation in refuted:
                # Kept as history; no longer counted: it supports a rival a failed test refuted.
                row["refuted"] = True
            rows.append(row)
    return sorted(rows, key=lambda r: r["seq"])


def _row(graph: BeliefGraph, p: PropositionRecord) -> dict[str, Any]:
    last = p.transitions[-1] if p.transitions else None
    return {
        "proposition": p.proposition,
        "text": p.text,
        "state": str(p.state),
        "layer": p.layer,
        "task": p.task,
        "volatility": p.volatility,
        "confidence": show(last.confidence) if last else "",
        "support": show(last.support) if last else "",
        "contradiction": show(last.contradiction) if last else "",
        "freshness": show(last.freshness) if last else "",
        "assessed_at_ns": last.at_ns if last else 0,
        "evidence": _evidence(graph, p),
        "observations": list(p.observations),
        "tests": list(p.tests),
    }


async def _beliefs(args: argparse.Namespace) -> int:
    found = await _graph(args.db, args.at)
    if isinstance(found, int):
        return found
    graph, last_seq = found
    rows = [
        _row(graph, p)
        for p in graph.propositions.values()
        if args.task is None or p.task == args.task
    ]
    if args.json:
        print_json({"last_seq": last_seq, "propositions": rows})
        return ExitCode.OK
    if not rows:
        say("no propositions")
        return ExitCode.OK
    for row in rows:
        say(
            f"{row['proposition']}: {row['state']} confidence {row['confidence']}"
            f" ({row['layer']}, task {row['task']}) {row['text']!r}"
        )
        for e in row["evidence"]:
            refuted = " (refuted rival: not counted)" if e.get("refuted") else ""
            say(f"  {e['stance']:<11} group {e['group']} (#{e['seq']}){refuted}")
    return ExitCode.OK


async def why_proposition(args: argparse.Namespace) -> int:
    """``dirk why PROPOSITION``: its transitions and the evidence that caused each."""
    found = await _graph(args.db, getattr(args, "at", None))
    if isinstance(found, int):
        return found
    graph, _ = found
    p = graph.propositions.get(args.rule)
    if p is None:
        return error(CliError.UNKNOWN_RULE, f"no rule or proposition {args.rule!r} in {args.db}")
    transitions = [
        {
            "seq": t.seq,
            "from": t.from_state,
            "to": t.to_state,
            "cause": t.cause,
            "evidence": t.evidence,
            "evidence_seq": t.evidence_seq,
            "confidence": show(t.confidence),
            "support": show(t.support),
            "contradiction": show(t.contradiction),
            "support_groups": t.support_groups,
            "contradiction_groups": t.contradiction_groups,
            "freshness": show(t.freshness),
            "at_ns": t.at_ns,
        }
        for t in p.transitions
    ]
    if args.json:
        print_json({**_row(graph, p), "transitions": transitions})
        return ExitCode.OK
    say(f"proposition {p.proposition}: {p.state} ({p.layer}) {p.text!r}")
    say(f"  derived from {', '.join(p.derived_from) or '-'}")
    say("transitions:")
    for t in transitions:
        say(
            f"  #{t['seq']} {t['from'] or '(new)'} -> {t['to']} by {t['cause']}"
            f" {t['evidence']} (#{t['evidence_seq']}): confidence {t['confidence']},"
            f" support {t['support']} in {t['support_groups']} group(s),"
            f" contradiction {t['contradiction']} in {t['contradiction_groups']},"
            f" freshness {t['freshness']}"
        )
    return ExitCode.OK
