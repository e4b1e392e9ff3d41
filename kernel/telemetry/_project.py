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

import json
import re
from collections.abc import Iterable
from typing import Any

import msgspec
from openinference.semconv.trace import OpenInferenceSpanKindValues as SpanKind
from openinference.semconv.trace import SpanAttributes as OpenInference
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
    ExecutionIntent,
    ExecutionRefused,
    ExecutionRetried,
    ExecutionStarted,
    ExecutionSucceeded,
    Feedback,
    FlowAborted,
    FlowClosed,
    FlowCompensated,
    FlowCreated,
    FlowDirty,
    FlowEscalated,
    FlowFlagged,
    HumanDecided,
    ProposalAccepted,
    ProposalRecord,
    ProposalRejected,
    ProposalSubmitted,
)
from kernel.core.reasons import ReasonCode

__all__ = ["FAULTS", "PROVIDER_NAME", "SpanProjector", "SpanRecord"]

FAULTS: frozenset[str] = frozenset(
    code.value
    for code in (
        ReasonCode.KERNEL_FAULT,
        ReasonCode.EXECUTION_FAILED,
        ReasonCode.OUTCOME_UNKNOWN,
        ReasonCode.AGENT_ERROR,
        ReasonCode.INTERRUPTED,
        ReasonCode.COMPENSATED,
    )
)
"""Reason codes that mark a flow's root ERROR: faults. Refusals, rejections and human
decisions are governed outcomes, and leave the status unset."""

PROVIDER_NAME = "dirk"
"""The ``gen_ai.provider.name`` of the kernel's spans. The conventions require one on an
agent's span, and the kernel does not know which model an agent calls: this names the
flavour of the telemetry (``dir.*`` attributes). An instrumented LLM client's own spans,
nested under ``invoke_agent``, carry the real provider."""

_US = 1_000  # the step that keeps a flow's span starts strictly increasing (viewers keep µs)
_ROOT = ("flow", 0)
_INVOKE = gen_ai.GenAiOperationNameValues.INVOKE_AGENT.value
_WORKFLOW = gen_ai.GenAiOperationNameValues.INVOKE_WORKFLOW.value
_RESUME = ("resume", 0)

_KIND = OpenInference.OPENINFERENCE_SPAN_KIND
_CHAIN = SpanKind.CHAIN.value
_GUARDRAIL = SpanKind.GUARDRAIL.value
# Values are JSON text. No mime type goes with them: two more attributes on every flow
# cost what P2 (spans on) must not lose, and a viewer shows JSON text as it is.
_IN, _OUT = OpenInference.INPUT_VALUE, OpenInference.OUTPUT_VALUE

# Ids a framework adapter may record on a flow's events (read when present, absent
# otherwise): the conversation it belongs to, the tool call it governs, the agent's
# own version (a Manifest's ``version`` is the DIR contract it speaks, not its own).
_CONVERSATION, _TOOL_CALL, _AGENT_VERSION = "conversation_id", "tool_call_id", "agent_version"
_ID_LIMIT = 256
_KEPT_AS = {_CONVERSATION: "conversation", _TOOL_CALL: "tool_call", _AGENT_VERSION: "agent_version"}
_TEXT_LIMIT = 4096  # characters of an input or output value; the rest is cut
_EXPLAIN_LIMIT = 1024  # characters of a proposal's explanation in an input value
_NODE_BUDGET = 2000  # values walked for redaction; past it, the rest is elided
_REDACTED = "[redacted]"
_SECRET = re.compile(
    r"passw(?:or)?d|passphrase|secret|api[-_]?key|authori[sz]ation|credential|cookie"
    r"|private[-_]?key|token$",
    re.IGNORECASE,
)
"""Keys whose values stay out of span attributes, at any depth: spans leave for a
collector that whoever reads traces can read."""
_SECRET_WORDS = (
    "passw", "passphrase", "secret", "apikey", "api_key", "api-key", "authori", "credential",
    "cookie", "private", "token",
)  # fmt: skip
"""What any key :data:`_SECRET` matches contains (in lower case): text without any of
them needs no redaction walk."""

Where = tuple[str, int]
"""A span's place in its flow: (stage, n), hashed with the DFID into its span id."""


