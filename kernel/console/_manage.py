"""The rulebook and the agents in the console: what is, and the operator's changes as requests.

Like ``dirk agent --set`` and ``dirk rules --override/--skip`` (kernel.cli._admin),
a change is one signed inbox request, built and checked by the same functions
(kernel.inbox.prepare), which the kernel applies once and records with the
operator's name and reason (AgentStatusChanged, RuleDecided).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernel.console._decide import Refused
from kernel.core import events as ev
from kernel.core.reasons import CliError, ReasonCode
from kernel.escalation import KERNEL_OPERATOR
from kernel.inbox import AgentStatusRequest, RuleChangeRequest, RuleDecisionRequest
from kernel.inbox.prepare import rule_change as rule_change_request
from kernel.inbox.prepare import rule_decision, status_change
from kernel.state.projections import AgentStatus, AgentView, Projections
from kernel.state.rulebook import DEFAULT_NS, RuleItem


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

    @property
    def demoted(self) -> bool:
        """Whether the kernel made it PASSIVE for escalating past its budget (not an operator)."""
        change = self.last_change
        return (
            change is not None
            and self.view.status is AgentStatus.PASSIVE
            and change.operator == KERNEL_OPERATOR
            and change.reason.startswith(str(ReasonCode.ESCALATION_BUDGET_EXHAUSTED))
        )


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
) -> AgentStatusRequest:
    """Return the request that sets an agent's status.

    Raises:
        Refused: an unknown agent or status, or no reason given.
    """
    return status_change(
        projections.agents,
        agent_id,
        str(form.get("status", "")),
        operator=operator,
        reason=str(form.get("reason", "")).strip(),
    )


@dataclass(frozen=True)
class RulesView:
    """One namespace of the rulebook: each rule's history, and the proposals deferred to an
    operator; ``namespaces`` lists every namespace there is (the page's filter)."""

    items: list[tuple[str, RuleItem]]
    pending: list[tuple[int, ev.RuleProposed]]
    ns: str = DEFAULT_NS
    namespaces: tuple[str, ...] = (DEFAULT_NS,)


def rules_view(projections: Projections, ns: str = DEFAULT_NS) -> RulesView:
    """Namespace ``ns`` of the rulebook as of the last event folded."""
    book = projections.memory.rulebook
    spaces = tuple(sorted({DEFAULT_NS, ns, *book.namespaces()}))
    return RulesView(
        items=sorted(book.space(ns).items()),
        pending=sorted((seq, p) for seq, p in book.pending.items() if p.ns == ns),
        ns=ns,
        namespaces=spaces,
    )


def rule_row(
    projections: Projections, seq_text: str, form: Mapping[str, Any], operator: str
) -> RuleDecisionRequest:
    """Return the request that overrides or skips deferred rule proposal ``seq_text``.

    Raises:
        Refused: not a deferred proposal, an unknown decision, or no reason given.
    """
    seq = int(seq_text) if seq_text.isdigit() and len(seq_text) < 19 else -1
    try:
        return rule_decision(
            projections.memory.rulebook,
            seq,
            str(form.get("decision", "")),
            operator=operator,
            reason=str(form.get("reason", "")).strip(),
        )
    except Refused as refused:
        if refused.code is CliError.RULE_NOT_PENDING:
            raise Refused(refused.code, f"no deferred rule proposal #{seq_text[:20]}") from None
        raise


def rule_change(
    projections: Projections, action: str, form: Mapping[str, Any], operator: str
) -> RuleChangeRequest:
    """Return the request that adds, edits or retracts the form's ``rule``.

    The request is built as ``dirk rules --add/--edit/--retract`` builds it
    (kernel.inbox.prepare.rule_change); labels come comma-separated.

    Raises:
        Refused: no reason, an unknown action or rule, or a missing title or text.
    """
    labels = [label.strip() for label in str(form.get("labels", "")).split(",")]
    return rule_change_request(
        projections.memory.rulebook,
        str(form.get("rule", "")).strip(),
        action,
        operator=operator,
        reason=str(form.get("reason", "")).strip(),
        title=str(form.get("title", "")).strip(),
        content=str(form.get("content", "")),
        labels=[label for label in labels if label],
        ns=str(form.get("ns", "") or DEFAULT_NS).strip(),
    )
