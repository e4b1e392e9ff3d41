"""What one call is answered: a :class:`Decision`, read from its flow's record.

A call's DFID is derived from its key (the agent, the conversation, the tool-call
id), so the same key names the same flow in any kernel; the Decision a flow stands
for is read from the flow and its events (kernel.api.proposals answers with it).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgspec

from kernel.core.events import Event, ExecutionSucceeded, Feedback, FlowCreated, ProposalRejected
from kernel.core.flow import FlowState, FlowStatus
from kernel.core.reasons import ReasonCode
from kernel.journal.store import Journal
from kernel.policy.contracts import Outcome, Verdict

_KEYS = uuid.UUID("5f1d6a4e-2c39-4c0e-9d57-6d6972b1a5e0")
"""The namespace of derived DFIDs (UUID version 5): fixed, so a key names one flow forever."""

FAULTS = frozenset({ReasonCode.KERNEL_FAULT, ReasonCode.INTERRUPTED})
"""Ends of a flow that say nothing about its proposal: the kernel failed, not the call."""


def keyed_dfid(*parts: str) -> str:
    """Return the DFID a key names: the same parts, the same flow, in any kernel."""
    return str(uuid.uuid5(_KEYS, "\x1f".join(parts)))


def conversation_dfid(agent_id: str, conversation: str) -> str:
    """Return the DFID of ``agent_id``'s conversation ``conversation`` (its first call's flow)."""
    return keyed_dfid("conversation", agent_id, conversation)


def call_dfid(agent_id: str, conversation: str | None, tool_call_id: str) -> str:
    """Return the DFID of a tool call keyed by (conversation, tool-call id) for ``agent_id``."""
    return keyed_dfid("call", agent_id, conversation or "", tool_call_id)


class DecisionVerdict(StrEnum):
    """What became of a proposal, as a model needs to know it."""

    EXECUTED = "EXECUTED"
    """Accepted and carried out: ``result`` holds the adapter's receipt."""
    ESCALATED = "ESCALATED"
    """A human must decide first: follow it with ``Kernel.await_decision(dfid)``."""
    PENDING = "PENDING"
    """Accepted, and its execution has not finished yet (``await_decision`` follows it)."""
    REFUSED = "REFUSED"
    """Not carried out, by policy, by a human or by the retry governor: revise and call again."""
    FAILED = "FAILED"
    """Accepted, but the execution did not take effect (or was undone)."""
    ALLOWED_WITHOUT_JOURNAL = "ALLOWED_WITHOUT_JOURNAL"
    """Decided while the journal's store was away: a read-only kind its tenant lets fail
    open. The caller may carry it out; the kernel ran nothing, and records the call as
    ``DecidedWithoutJournal`` once the store is back (kernel.api.outage)."""


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The kernel's answer to one proposal (``Kernel.propose``, ``Kernel.await_decision``).

    Attributes:
        verdict: what became of the proposal.
        dfid: the call's DecisionFlow ("" when it was refused before any flow opened).
        reason_code: why, when it was not simply executed.
        detail: what the reason means here, in words the model can act on.
        field: the proposal's field the refusal names (``params.qty``), if any.
        limit: the limit it crossed, if any.
        result: the execution's receipt: the external id and the adapter's detail.
        conversation_dfid: the conversation's DecisionFlow, for a call in one.
        tool_call_id: the tool call the proposal came from, when given.
        replayed: answered from the record of an earlier call with the same key.
    """

    verdict: DecisionVerdict
    dfid: str = ""
    reason_code: ReasonCode | None = None
    detail: str = ""
    field: str = ""
    limit: str = ""
    result: dict[str, Any] = {}
    conversation_dfid: str = ""
    tool_call_id: str = ""
    replayed: bool = False

    @property
    def settled(self) -> bool:
        """Whether the answer is final (nothing pending, no human awaited)."""
        return self.verdict not in (DecisionVerdict.ESCALATED, DecisionVerdict.PENDING)

    def message(self) -> str:
        """Return the decision as one line for a model to read as the tool's output."""
        match self.verdict:
            case DecisionVerdict.EXECUTED:
                shown = msgspec.json.encode(self.result).decode()
                return f"EXECUTED (flow {self.dfid}): {shown}"
            case DecisionVerdict.ESCALATED:
                return (
                    f"ESCALATED {self.reason_code}: {self.detail} (flow {self.dfid} waits for"
                    " a human decision)"
                )
            case DecisionVerdict.PENDING:
                return f"PENDING: {self.detail} (flow {self.dfid})"
            case DecisionVerdict.ALLOWED_WITHOUT_JOURNAL:
                return f"ALLOWED_WITHOUT_JOURNAL: {self.detail} (call {self.dfid})"
        where = ", ".join(
            part for part in (self.field, f"limit {self.limit}" if self.limit else "") if part
        )
        return f"{self.verdict} {self.reason_code}: {self.detail}" + (
            f" ({where})" if where else ""
        )