class SpanRecord:
    """One finished span, before it becomes an SDK span.

    ``dfid`` names the trace, ``where`` the span, ``parent`` its parent in the same
    trace (None for a root), ``links`` spans of other traces as (dfid, where), ``remote``
    a span outside the kernel (the caller's, as a recorded W3C traceparent) it links to.
    ``error`` is the status description of a fault (None: OK if ``ok``, else unset).
    ``final`` marks the flow's last span (its root or its ``resume``, as the flow ends).
    """

    __slots__ = (
        "attrs",
        "dfid",
        "end",
        "error",
        "events",
        "final",
        "links",
        "name",
        "ok",
        "parent",
        "remote",
        "start",
        "where",
    )

    def __init__(
        self,
        dfid: str,
        where: Where,
        name: str,
        start: int,
        end: int,
        attrs: dict[str, Any],
        *,
        parent: Where | None = _ROOT,
        events: list[tuple[str, dict[str, Any], int]] | None = None,
        links: list[tuple[str, Where]] | None = None,
        error: str | None = None,
        ok: bool = False,
        remote: str = "",
        final: bool = False,
    ) -> None:
        self.remote, self.final = remote, final
        self.dfid, self.where, self.name = dfid, where, name
        self.start, self.end, self.attrs = start, max(start, end), attrs
        self.parent, self.events, self.links = parent, events or [], links or []
        self.error, self.ok = error, ok


class _Stage:
    __slots__ = ("attrs", "events", "name", "parent", "start", "ts", "where")

    def __init__(
        self, where: Where, name: str, ts: int, start: int, attrs: dict[str, Any], parent: Where
    ) -> None:
        self.where, self.name, self.attrs, self.parent = where, name, attrs, parent
        self.ts = ts  # when it began, as recorded
        self.start = start  # when its span starts: ``ts``, or just after a tied earlier start
        self.events: list[tuple[str, dict[str, Any], int]] = []


def _feedback_attrs(feedback: Feedback) -> dict[str, Any]:
    attrs: dict[str, Any] = {"dir.reason_code": str(feedback.reason_code)}
    for name in ("detail", "layer", "field"):
        if value := getattr(feedback, name):
            attrs[f"dir.{name}"] = value
    return attrs


def _intent_attrs(intent: ExecutionIntent) -> dict[str, Any]:
    return {
        "dir.idempotency_key": intent.key,
        "dir.adapter": intent.adapter,
        "dir.step": intent.step,
        gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value,
        gen_ai.GEN_AI_TOOL_NAME: intent.kind,
    }


_CARRIED: dict[type, tuple[str, ...]] = {}
"""Per payload type, which of the optional ids it has fields for (most: none)."""


def _ids_of(payload: object) -> tuple[str, ...]:
    kind = type(payload)
    names = _CARRIED.get(kind)
    if names is None:
        fields = getattr(kind, "__struct_fields__", None) or dir(kind)
        names = _CARRIED[kind] = tuple(
            n for n in (_CONVERSATION, _TOOL_CALL, _AGENT_VERSION) if n in fields
        )
    return names


def _optional_id(payload: object, name: str) -> str:
    """Return the id ``payload`` records as ``name`` if it has one (bounded), else ""."""
    value = getattr(payload, name, None)
    return value[:_ID_LIMIT] if isinstance(value, str) else ""


