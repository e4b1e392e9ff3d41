"""A journal of attempts written event by event, and the rows an audit of it must show.

Each :class:`Call` is one flow: opened for a principal (or for nobody, as a kernel
before principals did), with the verdicts its proposals got in order. The events are
those a kernel records (FlowCreated with ``on_behalf``, ProposalSubmitted, then
ProposalRejected / ProposalAccepted / FlowEscalated), plus what must not be an attempt
of its own: a human's approval after an escalation, a re-judgement before execution.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kernel.core import events as ev
from kernel.core.events import Draft
from kernel.core.reasons import ReasonCode
from kernel.journal.opening import open_journal
from kernel.testing import ManualClock

LAYERS = ("schema", "principal", "rules", "limits")
"""Layers a refusal names (the DIM's, by name)."""


@dataclass(frozen=True)
class Verdict:
    """What one proposal of a call got: ``allow``, ``deny`` (at ``layer``) or ``escalate``."""

    decision: str
    layer: str = ""
    code: str = ""


@dataclass(frozen=True)
class Call:
    """One flow: whom for (tenant "" for nobody), which agent, kind and verdicts."""

    tenant: str
    user: str
    agent: str
    kind: str
    verdicts: tuple[Verdict, ...]
    chain: tuple[str, ...] = ()
    tier: str = "interactive"
    without_journal: bool = False


@dataclass
class Written:
    """The journal written, and the attempts in it in order: (tenant, user, decision)."""

    path: Path
    dfids: list[str] = field(default_factory=list)
    expected: list[tuple[str, str, str, str]] = field(default_factory=list)


def on_behalf(call: Call) -> ev.OnBehalf | None:
    if not call.tenant:
        return None
    principal = ev.Principal(tenant=call.tenant, user=call.user, email=f"{call.user}@example.com")
    return ev.OnBehalf(principal=principal, tier=call.tier, chain=list(call.chain))


def _verdict_event(verdict: Verdict, attempt: int) -> ev.AnyPayload:
    if verdict.decision == "allow":
        return ev.ProposalAccepted(attempt=attempt)
    if verdict.decision == "escalate":
        return ev.FlowEscalated(reason_code=ReasonCode(verdict.code or "APPROVAL_REQUIRED"))
    feedback = ev.Feedback(
        reason_code=ReasonCode(verdict.code or "SCOPE_MISSING"), detail="no", layer=verdict.layer
    )
    return ev.ProposalRejected(attempt=attempt, feedback=feedback)


def drafts_of(call: Call, dfid: str, seq: int) -> list[Draft]:
    """The events a kernel records for ``call`` (``seq``: a DecidedWithoutJournal's spool id)."""
    behalf = on_behalf(call)
    if call.without_journal:
        allowed = call.verdicts[0].decision == "allow"
        return [
            Draft(
                payload=ev.DecidedWithoutJournal(
                    spool_id=seq,
                    decided_ns=1_700_000_000_000_000_000 + seq,
                    dfid=dfid,
                    agent_id=call.agent,
                    kind=call.kind,
                    on_behalf=behalf,
                    allowed=allowed,
                    reason_code=None if allowed else ReasonCode.GOVERNANCE_UNAVAILABLE,
                )
            )
        ]

    def at(payload: ev.AnyPayload) -> Draft:
        return Draft(payload=payload, dfid=dfid, agent_id=call.agent)

    drafts = [at(ev.FlowCreated(root_dfid=dfid, on_behalf=behalf))]
    for attempt, verdict in enumerate(call.verdicts[: _counted(call)], 1):
        proposal = ev.ProposalRecord(kind=call.kind, params={"n": attempt})
        drafts.append(at(ev.ContextCompiled(attempt=attempt, context_ref="ctx")))
        drafts.append(at(ev.ProposalSubmitted(attempt=attempt, proposal=proposal)))
        drafts.append(at(_verdict_event(verdict, attempt)))
    if call.verdicts[_counted(call) - 1].decision == "escalate":
        # A human approves, the action judged again needs a new approval, and a human gives
        # it: verdicts of the same attempt, no new row.
        human = ev.HumanDecided(decision="approve", operator="ana")
        drafts.append(at(human))
        drafts.append(at(ev.ProposalAccepted(attempt=_counted(call), by_human=True)))
        drafts.append(at(ev.FlowEscalated(reason_code=ReasonCode.APPROVAL_REQUIRED)))
        drafts.append(at(human))
        drafts.append(at(ev.ProposalAccepted(attempt=_counted(call), by_human=True)))
    return drafts


async def write(path: Path, calls: list[Call]) -> Written:
    """Write ``calls`` to a new journal at ``path``, interleaving their events."""
    written = Written(path)
    per_flow: list[list[Draft]] = []
    for n, call in enumerate(calls):
        dfid = str(uuid.UUID(int=n + 1))
        written.dfids.append(dfid)
        per_flow.append(drafts_of(call, dfid, n + 1))
    async with open_journal(path, clock=ManualClock()) as journal:
        # Round-robin, one event of each flow at a time: flows interleave as they do live.
        depth = max((len(d) for d in per_flow), default=0)
        for i in range(depth):
            batch = [drafts[i] for drafts in per_flow if i < len(drafts)]
            await journal.append(batch)
    written.expected = _expected(calls)
    return written


def _counted(call: Call) -> int:
    """How many of a call's verdicts are attempts (a flow ends at its acceptance or escalation)."""
    if call.without_journal:
        return 1
    for k, verdict in enumerate(call.verdicts):
        if verdict.decision != "deny":
            return k + 1
    return len(call.verdicts)


def _expected(calls: list[Call]) -> list[tuple[str, str, str, str]]:
    """The attempts in journal order: (tenant, user, decision, trace id)."""
    slots: list[tuple[int, int, tuple[str, str, str, str]]] = []
    for n, call in enumerate(calls):
        dfid = str(uuid.UUID(int=n + 1))
        for k, verdict in enumerate(call.verdicts[: _counted(call)]):
            # Event i of every flow is appended in round i: a verdict is event 3 + 3k.
            round_ = 0 if call.without_journal else 3 + 3 * k
            user = call.user if call.tenant else ""
            slots.append((round_, n, (call.tenant, user, verdict.decision, dfid)))
    return [row for _, _, row in sorted(slots)]
