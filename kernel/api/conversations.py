"""What the kernel keeps of a conversation between its calls (kernel.api.proposals).

A conversation is one DecisionFlow: its first call opens the flow, every later call
is a child of it. Between calls the kernel keeps whether it began and whether the
retry governor stopped it (both read back from the record when it was forgotten),
the refusals in a row, and the state the agent could see when it was last answered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio

from kernel.core.events import FlowCreated, SubmissionRefused
from kernel.core.reasons import ReasonCode
from kernel.journal.store import Journal


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


@dataclass
class Key:
    """A call's key held while its call is looked up and judged (one flow per key)."""

    lock: anyio.Lock = field(default_factory=anyio.Lock)
    users: int = 0


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
