"""``dirk agents``: every registered agent, its status, and why it has it.

An agent the kernel demoted (its escalation budget spent: the fourth escalation
in an hour by default, ``PolicyPack.escalation_budget``) is PASSIVE, and every
proposal it makes is refused; this list says so, with the recorded reason and
the command that restores it, so a demotion is never silent. A drift monitor's
demotion (kernel.state.drift, operator ``drift``) is shown the same way, with each
monitor's last breach of the agent.
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from kernel.cli._operator import fold_journal
from kernel.cli._read import print_json, say
from kernel.core.events import AgentStatusChanged
from kernel.core.reasons import ExitCode, ReasonCode
from kernel.escalation import KERNEL_OPERATOR
from kernel.journal.opening import open_journal
from kernel.state.drift import OPERATOR as DRIFT
from kernel.state.drift import Drift


def add_commands(commands: Any) -> None:
    """Add ``agents`` to the ``dirk`` parser's subcommands."""
    agents = commands.add_parser("agents", help="list the agents: status, escalations, why")
    agents.add_argument("--db", required=True, help="the journal file")
    agents.add_argument("--json", action="store_true", help="the agents as one JSON array")
    agents.set_defaults(run=_agents)


async def _agents(args: argparse.Namespace) -> int:
    projections = await fold_journal(args.db)
    async with open_journal(args.db, readonly=True) as journal:
        changes = await journal.read(types=["AgentStatusChanged"])
    latest: dict[str | None, AgentStatusChanged] = {}
    for event in changes:
        if isinstance(event.payload, AgentStatusChanged):
            latest[event.agent_id] = event.payload
    breaches = projections.domain(Drift).breaches
    rows = [
        _row(agent_id, str(view.manifest.version), str(view.status), latest.get(agent_id))
        | {"escalations": len(projections.escalations.get(agent_id, ()))}
        | {
            "drift": {
                m: msgspec.to_builtins(b) for m, b in sorted(breaches.get(agent_id, {}).items())
            }
        }
        for agent_id, view in sorted(projections.agents.items())
    ]
    if args.json:
        print_json(rows)
        return ExitCode.OK
    if not rows:
        say(f"no agent ever registered in {args.db}")
    for row in rows:
        why = f"  {row['why']}" if row["why"] else ""
        say(f"{row['agent_id']} {row['version']}: {row['status']}{why}")
        for name, b in row["drift"].items():
            crossed = f"{b['metric']} {b['value']:g} crossed {b['bound']:g}"
            say(f"  drift {name}: {crossed} (seq {b['seq']}, {b['action']})")
        if row["demoted"]:
            say(f"  restore: dirk agent {row['agent_id']} --set ACTIVE --operator ... --reason ...")
    return ExitCode.OK


def _row(
    agent_id: str, version: str, status: str, change: AgentStatusChanged | None
) -> dict[str, Any]:
    """One agent, with why it has its status: the latest change, and whether it was demoted."""
    by_budget = (
        change is not None
        and change.operator == KERNEL_OPERATOR
        and change.reason.startswith(str(ReasonCode.ESCALATION_BUDGET_EXHAUSTED))
    )
    by_drift = change is not None and change.operator == DRIFT
    demoted = status in ("PASSIVE", "SUSPENDED") and (by_budget or by_drift)
    why = ""
    if change is not None:
        who = f"by {change.operator or '?'}"
        if demoted:
            who = "demoted by a drift monitor" if by_drift else "demoted by the kernel"
        why = f"({who}: {change.reason})"
    return {
        "agent_id": agent_id,
        "version": version,
        "status": status,
        "demoted": demoted,
        "why": why,
    }
