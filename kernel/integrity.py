"""The Decision Integrity Module: the deterministic gate every proposal passes.

The verdict is a pure function of (proposal, projected state, time, policy
packs). The layers run in a fixed order and the first that fails decides:

1. boundary: the session token (INVALID_SESSION) and the flow (FLOW_NOT_ACTIVE);
   refusals here touch no flow and count no attempt;
2. schema: kind, version and parameters of the policy kind (SCHEMA_INVALID);
3. agent status (AGENT_PASSIVE, AGENT_SUSPENDED, AGENT_RETIRED);
4. authority: the kind is among the agent's capabilities (UNAUTHORIZED);
5. time: the validity window (EXPIRED);
6. state consistency: the context reference is the current snapshot (STALE_CONTEXT);
7. memory: the active constraints of governed memory (CONSTRAINT_VIOLATION,
   VERIFICATION_REQUIRED; see kernel.memory.check);
8. escalation thresholds: confidence below the pack's threshold (ESCALATE).

A rejection with attempts left hands the agent its feedback through a fresh
context; the intent retry governor ends the flow with REASONING_EXHAUSTION
once the agent's attempts are spent. There is no default-allow path.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kernel.actors import Mailbox, Outbox, Reply
from kernel.context import Compile, context_ref
from kernel.contracts import Outcome, Verdict, field_of
from kernel.events import (
    DuplicateSuppressed,
    Feedback,
    FlowAborted,
    FlowEscalated,
    ProposalAccepted,
    ProposalRecord,
    ProposalRejected,
    ProposalSubmitted,
    SubmissionRefused,
)
from kernel.flow import FlowState, FlowStatus
from kernel.memory import MemoryState
from kernel.memory import check as check_memory
from kernel.packs import PolicyCatalog
from kernel.ports import Clock
from kernel.projection import AgentStatus, AgentView, Projections
from kernel.reasons import ReasonCode
from kernel.registry import session_hash

_STATUS_CODES = {
    AgentStatus.PASSIVE: ReasonCode.AGENT_PASSIVE,
    AgentStatus.SUSPENDED: ReasonCode.AGENT_SUSPENDED,
    AgentStatus.RETIRED: ReasonCode.AGENT_RETIRED,
}


class Validate(msgspec.Struct, frozen=True, kw_only=True):
    """A proposal to judge: from an agent (with its token) or a human modification."""

    dfid: str
    proposal: ProposalRecord
    token: str = ""
    by_human: bool = False
    invalid: Feedback | None = None
    reply: Reply[Verdict] | None = None


class Withdraw(msgspec.Struct, frozen=True, kw_only=True):
    """An agent gives up on a flow: it declined to act, or its reasoning failed."""

    dfid: str
    token: str
    attempt: int
    reason_code: ReasonCode
    detail: str = ""


class Escalate(msgspec.Struct, frozen=True, kw_only=True):
    """Tell the escalation manager a flow now waits for a human."""

    dfid: str


class Execute(msgspec.Struct, frozen=True, kw_only=True):
    """Carry out the accepted intent of a flow."""

    dfid: str
    reply: Reply[Verdict] | None = None


def reject(layer: str, code: ReasonCode, detail: str, field: str = "") -> Feedback:
    """Build the feedback of a failed layer."""
    return Feedback(reason_code=code, detail=detail, layer=layer, field=field)


def evaluate(
    proposal: ProposalRecord,
    agent: AgentView,
    catalog: PolicyCatalog,
    now_ns: int,
    current_ref: str,
    *,
    by_human: bool = False,
    memory: MemoryState | None = None,
    correlation_id: str = "",
) -> Feedback | None:
    """Run layers 2-7 and return the first failure's feedback, or None if all pass."""
    kind = catalog.kinds.get(proposal.kind)
    if kind is None:
        return reject(
            "schema", ReasonCode.SCHEMA_INVALID, f"unknown policy kind {proposal.kind!r}", "kind"
        )
    if proposal.version and proposal.version.split(".")[0] != kind.version.split(".")[0]:
        return reject(
            "schema",
            ReasonCode.SCHEMA_INVALID,
            f"{proposal.kind} version {proposal.version} does not match the current {kind.version}",
            "version",
        )
    try:
        msgspec.convert({"kind": proposal.kind, **proposal.params}, kind)
    except msgspec.ValidationError as exc:
        field = field_of(exc)
        return reject("schema", ReasonCode.SCHEMA_INVALID, str(exc), f"params.{field}")
    if not 0.0 <= proposal.confidence <= 1.0:
        return reject(
            "schema", ReasonCode.SCHEMA_INVALID, "confidence must lie in [0, 1]", "confidence"
        )
    if proposal.valid_until_ns is None:
        return reject(
            "schema",
            ReasonCode.SCHEMA_INVALID,
            "a proposal needs a validity window",
            "valid_until_ns",
        )
    if agent.status is not AgentStatus.ACTIVE:
        code = _STATUS_CODES[agent.status]
        return reject("status", code, f"agent {agent.manifest.agent_id} is {agent.status}")
    if proposal.kind not in agent.manifest.capabilities:
        return reject(
            "authority",
            ReasonCode.UNAUTHORIZED,
            f"{proposal.kind} is not among the capabilities of {agent.manifest.agent_id}",
            "kind",
        )
    if now_ns > proposal.valid_until_ns:
        late_ms = (now_ns - proposal.valid_until_ns) // 1_000_000
        return reject(
            "time", ReasonCode.EXPIRED, f"validity window ended {late_ms} ms ago", "valid_until_ns"
        )
    if not by_human and proposal.context_ref != current_ref:
        return reject(
            "state",
            ReasonCode.STALE_CONTEXT,
            "the state this proposal reasoned on has changed since its context was compiled",
            "context_ref",
        )
    # Layer 7, governed memory: a pure function of the proposal and the memory projection.
    if memory is not None:
        return check_memory(memory, proposal, agent.manifest.agent_id, correlation_id)
    return None


