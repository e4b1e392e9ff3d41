"""The bases of every event payload, and the plain records nested inside payloads."""

from __future__ import annotations

from typing import Any

import msgspec

from kernel.core.reasons import ReasonCode


# Data-only structs are not tracked by the cyclic garbage collector (gc=False): they
# never form reference cycles, and tracking the many alive in a busy kernel cost a
# quarter of its time in collections.
class Payload(
    msgspec.Struct, frozen=True, gc=False, kw_only=True, tag_field="type", omit_defaults=True
):
    """Base of every event payload; the subclass name is the event type."""


class Record(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """Base of the plain records nested inside payloads."""


# --- records nested in payloads ---------------------------------------------


class PackRef(Record, frozen=True):
    """A policy pack as loaded: name, version and content hash."""

    name: str
    version: str
    hash: str


class Manifest(Record, frozen=True):
    """What an agent declares at its handshake: who it is and what it may do.

    ``version`` is the semver of the DIR contract the agent speaks (the kernel
    accepts its own major and any minor up to its own); ``capabilities`` are
    the policy kinds it may propose; ``subscriptions`` are the trigger topics
    (dotted prefixes) it wakes on and the state it may see. ``agent_version`` is the
    agent's own version (its build, its prompt's revision), shown on its flows' spans as
    ``gen_ai.agent.version``; empty: not said.
    """

    agent_id: str
    version: str
    capabilities: list[str] = []
    subscriptions: list[str] = []
    limits: dict[str, Any] = {}
    max_attempts: int = 3
    agent_version: str = ""


class ProposalRecord(Record, frozen=True):
    """A PolicyProposal exactly as the agent submitted it (still an untrusted claim)."""

    kind: str
    params: dict[str, Any] = {}
    version: str = ""
    explain: str = ""
    confidence: float = 1.0
    valid_until_ns: int | None = None
    context_ref: str = ""


class Feedback(Record, frozen=True):
    """Why a proposal was not accepted, as handed back to the agent."""

    reason_code: ReasonCode
    detail: str = ""
    layer: str = ""
    field: str = ""
    rule: str = ""
    limit: str = ""


class ExecutionIntent(Record, frozen=True):
    """What the kernel will carry out: minted by the kernel only, never by an agent."""

    key: str
    kind: str
    adapter: str
    params: dict[str, Any] = {}
    step: int = 0
    valid_until_ns: int | None = None
    action: str = ""
    """The saga step's action (empty for a one-step intent)."""
    compensation: bool = False
    """Whether this intent undoes the completed step ``step``."""
    bounds: dict[str, Any] = {}
    """Execution constraints checked against the adapter's live quote before the call."""