async def decision_of(
    journal: Journal,
    flow: FlowState,
    *,
    conversation_dfid: str = "",
    tool_call_id: str = "",
    replayed: bool = False,
    events: list[Event] | None = None,
) -> Decision:
    """Return the decision a flow stands for, from its record in ``journal``.

    ``events``: the flow's every event, known already (as committed: no read).
    """
    ids: dict[str, Any] = {
        "dfid": flow.dfid,
        "conversation_dfid": conversation_dfid,
        "tool_call_id": tool_call_id,
        "replayed": replayed,
    }
    status = flow.status
    if status is FlowStatus.ESCALATED:
        return Decision(
            verdict=DecisionVerdict.ESCALATED,
            reason_code=flow.reason_code,
            detail=flow.detail,
            **ids,
        )
    if not flow.terminal:
        return Decision(verdict=DecisionVerdict.PENDING, detail=f"the flow is {status}", **ids)
    if events is None:
        events = await journal.flow_events(flow.dfid)
    _name_the_call(ids, events)
    if status is FlowStatus.CLOSED:
        return Decision(verdict=DecisionVerdict.EXECUTED, result=_result(flow, events), **ids)
    executed = bool(flow.intent_key) or status is FlowStatus.COMPENSATED
    if executed or flow.reason_code in FAULTS:
        return Decision(
            verdict=DecisionVerdict.FAILED,
            reason_code=flow.reason_code,
            detail=flow.detail,
            **ids,
        )
    rejected = _last_rejection(events)
    return Decision(
        verdict=DecisionVerdict.REFUSED,
        reason_code=flow.reason_code,
        detail=flow.detail,
        field=rejected.field if rejected is not None else "",
        limit=rejected.limit if rejected is not None else "",
        **ids,
    )


def _name_the_call(ids: dict[str, Any], events: list[Event]) -> None:
    """Fill in the call's tool-call id and conversation the flow recorded, if not given."""
    created = next((e.payload for e in events if isinstance(e.payload, FlowCreated)), None)
    if created is not None:
        ids["tool_call_id"] = ids["tool_call_id"] or created.tool_call_id
        if not ids["conversation_dfid"] and created.conversation_id:
            ids["conversation_dfid"] = created.root_dfid


def _result(flow: FlowState, events: list[Event]) -> dict[str, Any]:
    """What a closed flow's execution answered: its external id and each success's detail."""
    result: dict[str, Any] = {"external_id": flow.external_id}
    for event in events:
        if isinstance(event.payload, ExecutionSucceeded):
            result.update(event.payload.detail)
    return result


def _last_rejection(events: list[Event]) -> Feedback | None:
    rejected = [e.payload.feedback for e in events if isinstance(e.payload, ProposalRejected)]
    return rejected[-1] if rejected else None


@dataclass(frozen=True)
class Judged:
    """A call judged: its flow and verdict, or the decision that answered it at once."""

    dfid: str
    verdict: Verdict | None = None
    decision: Decision | None = None
    conversation_dfid: str = ""
    tool_call_id: str = ""
    events: list[Event] | None = None
    """The flow's events as they commit (watched from before its opening), or None."""


def verdict_decision(judged: Judged, verdict: Verdict) -> Decision:
    """The decision of a call whose verdict settles it (escalated, refused, failed)."""
    feedback = verdict.feedback
    ids: dict[str, Any] = {
        "dfid": judged.dfid,
        "conversation_dfid": judged.conversation_dfid,
        "tool_call_id": judged.tool_call_id,
        "reason_code": feedback.reason_code if feedback else None,
        "detail": feedback.detail if feedback else "",
    }
    if verdict.outcome is Outcome.ESCALATED:
        return Decision(verdict=DecisionVerdict.ESCALATED, **ids)
    return Decision(
        verdict=DecisionVerdict.FAILED if ids["reason_code"] in FAULTS else DecisionVerdict.REFUSED,
        field=feedback.field if feedback else "",
        limit=feedback.limit if feedback else "",
        **ids,
    )


def unopened(opened: Decision | Feedback, conversation: str, tool_call_id: str) -> Judged:
    """Answer a call whose flow was not opened: the store was lost, or opening it was refused."""
    if isinstance(opened, Decision):  # the store was lost before the flow was opened
        ids = {"conversation_dfid": conversation, "tool_call_id": tool_call_id}
        return Judged(dfid="", decision=msgspec.structs.replace(opened, **ids))
    failed = opened.reason_code in FAULTS
    decision = Decision(
        verdict=DecisionVerdict.FAILED if failed else DecisionVerdict.REFUSED,
        reason_code=opened.reason_code,
        detail=opened.detail,
        conversation_dfid=conversation,
        tool_call_id=tool_call_id,
    )
    return Judged(dfid="", decision=decision)
