"""Span records and what they carry: the attributes and bounded JSON text of each stage.

The pieces :mod:`kernel.telemetry._project` builds spans from: the record of one span
(:class:`SpanRecord`), the names and limits of the conventions it follows, and the
attributes and input/output values of proposals, verdicts and intents, with
secret-looking keys redacted.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
from openinference.semconv.trace import OpenInferenceSpanKindValues as SpanKind
from openinference.semconv.trace import SpanAttributes as OpenInference
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

from kernel.core.events import (
    ExecutionIntent,
    Feedback,
    ProposalRecord,
)
from kernel.core.reasons import ReasonCode

__all__ = ["FAULTS", "PROVIDER_NAME", "SpanRecord", "Where", "json_text"]

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
"""What the kernel once set as ``gen_ai.provider.name`` on its own spans. It sets none now:
the GenAI conventions mean the provider of a model call, and the kernel makes none (an
instrumented LLM client's own ``chat`` spans, nested under ``invoke_agent``, carry the real
one). Kept for code that imported it."""


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

# Ids a flow's events may record (read when present, absent otherwise): the
# conversation it belongs to, the tool call it governs (a framework adapter's), the
# agent's own version (FlowCreated, from ``Manifest.agent_version``; a Manifest's
# ``version`` is the DIR contract it speaks, not its own).
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
