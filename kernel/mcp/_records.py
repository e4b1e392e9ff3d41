"""What the MCP server's backends take and answer: principals, refusals, verdicts, views.

Shared by :class:`kernel.mcp._backend.Embedded` and :class:`kernel.mcp._follower.Follower`,
and by the tools that call either.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from kernel.core.events import (
    ContextCompiled,
    Event,
    ExecutionSucceeded,
    ProposalRejected,
)
from kernel.core.events import (
    Principal as OnBehalfOf,
)
from kernel.core.flow import FlowState, FlowStatus
from kernel.journal.store import Journal
from kernel.state.projections import Projections

Role = Literal["agent", "operator"]


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """Who calls a tool: an agent (by id) or an operator (by name), and for whom.

    ``on_behalf`` is the user the call acts for, as the door authenticated it: a
    verified user token's subject, or the user and tenant the token file binds the
    agent's token to. None: the server was given no user for this caller (a token
    file line without one, stdio), and the kernel's default principal, if any, applies.
    """

    role: Role
    name: str
    on_behalf: OnBehalfOf | None = None

    @property
    def tenant(self) -> str | None:
        """The tenant this caller is confined to (None: none was authenticated)."""
        return self.on_behalf.tenant if self.on_behalf is not None else None


class ToolRefused(Exception):
    """A tool call refused before or instead of any proposal, with a code and a field."""

    def __init__(self, code: str, detail: str, field: str = "") -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.field = field


class Settled(msgspec.Struct, frozen=True, kw_only=True):
    """How a proposal's flow settled, as the tool answers it."""

    verdict: str
    dfid: str
    status: str
    reason_code: str | None = None
    detail: str = ""
    field: str = ""
    result: dict[str, Any] = {}


class View(msgspec.Struct, frozen=True, kw_only=True):
    """What a read sees: the journal and the projections folded from it."""

    journal: Journal
    projections: Projections


class RuleAct(msgspec.Struct, frozen=True, kw_only=True):
    """An operator's act on the rulebook: override or skip a proposal; add, edit, retract a rule."""

    action: str
    operator: str
    reason: str
    rule: str = ""
    proposal_seq: int = 0
    title: str = ""
    content: str = ""
    labels: list[str] = []
    ns: str = "default"
    """The rulebook namespace of ``rule``."""


def settled(flow: FlowState, events: list[Event]) -> Settled:
    """Return the verdict a settled flow gives its proposer, with the artifacts its context
    referenced (``artifacts``: key -> reference; what ``fetch_artifact`` may read)."""
    answer = _settled(flow, events)
    shown: dict[str, str] = {}
    for event in events:
        if isinstance(event.payload, ContextCompiled):
            shown.update(event.payload.artifacts)
    if not shown:
        return answer
    return msgspec.structs.replace(answer, result={**answer.result, "artifacts": shown})


def _settled(flow: FlowState, events: list[Event]) -> Settled:
    status = str(flow.status)
    if flow.status is FlowStatus.CLOSED:
        result: dict[str, Any] = {"external_id": flow.external_id}
        for event in events:
            if isinstance(event.payload, ExecutionSucceeded):
                result.update(event.payload.detail)
        return Settled(verdict="ACCEPTED", dfid=flow.dfid, status=status, result=result)
    if flow.status is FlowStatus.ESCALATED:
        return Settled(
            verdict="ESCALATED",
            dfid=flow.dfid,
            status=status,
            reason_code=str(flow.reason_code) if flow.reason_code else None,
            detail=flow.detail,
        )
    rejected = [e.payload for e in events if isinstance(e.payload, ProposalRejected)]
    if rejected:
        feedback = rejected[-1].feedback
        return Settled(
            verdict="REJECTED",
            dfid=flow.dfid,
            status=status,
            reason_code=str(feedback.reason_code),
            detail=feedback.detail,
            field=feedback.field,
        )
    return Settled(
        verdict="REJECTED",
        dfid=flow.dfid,
        status=status,
        reason_code=str(flow.reason_code) if flow.reason_code else None,
        detail=flow.detail,
    )
