"""The fold of committed events into span records, live: a span leaves as its stage ends.

One DecisionFlow is one trace whose id is its DFID. Its root span ends when the
flow ends, or earlier, when the flow first waits for a human: then the root
leaves at once (so the waiting flow is visible) and what follows the wait hangs
under a ``resume`` span that ends with the flow. A child flow's root links to
its parent's root, and the parent's trace gets a zero-length ``child flow``
span linking to the child's root. Every record is a pure function of the
events up to its end, so the same span id never carries two contents, live or
re-exported (DESIGN.md section 4).

Names and attributes follow the GenAI semantic conventions of the pinned
``opentelemetry-semantic-conventions`` (the root is the workflow, ``invoke_workflow``;
reasoning is ``invoke_agent``, execution ``execute_tool``) and OpenInference's span
kinds and input/output values, which Phoenix shows in its columns: a proposal in,
a verdict or an outcome out, as bounded JSON with secret-looking keys redacted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import error_attributes

from kernel.core.events import (
    ApprovalExpired,
    CompensationFailed,
    CompensationStarted,
    CompensationSucceeded,
    ContextCompiled,
    DuplicateSuppressed,
    Event,
    ExecutionFailed,
    ExecutionRefused,
    ExecutionRetried,
    ExecutionStarted,
    ExecutionSucceeded,
    FlowAborted,
    FlowClosed,
    FlowCompensated,
    FlowCreated,
    FlowDirty,
    FlowEscalated,
    FlowFlagged,
    HumanDecided,
    ProposalAccepted,
    ProposalRejected,
    ProposalSubmitted,
)
from kernel.core.reasons import ReasonCode
from kernel.telemetry import _guardrail as guardrail
from kernel.telemetry._spans import (
    _ACCEPTED,
    _CHAIN,
    _GUARDRAIL,
    _IN,
    _INVOKE,
    _KEPT_AS,
    _KIND,
    _OUT,
    _RESUME,
    _ROOT,
    _STATUS_TEXT,
    _US,
    _WORKFLOW,
    FAULTS,
    PROVIDER_NAME,
    SpanRecord,
    Where,
    _feedback_attrs,
    _ids_of,
    _intent_attrs,
    _optional_id,
    _proposal_text,
    _Stage,
    _verdict_text,
    json_text,
)

__all__ = ["FAULTS", "PROVIDER_NAME", "SpanRecord", "Where"]


class _Flow:
    """The state of one flow between its FlowCreated and its end."""

    def __init__(self, event: Event, out: list[SpanRecord]) -> None:
        created = event.payload
        assert isinstance(created, FlowCreated)
        self.dfid = event.dfid or ""
        self.out = out
        self.created = event.ts
        self.parent_dfid = event.parent_dfid
        self.topic = created.topic
        self.traceparent = created.traceparent
        self.agent_id = event.agent_id or ""
        self.kind = ""
        self.attempts = 0
        self.last_start = event.ts
        self.prev = event.ts
        self.counts: dict[str, int] = {}
        self.open: dict[str, _Stage] = {}
        self.segment: Where = _ROOT
        self.root_attrs: dict[str, Any] = {}
        self.root_events: list[tuple[str, dict[str, Any], int]] = []
        self.resume_start = 0
        self.used: set[Where] = set()
        self.conversation = self.tool_call = self.agent_version = ""
        self.learn_ids(created)
        self.proposal = ""  # the last proposal, as JSON for input values
        if self.parent_dfid:
            # The parent's trace says where its child went, at the moment it began.
            self.out.append(
                SpanRecord(
                    self.parent_dfid,
                    (f"child/{self.dfid}", 0),
                    f"child flow {self.topic}".rstrip(),
                    event.ts,
                    event.ts,
                    {"dir.dfid": self.parent_dfid, "dir.child_dfid": self.dfid, _KIND: _CHAIN},
                    links=[(self.dfid, _ROOT)],
                )
            )

    # -- helpers --

    def at(self, ts: int) -> int:
        """Return a start no earlier than ``ts`` and after every earlier start of this flow."""
        start = max(ts, self.last_start + _US)
        self.last_start = start
        return start

    def agent_attrs(self, *, named: bool = False) -> dict[str, Any]:
        """The attributes every span of the flow carries; ``named`` adds the agent's name
        (on the spans the conventions give one: the workflow's and the agent's)."""
        attrs: dict[str, Any] = {"dir.dfid": self.dfid}
        if self.agent_id:
            attrs[gen_ai.GEN_AI_AGENT_ID] = self.agent_id
            if named:
                attrs[gen_ai.GEN_AI_AGENT_NAME] = self.agent_id
        if self.agent_version:
            attrs[gen_ai.GEN_AI_AGENT_VERSION] = self.agent_version
        if self.conversation:
            attrs[gen_ai.GEN_AI_CONVERSATION_ID] = self.conversation
        return attrs

    def learn_ids(self, payload: object) -> None:
        """Take the ids a framework adapter recorded on ``payload``, the first of each."""
        for name in _ids_of(payload):
            if not getattr(self, _KEPT_AS[name]):
                setattr(self, _KEPT_AS[name], _optional_id(payload, name))

    def outcome(self, attrs: dict[str, Any]) -> None:
        """Set a workflow span's kind and its input and output values from ``attrs``."""
        attrs[_KIND] = _CHAIN
        attrs[_IN] = self.proposal or json_text({"topic": self.topic})
        status = attrs["dir.status"]
        shown = {"status": status}
        for name in ("reason_code", "impact", "detail"):
            if value := attrs.get(f"dir.{name}"):
                shown[name] = value
        if len(shown) > 1:
            attrs[_OUT] = json_text(shown)
        elif (text := _STATUS_TEXT.get(status)) is not None:
            attrs[_OUT] = text
        else:
            attrs[_OUT] = _STATUS_TEXT[status] = json_text(shown)

    def where(self, stage: str) -> Where:
        n = self.counts.get(stage, 0)
        self.counts[stage] = n + 1
        return (stage, n)

    def emit(self, record: SpanRecord) -> None:
        self.out.append(record)

    def span(self, stage: str, name: str, start: int, end: int, attrs: dict[str, Any]) -> None:
        attrs = {**self.agent_attrs(), **attrs}
        self.emit(
            SpanRecord(self.dfid, self.where(stage), name, start, end, attrs, parent=self.segment)
        )

    def start(
        self,
        key: str,
        stage: str,
        name: str,
        ts: int,
        attrs: dict[str, Any],
        where: Where | None = None,
    ) -> None:
        # A stage begun again (an execution resumed after a crash) ends the unfinished one.
        self.finish(key, ts)
        if where is None or where in self.used:
            # A stage without a fixed place, or one begun twice: the next free place.
            where = self.where(stage if where is None else f"{stage}+")
        self.used.add(where)
        opened = _Stage(where, name, ts, self.at(ts), {**self.agent_attrs(), **attrs}, self.segment)
        self.open[key] = opened

    def finish(
        self,
        key: str,
        end: int,
        extra: dict[str, Any] | None = None,
        *,
        error: str | None = None,
        name: str | None = None,
    ) -> None:
        stage = self.open.pop(key, None)
        if stage is None:  # e.g. a human acceptance after escalation: no validate is open
            return
        if extra:
            stage.attrs.update(extra)
        if stage.where[0] == "escalation":
            stage.attrs["dir.wait_ms"] = (end - stage.ts) // 1_000_000
        if error is not None:
            stage.attrs[error_attributes.ERROR_TYPE] = error
        self.emit(
            SpanRecord(
                self.dfid,
                stage.where,
                name or stage.name,
                stage.start,
                end,
                stage.attrs,
                parent=stage.parent,
                events=stage.events,
                error=error,
            )
        )

    def root_record(
        self, end: int, status: str, error: str | None, ok: bool, *, final: bool = False
    ) -> SpanRecord:
        attrs = self.agent_attrs()
        workflow = self.kind or self.topic
        attrs[gen_ai.GEN_AI_OPERATION_NAME] = _WORKFLOW
        if workflow:
            attrs[gen_ai.GEN_AI_WORKFLOW_NAME] = workflow
        if self.tool_call:
            attrs[gen_ai.GEN_AI_TOOL_CALL_ID] = self.tool_call
        if self.agent_id:
            attrs["dir.agent_id"] = self.agent_id
        if self.topic:
            attrs["dir.topic"] = self.topic
        if self.kind:
            attrs["dir.policy_kind"] = self.kind
        if self.parent_dfid:
            attrs["dir.parent_dfid"] = self.parent_dfid
        attrs["dir.attempts"] = self.attempts
        attrs["dir.status"] = status
        attrs.update(self.root_attrs)
        if error is not None:
            attrs[error_attributes.ERROR_TYPE] = error
        self.outcome(attrs)
        links = [(self.parent_dfid, _ROOT)] if self.parent_dfid else []
        return SpanRecord(
            self.dfid,
            _ROOT,
            f"{_WORKFLOW} {workflow}".rstrip(),
            self.created,
            max(end, self.last_start),
            attrs,
            parent=None,
            events=self.root_events,
            links=links,
            error=error,
            ok=ok,
            remote=self.traceparent,
            final=final,
        )

    def wait(self, ts: int) -> None:
        """The flow waits for a human: its root leaves now; what follows hangs under ``resume``."""
        if self.segment == _ROOT:
            self.emit(self.root_record(ts, "ESCALATED", None, False))
            self.root_attrs, self.root_events = {}, []
            self.segment = _RESUME
            self.resume_start = -1  # begins with the first event after the wait

    def end(self, ts: int, status: str, code: str | None) -> None:
        # Stages the terminal event cut short end with it.
        for key in list(self.open):
            self.finish(key, ts)
        error = code if code in FAULTS else None
        if code is not None:
            self.root_attrs["dir.reason_code"] = code
        if self.segment == _ROOT:
            self.emit(self.root_record(ts, status, error, status == "CLOSED", final=True))
            return
        attrs = {**self.agent_attrs(), "dir.status": status, "dir.attempts": self.attempts}
        attrs.update(self.root_attrs)
        if error is not None:
            attrs[error_attributes.ERROR_TYPE] = error
        self.outcome(attrs)
        start = self.resume_start if self.resume_start > 0 else ts
        self.emit(
            SpanRecord(
                self.dfid,
                _RESUME,
                f"resume {self.kind or self.topic}".rstrip(),
                start,
                max(ts, self.last_start),
                attrs,
                parent=_ROOT,
                events=self.root_events,
                error=error,
                ok=status == "CLOSED",
                final=True,
            )
        )

    # -- the fold --

    def feed(self, event: Event) -> bool:
        """Fold one event of this flow; return whether the flow ended."""
        ts = event.ts
        self.agent_id = self.agent_id or event.agent_id or ""
        if self.resume_start < 0:
            self.resume_start = self.at(ts)
        fold = _FOLD.get(type(event.payload))
        if fold is not None:
            fold(self, event.payload, ts)
        self.prev = ts
        return isinstance(event.payload, FlowClosed | FlowCompensated | FlowAborted)

    # -- one step of the fold per event type (the table _FOLD, below the class) --

    def _on_context_compiled(self, payload: ContextCompiled, ts: int) -> None:
        attempt = payload.attempt
        ref = payload.context_ref
        self.attempts = max(self.attempts, attempt)
        start = self.at(self.prev)
        self.span(
            "context",
            "context",
            start,
            ts,
            {"dir.attempt": attempt, "dir.context_ref": ref},
        )
        name = f"invoke_agent {self.agent_id}".rstrip()
        attrs = {
            "dir.attempt": attempt,
            gen_ai.GEN_AI_OPERATION_NAME: _INVOKE,
            # No gen_ai.provider.name: the kernel makes no model call (docs/traces.md).
            # Phoenix reads AGENT off gen_ai.operation.name (TOOL too): no kind here.
        }
        if self.agent_id:
            attrs[gen_ai.GEN_AI_AGENT_NAME] = self.agent_id
        self.start("reason", "reason", name, ts, attrs, where=("reason", attempt))

    def _on_proposal_submitted(self, payload: ProposalSubmitted, ts: int) -> None:
        attempt = payload.attempt
        proposal = payload.proposal
        by_human = payload.by_human
        self.attempts, self.kind = max(self.attempts, attempt), proposal.kind
        self.learn_ids(payload)
        self.learn_ids(proposal)
        self.proposal = _proposal_text(proposal)
        self.finish("reason", ts, {"dir.policy_kind": self.kind})
        judged: dict[str, Any] = {
            "dir.attempt": attempt,
            "dir.policy_kind": self.kind,
            **guardrail.started(),
            _KIND: _GUARDRAIL,
            _IN: self.proposal,
        }
        if by_human:
            judged["dir.by_human"] = True
        self.start("validate", "validate", guardrail.SPAN_NAME, ts, judged)

    def verdict(self, ts: int, verdict: str, extra: dict[str, Any], **why: str) -> None:
        """End the guardrail span with the DIM's verdict (kernel.telemetry._guardrail)."""
        found = guardrail.result(verdict, **why)
        stage = self.open.get("validate")
        if stage is not None:
            stage.events.append((guardrail.RESULT_EVENT, dict(found), ts))
        self.finish("validate", ts, {**extra, **found})

    def _on_proposal_rejected(self, payload: ProposalRejected, ts: int) -> None:
        feedback = payload.feedback
        code = str(feedback.reason_code)
        stage = self.open.get("validate")
        if stage is not None:
            stage.events.append(("feedback", _feedback_attrs(feedback), ts))
        rejected = {
            "dir.verdict": "REJECTED",
            "dir.reason_code": code,
            _OUT: _verdict_text("REJECTED", code, feedback.detail),
        }
        rule = feedback.rule or feedback.layer
        self.verdict(ts, "REJECTED", rejected, pack=payload.pack, code=code, rule=rule)

    def _on_proposal_accepted(self, payload: ProposalAccepted, ts: int) -> None:
        accepted = {"dir.verdict": "ACCEPTED", _OUT: _ACCEPTED}
        self.verdict(ts, "ACCEPTED", accepted, pack=payload.pack)

    def _on_flow_escalated(self, payload: FlowEscalated, ts: int) -> None:
        reason_code = payload.reason_code
        impact = payload.impact
        detail = payload.detail
        code = str(reason_code)
        escalated = {
            "dir.verdict": "ESCALATED",
            "dir.reason_code": code,
            _OUT: _verdict_text("ESCALATED", code, detail, impact),
        }
        self.verdict(
            ts, "ESCALATED", escalated, pack=payload.pack, version=payload.version, code=code,
            rule=payload.rule,
        )  # fmt: skip
        why = {"dir.reason_code": code, "dir.impact": impact}
        if detail:
            why["dir.detail"] = detail
        parent, self.segment = self.segment, _ROOT
        waiting = {**why, _KIND: _CHAIN}
        self.start("escalation", "escalation", f"escalation {code}", ts, waiting)
        self.segment = parent
        if self.segment == _ROOT:
            # The root leaves now: it says why the flow waits, as the console does.
            self.root_attrs.update(why)
        self.wait(ts)

    def _on_approval_expired(self, payload: ApprovalExpired, ts: int) -> None:
        self.finish("escalation", ts, {"dir.decision": "expired"})

    def _on_human_decided(self, payload: HumanDecided, ts: int) -> None:
        decision = payload.decision
        operator = payload.operator
        reason = payload.reason
        done = {"dir.decision": decision, "dir.operator": operator}
        if reason:
            done["dir.human_reason"] = reason
        self.finish("escalation", ts, done)

    def _on_execution_started(self, payload: ExecutionStarted, ts: int) -> None:
        intent = payload.intent
        self.learn_ids(intent)
        name = f"execute_tool {intent.kind}"
        attrs = _intent_attrs(intent)
        if self.tool_call:
            attrs[gen_ai.GEN_AI_TOOL_CALL_ID] = self.tool_call
        self.start(f"execute/{intent.key}", "execute", name, ts, attrs)

    def _on_execution_succeeded(self, payload: ExecutionSucceeded, ts: int) -> None:
        key = payload.key
        external_id = payload.external_id
        self.finish(f"execute/{key}", ts, {"dir.external_id": external_id} if external_id else None)

    def _on_execution_retried(self, payload: ExecutionRetried, ts: int) -> None:
        key = payload.key
        attempt = payload.attempt
        error = payload.error
        delay_ns = payload.delay_ns
        stage = self.open.get(f"execute/{key}")
        if stage is not None:
            retry = {
                "dir.attempt": attempt,
                "dir.error": error,
                "dir.delay_ms": delay_ns // 1_000_000,
            }
            stage.events.append(("retry", retry, ts))

    def _on_execution_refused(self, payload: ExecutionRefused, ts: int) -> None:
        key = payload.key
        reason_code = payload.reason_code
        bound = payload.bound
        detail = payload.detail
        refused = {"dir.reason_code": str(reason_code), "dir.bound": bound}
        if detail:
            refused["dir.detail"] = detail
        self.finish(f"execute/{key}", ts, refused)

    def _on_execution_failed(self, payload: ExecutionFailed, ts: int) -> None:
        key = payload.key
        error = payload.error
        transient = payload.transient
        failed = {
            "dir.reason_code": ReasonCode.EXECUTION_FAILED.value,
            "dir.error": error,
            "dir.transient": transient,
        }
        self.finish(f"execute/{key}", ts, failed, error=ReasonCode.EXECUTION_FAILED.value)

    def _on_duplicate_suppressed(self, payload: DuplicateSuppressed, ts: int) -> None:
        key = payload.key
        source = payload.source
        self.root_events.append(
            ("duplicate_suppressed", {"dir.idempotency_key": key, "dir.source": source}, ts)
        )

    def _on_flow_dirty(self, payload: FlowDirty, ts: int) -> None:
        step = payload.step
        reason_code = payload.reason_code
        detail = payload.detail
        dirty = {
            "dir.step": step,
            "dir.reason_code": str(reason_code),
            "dir.detail": detail,
        }
        self.root_events.append(("dirty", dirty, ts))

    def _on_compensation_started(self, payload: CompensationStarted, ts: int) -> None:
        intent = payload.intent
        attrs = _intent_attrs(intent)
        self.start(f"compensate/{intent.key}", "compensate", f"compensate {intent.kind}", ts, attrs)

    def _on_compensation_succeeded(self, payload: CompensationSucceeded, ts: int) -> None:
        key = payload.key
        external_id = payload.external_id
        self.finish(
            f"compensate/{key}",
            ts,
            {"dir.external_id": external_id} if external_id else None,
        )

    def _on_compensation_failed(self, payload: CompensationFailed, ts: int) -> None:
        key = payload.key
        error = payload.error
        transient = payload.transient
        failed = {"dir.error": error, "dir.transient": transient}
        self.finish(f"compensate/{key}", ts, failed, error="COMPENSATION_FAILED")

    def _on_flow_flagged(self, payload: FlowFlagged, ts: int) -> None:
        guard = payload.guard
        reason = payload.reason
        confidence = payload.confidence
        self.root_attrs["dir.needs_review"] = True
        flag = {"dir.guard": guard, "dir.reason": reason, "dir.confidence": confidence}
        self.root_events.append(("needs_review", flag, ts))

    def _on_flow_closed(self, payload: FlowClosed, ts: int) -> None:
        self.end(ts, "CLOSED", None)

    def _on_flow_compensated(self, payload: FlowCompensated, ts: int) -> None:
        steps = payload.steps
        self.root_attrs["dir.compensated_steps"] = steps
        self.end(ts, "COMPENSATED", ReasonCode.COMPENSATED.value)

    def _on_flow_aborted(self, payload: FlowAborted, ts: int) -> None:
        reason_code = payload.reason_code
        detail = payload.detail
        if detail:
            self.root_attrs["dir.detail"] = detail
        self.end(ts, "ABORTED", str(reason_code))


