"""What the kernel keeps of a conversation between its calls (kernel.api.proposals).

A conversation is one DecisionFlow: its first call opens the flow, every later call
is a child of it. Between calls the kernel keeps whether it began and whether the
retry governor stopped it (both read back from the record when it was forgotten),
the refusals in a row, and the state the agent could see when it was last answered.

A ``conversation`` (a framework's run or thread id) is one DecisionFlow. Its first
call opens the conversation's flow, whose DFID is derived from the agent and the
conversation id; every later call is a child flow of it, so the flow tree is the
conversation (memory and beliefs already correlate by a tree's root, and a trace
shows each call as a child of the conversation's flow). Why not one attempt per
call inside one flow: a flow executes at most one intent and ends, while a
conversation acts many times. Across its calls the kernel keeps:

- the retry governor (DIR 6.2, 9.3): refusals in a row are counted, and the call
  that brings them to the agent's ``max_attempts`` stops the conversation
  (REASONING_EXHAUSTION, recorded on the conversation's flow); every later call is
  refused at the boundary. An accepted or escalated call starts the count again.
- stale context: a call cites the state the agent could see when its conversation
  was last answered; when that state changed meanwhile, the call is refused
  STALE_CONTEXT and the next one cites the state as of that refusal.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from opentelemetry.context import Context

from kernel.core import wall
from kernel.core.events import FlowCreated, OnBehalf, SubmissionRefused
from kernel.core.reasons import ReasonCode
from kernel.core.wall import InputInvalid
from kernel.journal.store import Journal
from kernel.policy.contracts import Outcome, Verdict
from kernel.telemetry import caller_context, traceparent_of


@dataclass
class Conversation:
    """What the kernel keeps of one conversation between its calls."""

    agent_id: str
    id: str
    dfid: str
    loaded: bool = False
    opened: bool = False
    """Its flow exists (its first call opened it)."""
    first_call: str = ""
    """The tool-call id of the call that opened its flow."""
    refused: int = 0
    """Calls refused in a row (the retry governor's count)."""
    stopped: str = ""
    """Why the governor stopped it ("" while it runs)."""
    context_ref: str | None = None
    """The state the agent could see when the conversation was last answered."""
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    users: int = 0

    def count(self, verdict: Verdict) -> None:
        """Count a verdict in the refusals in a row (the retry governor)."""
        feedback = verdict.feedback
        if verdict.outcome in (Outcome.ACCEPTED, Outcome.ESCALATED):
            self.refused = 0
        elif verdict.outcome is Outcome.REJECTED:
            self.refused += 1
        elif verdict.outcome is Outcome.ABORTED and feedback is not None:
            if feedback.layer == "governor":
                self.refused += 1
                self.stopped = feedback.detail


@dataclass
class Key:
    """A call's key held while its call is looked up and judged (one flow per key)."""

    lock: anyio.Lock = field(default_factory=anyio.Lock)
    users: int = 0


class Keys:
    """The calls' keys held while their calls are looked up and judged: one flow per key."""

    def __init__(self) -> None:
        self._held: dict[str, Key] = {}

    @asynccontextmanager
    async def held(self, key: str | None) -> AsyncIterator[None]:
        """Hold ``key`` (None: nothing to hold) until the block ends."""
        if key is None:
            yield
            return
        held = self._held.setdefault(key, Key())
        held.users += 1
        try:
            async with held.lock:
                yield
        finally:
            held.users -= 1
            if not held.users:
                del self._held[key]


async def load_conversation(journal: Journal, conv: Conversation) -> None:
    """Read what the record says of a conversation: whether it began, and stopped."""
    for event in await journal.flow_events(conv.dfid):
        payload = event.payload
        if isinstance(payload, FlowCreated):
            conv.opened = True
            conv.first_call = payload.tool_call_id
        elif (
            isinstance(payload, SubmissionRefused)
            and payload.reason_code is ReasonCode.REASONING_EXHAUSTION
            and not conv.stopped
        ):
            conv.stopped = payload.detail
    conv.loaded = True


class CallSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What names a call before its proposal is read (the proposal has its own spec)."""

    agent_id: wall.Name
    kind: wall.Name
    conversation: wall.Name | None = None
    tool_call_id: wall.Name | None = None
    traceparent: wall.TraceParent = ""


@dataclass(frozen=True, slots=True)
class Ask:
    """One call as admitted: what it proposes, with whose session, why, at what cost, for whom."""

    call: CallSpec
    token: str
    policy: Any
    explain: Any
    confidence: Any
    usage: dict[str, int]
    behalf: OnBehalf | None


def admitted_call(
    agent_id: Any, kind: Any, conversation: Any, tool_call_id: Any, trace_context: Any
) -> CallSpec:
    """Return a call's fields as the wall admits them.

    Raises:
        InputInvalid: a field is not what it must be.
    """
    call = wall.admit(
        wall.fields(
            agent_id=agent_id,
            kind=kind,
            conversation=conversation if conversation != "" else None,
            tool_call_id=tool_call_id if tool_call_id != "" else None,
            traceparent=trace_context
            if trace_context is not None and not isinstance(trace_context, Context)
            else traceparent_of(trace_context),
        ),
        CallSpec,
    )
    if call.traceparent and caller_context(call.traceparent) is None:
        raise InputInvalid("traceparent", "a trace context names a span: non-zero ids")
    return call


def admitted_usage(usage: Mapping[str, int] | None) -> dict[str, int]:
    """Reported tokens by model, as the wall admits them (anything else counts as nothing)."""
    admitted: dict[str, int] = {}
    for model, tokens in (usage or {}).items():
        try:
            checked = wall.admit({"tokens": tokens, "model": model}, wall.UsageSpec)
        except InputInvalid:
            continue
        admitted[checked.model] = admitted.get(checked.model, 0) + checked.tokens
    return admitted
