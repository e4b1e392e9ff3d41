"""The rulebook and the agents in the console: what is, and the operator's changes as inbox rows.

Like ``dirk agent --set`` and ``dirk rules --override/--skip`` (kernel.cli._admin),
a change is one inbox row the kernel applies once and records with the
operator's name and reason (AgentStatusChanged, RuleDecided).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernel.console._decide import Refused
from kernel.core import events as ev
from kernel.core.reasons import CliError, ReasonCode
from kernel.core.wall import who_and_why
from kernel.inbox import AGENT_STATUS, RULE, RuleChangeRefused, rule_change_row
from kernel.state.projections import AgentStatus, AgentView, Projections
from kernel.state.rulebook import RuleItem


@dataclass(frozen=True)
class AgentLine:
    """One agent on the agents page."""

    view: AgentView
    open_flows: int
    escalations: int
    """Escalations counted against its budget since the budget was last filled."""
    last_change: ev.AgentStatusChanged | None = None
    """Its latest status change (by an operator, or by the kernel when a budget ran out)."""
    history: tuple[ev.Event, ...] = ()
    """Its status changes (AgentStatusChanged events), newest first, at most HISTORY_SHOWN."""


HISTORY_SHOWN = 50
"""How many status changes the agents page shows per agent."""


def agents_view(projections: Projections, changes: list[ev.Event]) -> list[AgentLine]:
    """Every registered agent, by id; ``changes`` are the journal's AgentStatusChanged events."""
    history: dict[str | None, list[ev.Event]] = {}
    latest: dict[str | None, ev.AgentStatusChanged] = {}
    for e in changes:
        if isinstance(e.payload, ev.AgentStatusChanged):
            history.setdefault(e.agent_id, []).append(e)
            latest[e.agent_id] = e.payload
    open_by_agent: dict[str, int] = {}
    for flow in projections.flows.values():
        if flow.dfid not in projections.ended:
            open_by_agent[flow.agent_id] = open_by_agent.get(flow.agent_id, 0) + 1
    return [
        AgentLine(
            view=view,
            open_flows=open_by_agent.get(agent_id, 0),
            escalations=len(projections.escalations.get(agent_id, [])),
            last_change=latest.get(agent_id),
            history=tuple(reversed(history.get(agent_id, [])[-HISTORY_SHOWN:])),
        )
        for agent_id, view in sorted(projections.agents.items())
    ]


def agent_row(
    projections: Projections, agent_id: str, form: Mapping[str, Any], operator: str
) -> dict[str, Any]:
    """Return the inbox row that sets an agent's status.

    Raises:
        Refused: an unknown agent or status, or no reason given.
    """
    reason = str(form.get("reason", "")).strip()
    problem = who_and_why(operator, reason)
    if problem is not None:
        raise Refused(ReasonCode.SCHEMA_INVALID, problem.replace("--", ""))
    if agent_id not in projections.agents:
        raise Refused(ReasonCode.UNKNOWN_AGENT, f"no agent {agent_id[:64]!r} ever registered")
    status = str(form.get("status", ""))
    if status not in {s.value for s in AgentStatus}:
        raise Refused(ReasonCode.SCHEMA_INVALID, f"no such status: {status[:32]!r}")
    return {
        "type": AGENT_STATUS,
        "agent_id": agent_id,
        "status": status,
        "operator": operator,
        "reason": reason,
    }


@dataclass(frozen=True)
class RulesView:
    """The rulebook: each rule's history, and the proposals deferred to an operator."""

    items: list[tuple[str, RuleItem]]
    pending: list[tuple[int, ev.RuleProposed]]


def rules_view(projections: Projections) -> RulesView:
    """The rulebook as of the last event folded."""
    book = projections.memory.rulebook
    return RulesView(items=sorted(book.items.items()), pending=sorted(book.pending.items()))


def rule_row(
    projections: Projections, seq_text: str, form: Mapping[str, Any], operator: str
) -> dict[str, Any]:
    """Return the inbox row that overrides or skips deferred rule proposal ``seq_text``.

    Raises:
        Refused: not a deferred proposal, an unknown decision, or no reason given.
    """
    reason = str(form.get("reason", "")).strip()
    problem = who_and_why(operator, reason)
    if problem is not None:
        raise Refused(ReasonCode.SCHEMA_INVALID, problem.replace("--", ""))
    decision = str(form.get("decision", ""))
    if decision not in ("override", "skip"):
        raise Refused(ReasonCode.SCHEMA_INVALID, f"no such decision: {decision[:32]!r}")
    seq = int(seq_text) if seq_text.isdigit() and len(seq_text) < 19 else -1
    if seq not in projections.memory.rulebook.pending:
        raise Refused(CliError.RULE_NOT_PENDING, f"no deferred rule proposal #{seq_text[:20]}")
    return {
        "type": RULE,
        "proposal_seq": seq,
        "decision": decision,
        "operator": operator,
        "reason": reason,
    }


def rule_change(
    projections: Projections, action: str, form: Mapping[str, Any], operator: str
) -> dict[str, Any]:
    """Return the inbox row that adds, edits or retracts the form's ``rule``.

    The row is built as ``dirk rules --add/--edit/--retract`` builds it
    (kernel.inbox.rule_change_row); labels come comma-separated.

    Raises:
        Refused: no reason, an unknown action or rule, or a missing title or text.
    """
    labels = [label.strip() for label in str(form.get("labels", "")).split(",")]
    try:
        return rule_change_row(
            projections.memory.rulebook,
            str(form.get("rule", "")).strip(),
            action,
            operator=operator,
            reason=str(form.get("reason", "")).strip(),
            title=str(form.get("title", "")).strip(),
            content=str(form.get("content", "")),
            labels=[label for label in labels if label],
        )
    except RuleChangeRefused as refused:
        raise Refused(refused.code, refused.message.replace("--", "")) from None
