"""The memory pack 1.0.0, verbatim: what judged the memory proposals of journals before 1.1.0.

Re-judging (``dirk verify --verdicts``, ``dirk whatif --pack``) picks each verdict's
pack by the hash it recorded, so the version that judged must be given as it was:
this module keeps it byte for byte (its kinds' source is part of the hash). The
kernel ships 1.1.0 (``kernel.MEMORY_PACK``): constraints with a scope, rule proposals
with a namespace and an input event. Give both to re-judge a journal that spans them::

    dirk verify --db J --verdicts --pack policies.booking --pack policies.memory_1_0
"""

from __future__ import annotations

from typing import ClassVar, Literal

from kernel.policy import PolicyKind, PolicyPack

MEMORY_ADAPTER = "memory"


class AddFact(PolicyKind, frozen=True, tag="memory.add_fact"):
    """Remember that ``name`` is ``value`` (confidence as a decimal string)."""

    adapter: ClassVar[str] = MEMORY_ADAPTER

    name: str
    value: str
    confidence: str = "1"


class AddConstraint(PolicyKind, frozen=True, tag="memory.add_constraint"):
    """Constrain every later proposal: "never X", "avoid X", "verify X before Y"."""

    adapter: ClassVar[str] = MEMORY_ADAPTER

    text: str
    priority: Literal["required", "learned", "preferred"] = "required"
    triggered_by: int | None = None


class DeactivateConstraint(PolicyKind, frozen=True, tag="memory.deactivate_constraint"):
    adapter: ClassVar[str] = MEMORY_ADAPTER

    constraint: int
    reason: str = ""


class RecordDecision(PolicyKind, frozen=True, tag="memory.record_decision"):
    adapter: ClassVar[str] = MEMORY_ADAPTER

    text: str
    rationale: str = ""
    refs: list[int] = []


class ProposeRule(PolicyKind, frozen=True, tag="memory.propose_rule"):
    """Propose a version of rulebook item ``rule``; the promoter gate decides on it.

    ``repo``, ``ref``, ``path`` and ``blob`` say where the text comes from (a rule
    without them is deferred to an operator); ``base_version`` is the version the
    agent saw in its context (0 for a new rule).
    """

    adapter: ClassVar[str] = MEMORY_ADAPTER

    rule: str
    title: str
    content: str
    labels: list[str] = []
    repo: str = ""
    ref: str = ""
    path: str = ""
    blob: str = ""
    base_version: int = 0
    reason: str = ""


class Query(PolicyKind, frozen=True, tag="memory.query"):
    """Consult memory about ``topic``: what procedural constraints wait for."""

    adapter: ClassVar[str] = MEMORY_ADAPTER

    topic: str


MEMORY_PACK_1_0 = PolicyPack(
    name="memory",
    version="1.0.0",
    kinds=(AddFact, AddConstraint, DeactivateConstraint, RecordDecision, Query, ProposeRule),
    escalate_below_confidence=0.0,
)
"""The memory pack as kernels before 1.1.0 shipped it."""