class IntegrityModule:
    """The DIM actor."""

    def __init__(
        self,
        projections: Projections,
        catalog: PolicyCatalog,
        clock: Clock,
        compiler: Mailbox[Any],
        escalation: Mailbox[Any],
        execution: Mailbox[Any],
    ) -> None:
        self._projections = projections
        self._catalog = catalog
        self._clock = clock
        self._compiler = compiler
        self._escalation = escalation
        self._execution = execution

    async def handle(self, msg: Validate | Withdraw, out: Outbox) -> None:
        match msg:
            case Validate():
                self._validate(msg, out)
            case Withdraw():
                flow = out.flow(msg.dfid)
                owner = self._projections.sessions.get(session_hash(msg.token))
                if (
                    flow is not None
                    and flow.agent_id == owner
                    and flow.awaiting_proposal
                    and flow.compiled == msg.attempt
                ):
                    out.emit(
                        FlowAborted(reason_code=msg.reason_code, detail=msg.detail), dfid=msg.dfid
                    )

    def _validate(self, msg: Validate, out: Outbox) -> None:
        flow = out.flow(msg.dfid)
        agent_id = self._projections.sessions.get(session_hash(msg.token)) if msg.token else None
        if not msg.by_human and agent_id is None:
            self._refuse(
                msg, flow, ReasonCode.INVALID_SESSION, "the session token is not valid", out
            )
            return
        if flow is None or (not msg.by_human and flow.agent_id != agent_id):
            self._refuse(
                msg, None, ReasonCode.FLOW_NOT_ACTIVE, f"no flow {msg.dfid} for this agent", out
            )
            return
        ready = flow.status is FlowStatus.VALIDATING if msg.by_human else flow.awaiting_proposal
        if not ready:
            if flow.proposal == msg.proposal and flow.status not in (
                FlowStatus.VALIDATING,
                FlowStatus.ACTIVE,
            ):
                self._duplicate(msg, flow, out)
            elif flow.status is FlowStatus.ACTIVE:
                self._refuse(
                    msg, flow, ReasonCode.FLOW_NOT_ACTIVE, "the flow awaits a fresh context", out
                )
            else:
                self._refuse(msg, flow, ReasonCode.FLOW_NOT_ACTIVE, f"flow is {flow.status}", out)
            return

        agent = self._projections.agents[flow.agent_id]
        attempt = flow.attempts + (0 if msg.by_human else 1)
        submitted = out.emit(
            ProposalSubmitted(attempt=attempt, proposal=msg.proposal, by_human=msg.by_human),
            dfid=msg.dfid,
        )
        current = context_ref(self._projections.visible_state(agent.manifest.subscriptions))
        feedback = msg.invalid or evaluate(
            msg.proposal,
            agent,
            self._catalog,
            self._clock.now_ns(),
            current,
            by_human=msg.by_human,
            memory=self._projections.memory,
            correlation_id=flow.root_dfid,
        )
        if feedback is not None:
            self._rejected(msg, agent, attempt, feedback, submitted, out)
            return
        pack = self._catalog.pack_of[msg.proposal.kind]
        if not msg.by_human and msg.proposal.confidence < pack.escalate_below_confidence:
            detail = (
                f"confidence {msg.proposal.confidence:g} is below the threshold"
                f" {pack.escalate_below_confidence:g} of pack {pack.name}"
            )
            out.emit(
                FlowEscalated(reason_code=ReasonCode.LOW_CONFIDENCE, detail=detail),
                dfid=msg.dfid,
                after=submitted,
            )
            out.send(self._escalation, Escalate(dfid=msg.dfid))
            feedback = reject("escalation", ReasonCode.LOW_CONFIDENCE, detail, "confidence")
            out.reply(
                msg.reply,
                Verdict(
                    outcome=Outcome.ESCALATED, dfid=msg.dfid, attempt=attempt, feedback=feedback
                ),
            )
            return
        out.emit(
            ProposalAccepted(attempt=attempt, by_human=msg.by_human), dfid=msg.dfid, after=submitted
        )
        out.send(self._execution, Execute(dfid=msg.dfid))
        out.reply(msg.reply, Verdict(outcome=Outcome.ACCEPTED, dfid=msg.dfid, attempt=attempt))

    def _rejected(
        self,
        msg: Validate,
        agent: AgentView,
        attempt: int,
        feedback: Feedback,
        submitted: int,
        out: Outbox,
    ) -> None:
        rejected = out.emit(
            ProposalRejected(attempt=attempt, feedback=feedback), dfid=msg.dfid, after=submitted
        )
        if msg.by_human:
            out.emit(
                FlowAborted(
                    reason_code=feedback.reason_code,
                    detail=f"human modification refused: {feedback.detail}",
                ),
                dfid=msg.dfid,
                after=rejected,
            )
            outcome = Outcome.ABORTED
        elif attempt >= agent.manifest.max_attempts:
            out.emit(
                FlowAborted(
                    reason_code=ReasonCode.REASONING_EXHAUSTION,
                    detail=f"{attempt} proposals rejected; last: {feedback.reason_code}",
                ),
                dfid=msg.dfid,
                after=rejected,
            )
            outcome = Outcome.ABORTED
        else:
            out.send(self._compiler, Compile(dfid=msg.dfid, attempt=attempt + 1, feedback=feedback))
            outcome = Outcome.REJECTED
        out.reply(
            msg.reply, Verdict(outcome=outcome, dfid=msg.dfid, attempt=attempt, feedback=feedback)
        )

    def _refuse(
        self, msg: Validate, flow: FlowState | None, code: ReasonCode, detail: str, out: Outbox
    ) -> None:
        out.emit(
            SubmissionRefused(
                reason_code=code, detail=detail, claimed_agent=flow.agent_id if flow else ""
            ),
            dfid=flow.dfid if flow else None,
        )
        feedback = reject("boundary", code, detail)
        out.reply(msg.reply, Verdict(outcome=Outcome.REFUSED, dfid=msg.dfid, feedback=feedback))

    def _duplicate(self, msg: Validate, flow: FlowState, out: Outbox) -> None:
        out.emit(DuplicateSuppressed(key=flow.intent_key, source="submission"), dfid=flow.dfid)
        outcome = {
            FlowStatus.CLOSED: Outcome.DUPLICATE,
            FlowStatus.ABORTED: Outcome.ABORTED,
            FlowStatus.ESCALATED: Outcome.ESCALATED,
        }.get(flow.status, Outcome.DUPLICATE)
        feedback = reject("boundary", flow.reason_code, flow.detail) if flow.reason_code else None
        out.reply(
            msg.reply,
            Verdict(
                outcome=outcome,
                dfid=flow.dfid,
                attempt=flow.attempts,
                feedback=feedback,
                external_id=flow.external_id,
            ),
        )
