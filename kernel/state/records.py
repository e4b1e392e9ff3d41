"""The records the projections hold of agents and the state layer, and how they are read.

An agent as the registry knows it (:class:`AgentView`, with its :class:`AgentStatus`),
one key of the state layer (:class:`Fact`), what the journal records of a session
token, and which keys a manifest's subscriptions make visible.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

import msgspec

from kernel.core.events import (
    Manifest,
    digest,
)


class AgentStatus(StrEnum):
    """What an agent may do: ACTIVE proposes, PASSIVE only observes, the others nothing."""

    ACTIVE = "ACTIVE"
    PASSIVE = "PASSIVE"
    SUSPENDED = "SUSPENDED"
    RETIRED = "RETIRED"


class AgentView(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A registered agent as the registry knows it."""

    manifest: Manifest
    status: AgentStatus
    session_hash: str
    registered_seq: int


class Fact(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """One key of the state layer: its value, where it came from and when."""

    value: Any
    source: str
    seq: int
    ts: int


def session_hash(token: str) -> str:
    """Return what the journal records of a session token (never the token itself)."""
    return hashlib.sha256(token.encode()).hexdigest()


def context_ref(state: Mapping[str, Any]) -> str:
    """Return the snapshot reference of a visible state."""
    return digest(state)


def visible(subscriptions: Iterable[str], key: str) -> bool:
    """Whether a state key or topic falls under one of the dotted-prefix subscriptions."""
    for prefix in subscriptions:
        if key == prefix or key.startswith(prefix + ".") or prefix == "*":
            return True
    return False