# What each event type does to its flow's spans; a type not here changes none.
_FOLD: dict[type[Any], Callable[[_Flow, Any, int], None]] = {
    ContextCompiled: _Flow._on_context_compiled,
    ProposalSubmitted: _Flow._on_proposal_submitted,
    ProposalRejected: _Flow._on_proposal_rejected,
    ProposalAccepted: _Flow._on_proposal_accepted,
    FlowEscalated: _Flow._on_flow_escalated,
    ApprovalExpired: _Flow._on_approval_expired,
    HumanDecided: _Flow._on_human_decided,
    ExecutionStarted: _Flow._on_execution_started,
    ExecutionSucceeded: _Flow._on_execution_succeeded,
    ExecutionRetried: _Flow._on_execution_retried,
    ExecutionRefused: _Flow._on_execution_refused,
    ExecutionFailed: _Flow._on_execution_failed,
    DuplicateSuppressed: _Flow._on_duplicate_suppressed,
    FlowDirty: _Flow._on_flow_dirty,
    CompensationStarted: _Flow._on_compensation_started,
    CompensationSucceeded: _Flow._on_compensation_succeeded,
    CompensationFailed: _Flow._on_compensation_failed,
    FlowFlagged: _Flow._on_flow_flagged,
    FlowClosed: _Flow._on_flow_closed,
    FlowCompensated: _Flow._on_flow_compensated,
    FlowAborted: _Flow._on_flow_aborted,
}
