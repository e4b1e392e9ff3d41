"""What a person reads of an MCP answer: its summary, in the units a person reads.

An answer's fields are for machines and stay as the kernel recorded them: ``detail``
quotes the pack's minor units (the units the agent proposed in) and durations as
recorded. Its ``summary`` says the same for a person, with money in major units of the
server's currency and durations in the largest sensible unit
(:func:`kernel.audit.units.readable`); ``none`` leaves amounts as recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernel.audit.units import readable
from kernel.core.flow import FlowState
from kernel.state.approvals import Approval
from kernel.state.quorums import Ballot


def summary_of(answer: Mapping[str, Any], currency: str) -> str:
    """An answer (its structured content) in one line for a person: verdict, code, flow,
    the detail in its units.

    ``REJECTED RISK_LIMIT_EXCEEDED (flow 01J..., ABORTED): amount $29,926.40 is above
    $25,000.00; field params.amount``. An escalation says how to follow it.
    """
    line = " ".join(str(answer[k]) for k in ("verdict", "reason_code") if answer.get(k))
    if answer.get("dfid"):
        line += _flow_part(answer)
    if answer.get("detail"):
        line += f": {readable(str(answer['detail']), currency)}"
    if answer.get("field"):
        line += f"; field {answer['field']}"
    return line + _next_part(answer)


def _flow_part(answer: Mapping[str, Any]) -> str:
    status = answer.get("status") or ""
    shown = f", {status}" if status != answer["verdict"] and status else ""
    return f" (flow {answer['dfid']}{shown})"


def _next_part(answer: Mapping[str, Any]) -> str:
    """What came of it (an execution's external id), or what to do next (an escalation)."""
    done = (answer.get("result") or {}).get("external_id")
    if answer["verdict"] == "ACCEPTED" and done:
        return f"; executed: {done}"
    if answer["verdict"] == "ESCALATED" and answer.get("dfid"):
        return f"; a human decides: follow it with wait_flow(dfid={answer['dfid']!r})"
    return ""


def escalation_item(
    flow: FlowState, approval: Approval, ballot: Ballot | None, currency: str
) -> dict[str, Any]:
    """One waiting escalation as list_escalations answers it: the fields, and its summary."""
    item = {
        "dfid": flow.dfid,
        "agent_id": approval.agent_id,
        "reason_code": str(approval.reason_code),
        "detail": approval.detail,
        "impact": str(approval.impact),
        "action_hash": approval.short_hash,
        "kind": flow.proposal.kind if flow.proposal else "",
        "quorum": quorum_text(ballot),
    }
    return {**item, "summary": _escalation_line(item, currency)}


def _escalation_line(item: Mapping[str, Any], currency: str) -> str:
    """One escalation as a person reads it: who proposes what, why it waits, for whom."""
    line = f"{item['dfid']}: {item['agent_id']} proposes {item['kind'] or 'an action'}"
    line += f"; {item['reason_code']}: {readable(item['detail'], currency)}"
    line += f"; impact {item['impact']}"
    return line + (f"; quorum {item['quorum']}" if item["quorum"] else "")


def escalations_summary(shown: list[dict[str, Any]], waiting: int) -> str:
    """list_escalations' summary: how many wait, then one line for each shown."""
    head = f"{waiting} escalation{'' if waiting == 1 else 's'} waiting"
    return "\n".join([head + (":" if shown else ""), *(f"- {i['summary']}" for i in shown)])


def review_summary(
    flow: FlowState, approval: Approval | None, ballot: Ballot | None, currency: str
) -> str:
    """review's summary: the flow, who proposes what, why it waits, the quorum's state."""
    what = flow.proposal.kind if flow.proposal is not None else flow.topic
    line = f"{flow.dfid} ({flow.status}): {flow.agent_id} proposes {what}"
    if approval is not None:
        line += f"; {approval.reason_code}: {readable(approval.detail, currency)}"
        line += f"; impact {approval.impact}; approval {approval.status}"
    return line + (f"; quorum {quorum_text(ballot)}" if quorum_text(ballot) else "")


def quorum_text(ballot: Ballot | None) -> str:
    """What an approval's quorum waits for ("1 of 2, waiting for a desk-head"); "" for none."""
    if ballot is None or (ballot.quorum.required < 2 and not ballot.quorum.roles):
        return ""
    return ballot.waiting or f"0 of {ballot.quorum.required}"