def _redacted(value: Any, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        return "…"
    if isinstance(value, dict):
        return {
            key: _REDACTED
            if isinstance(key, str) and _SECRET.search(key)
            else _redacted(item, budget)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redacted(item, budget) for item in value]
    return value


def json_text(value: dict[str, Any]) -> str:
    """Return ``value`` as JSON for an input or output attribute: sorted, secret-looking
    keys redacted, at most about 4,096 characters. Never raises."""
    try:
        text = msgspec.json.encode(value, order="sorted").decode()
        # Most values hold no secret-looking key: a look for the words in the text says
        # so, and spares the walk (a false alarm, a word in a value, only costs the walk).
        lowered = text.lower()
        if any(word in lowered for word in _SECRET_WORDS):
            text = msgspec.json.encode(_redacted(value, [_NODE_BUDGET]), order="sorted").decode()
    except (TypeError, ValueError, OverflowError):
        # What msgspec refuses (a lone surrogate, an integer past 64 bits): escaped, as text.
        clean = _redacted(value, [_NODE_BUDGET])
        text = json.dumps(clean, ensure_ascii=True, sort_keys=True, default=repr)
    return text if len(text) <= _TEXT_LIMIT else text[: _TEXT_LIMIT - 1] + "…"


def _proposal_text(proposal: ProposalRecord) -> str:
    shown: dict[str, Any] = {"kind": proposal.kind, "params": proposal.params}
    if proposal.confidence != 1.0:
        shown["confidence"] = proposal.confidence
    if explain := proposal.explain:
        # The agent's prose is cut first, so that what it asked for still shows.
        shown["explain"] = (
            explain if len(explain) <= _EXPLAIN_LIMIT else explain[:_EXPLAIN_LIMIT] + "…"
        )
    return json_text(shown)


def _verdict_text(verdict: str, code: str = "", detail: str = "", impact: str = "") -> str:
    shown = {"verdict": verdict}
    if code:
        shown["reason_code"] = code
    if impact:
        shown["impact"] = impact
    if detail:
        shown["detail"] = detail
    return json_text(shown)


_ACCEPTED = _verdict_text("ACCEPTED")
_STATUS_TEXT: dict[str, str] = {}  # a flow's outcome that is its status alone, as JSON


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
        attrs[gen_ai.GEN_AI_PROVIDER_NAME] = PROVIDER_NAME
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
        ended = False
        match event.payload:
            case ContextCompiled(attempt=attempt, context_ref=ref):
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
                    gen_ai.GEN_AI_PROVIDER_NAME: PROVIDER_NAME,
                    # Phoenix reads AGENT off gen_ai.operation.name (TOOL too): no kind here.
                }
                if self.agent_id:
                    attrs[gen_ai.GEN_AI_AGENT_NAME] = self.agent_id
                self.start("reason", "reason", name, ts, attrs, where=("reason", attempt))
            case ProposalSubmitted(attempt=attempt, proposal=proposal, by_human=by_human):
                self.attempts, self.kind = max(self.attempts, attempt), proposal.kind
                self.learn_ids(event.payload)
                self.learn_ids(proposal)
                self.proposal = _proposal_text(proposal)
                self.finish("reason", ts, {"dir.policy_kind": self.kind})
                judged: dict[str, Any] = {
                    "dir.attempt": attempt,
                    "dir.policy_kind": self.kind,
                    _KIND: _GUARDRAIL,
                    _IN: self.proposal,
                }
                if by_human:
                    judged["dir.by_human"] = True
                self.start("validate", "validate", f"judge {self.kind}", ts, judged)
            case ProposalRejected(feedback=feedback):
                code = str(feedback.reason_code)
                stage = self.open.get("validate")
                if stage is not None:
                    stage.events.append(("feedback", _feedback_attrs(feedback), ts))
                rejected = {
                    "dir.verdict": "REJECTED",
                    "dir.reason_code": code,
                    _OUT: _verdict_text("REJECTED", code, feedback.detail),
                }
                self.finish("validate", ts, rejected)
            case ProposalAccepted():
                accepted = {"dir.verdict": "ACCEPTED", _OUT: _ACCEPTED}
                self.finish("validate", ts, accepted)
            case FlowEscalated(reason_code=reason_code, impact=impact, detail=detail):
                code = str(reason_code)
                escalated = {
                    "dir.verdict": "ESCALATED",
                    "dir.reason_code": code,
                    _OUT: _verdict_text("ESCALATED", code, detail, impact),
                }
                self.finish("validate", ts, escalated)
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
            case ApprovalExpired():
                self.finish("escalation", ts, {"dir.decision": "expired"})
            case HumanDecided(decision=decision, operator=operator, reason=reason):
                done = {"dir.decision": decision, "dir.operator": operator}
                if reason:
                    done["dir.human_reason"] = reason
                self.finish("escalation", ts, done)
            case ExecutionStarted(intent=intent):
                self.learn_ids(intent)
                name = f"execute_tool {intent.kind}"
                attrs = _intent_attrs(intent)
                if self.tool_call:
                    attrs[gen_ai.GEN_AI_TOOL_CALL_ID] = self.tool_call
                self.start(f"execute/{intent.key}", "execute", name, ts, attrs)
            case ExecutionSucceeded(key=key, external_id=external_id):
                self.finish(
                    f"execute/{key}", ts, {"dir.external_id": external_id} if external_id else None
                )
            case ExecutionRetried(key=key, attempt=attempt, error=error, delay_ns=delay_ns):
                stage = self.open.get(f"execute/{key}")
                if stage is not None:
                    retry = {
                        "dir.attempt": attempt,
                        "dir.error": error,
                        "dir.delay_ms": delay_ns // 1_000_000,
                    }
                    stage.events.append(("retry", retry, ts))
            case ExecutionRefused(key=key, reason_code=reason_code, bound=bound, detail=detail):
                refused = {"dir.reason_code": str(reason_code), "dir.bound": bound}
                if detail:
                    refused["dir.detail"] = detail
                self.finish(f"execute/{key}", ts, refused)
            case ExecutionFailed(key=key, error=error, transient=transient):
                failed = {
                    "dir.reason_code": ReasonCode.EXECUTION_FAILED.value,
                    "dir.error": error,
                    "dir.transient": transient,
                }
                self.finish(f"execute/{key}", ts, failed, error=ReasonCode.EXECUTION_FAILED.value)
            case DuplicateSuppressed(key=key, source=source):
                self.root_events.append(
                    ("duplicate_suppressed", {"dir.idempotency_key": key, "dir.source": source}, ts)
                )
            case FlowDirty(step=step, reason_code=reason_code, detail=detail):
                dirty = {
                    "dir.step": step,
                    "dir.reason_code": str(reason_code),
                    "dir.detail": detail,
                }
                self.root_events.append(("dirty", dirty, ts))
            case CompensationStarted(intent=intent):
                attrs = _intent_attrs(intent)
                self.start(
                    f"compensate/{intent.key}", "compensate", f"compensate {intent.kind}", ts, attrs
                )
            case CompensationSucceeded(key=key, external_id=external_id):
                self.finish(
                    f"compensate/{key}",
                    ts,
                    {"dir.external_id": external_id} if external_id else None,
                )
            case CompensationFailed(key=key, error=error, transient=transient):
                failed = {"dir.error": error, "dir.transient": transient}
                self.finish(f"compensate/{key}", ts, failed, error="COMPENSATION_FAILED")
            case FlowFlagged(guard=guard, reason=reason, confidence=confidence):
                self.root_attrs["dir.needs_review"] = True
                flag = {"dir.guard": guard, "dir.reason": reason, "dir.confidence": confidence}
                self.root_events.append(("needs_review", flag, ts))
            case FlowClosed():
                self.end(ts, "CLOSED", None)
                ended = True
            case FlowCompensated(steps=steps):
                self.root_attrs["dir.compensated_steps"] = steps
                self.end(ts, "COMPENSATED", ReasonCode.COMPENSATED.value)
                ended = True
            case FlowAborted(reason_code=reason_code, detail=detail):
                if detail:
                    self.root_attrs["dir.detail"] = detail
                self.end(ts, "ABORTED", str(reason_code))
                ended = True
        self.prev = ts
        return ended


class SpanProjector:
    """Fold committed events, in seq order, into the records of spans that ended.

    The only state is that of flows not yet terminal. A flow is projected only if
    its FlowCreated was seen; events for a flow already ended (a late
    DuplicateSuppressed, say) are ignored, since its spans are out.
    """

    def __init__(self) -> None:
        self._open: dict[str, _Flow] = {}

    @property
    def open_flows(self) -> int:
        """The number of flows begun and not yet ended."""
        return len(self._open)

    def is_open(self, dfid: str) -> bool:
        """Whether flow ``dfid`` has begun and not yet ended."""
        return dfid in self._open

    def feed(self, events: Iterable[Event]) -> list[SpanRecord]:
        """Take events in seq order; return the records of the spans they ended."""
        out: list[SpanRecord] = []
        flows = self._open
        for event in events:
            dfid = event.dfid
            if dfid is None:
                continue
            flow = flows.get(dfid)
            if flow is None:
                if isinstance(event.payload, FlowCreated):
                    flows[dfid] = _Flow(event, out)
                continue
            flow.out = out
            if flow.feed(event):
                del flows[dfid]
        return out
