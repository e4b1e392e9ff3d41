"""What the kernel notes about a proposal besides its verdict: citations and advisories.

Both are recorded next to the ProposalSubmitted they are about (caused by it)
and neither changes the verdict:

- **Citation correctness.** An explanation cites rules as ``[rule:id@vN]``.
  Each citation is correct when the flow's latest context showed exactly that
  version (:attr:`kernel.state.rulebook.Rulebook.shown`); otherwise it is recorded as
  incorrect with why: the context showed another version, the rule exists but
  was not shown, or there is no such rule or version. A wrong citation is an
  explanation that does not match what the agent was given; it does not make
  the action itself wrong, and the DIM judges actions, so the verdict stands
  and the record is what an auditor (or a pack rule reading it) works from.
- **Advisory constraints.** A proposal that touches an active ``preferred``
  constraint is not refused; the constraints it touches are recorded
  (:class:`~kernel.core.events.ConstraintAdvisory`) so ``dirk show`` and the
  counterfactuals see them.
"""

from __future__ import annotations

import re

from kernel.core.events import (
    CitationsChecked,
    ConstraintAdvisory,
    Payload,
    ProposalRecord,
)
from kernel.core.flow import FlowState
from kernel.state.constraints import ENFORCED, advisories
from kernel.state.memory import MemoryState
from kernel.state.rulebook import Rulebook

CITATION = re.compile(r"\[rule:([^\]\s@]+)@v(\d+)\]")
"""A citation in an explanation: ``[rule:id@vN]``."""


def cited(explain: str) -> list[str]:
    """Return the ``id@vN`` an explanation cites, each once, in order of appearance."""
    seen: dict[str, None] = {}
    for match in CITATION.finditer(explain):
        seen.setdefault(f"{match[1]}@v{int(match[2])}", None)
    return list(seen)


def check_citations(explain: str, shown: list[str], book: Rulebook) -> CitationsChecked | None:
    """Return which citations of ``explain`` the context (``shown``) held; None if none."""
    if "[rule:" not in explain:
        return None  # cites nothing (most explanations): no pattern to run
    refs = cited(explain)
    if not refs:
        return None
    shown_versions = dict(ref.rsplit("@v", 1) for ref in shown)
    correct: list[str] = []
    incorrect: dict[str, str] = {}
    for ref in refs:
        rule, version = ref.rsplit("@v", 1)
        ns, rule_id = book.resolve(rule)  # ``ns/id`` outside the default namespace
        item = book.item(rule_id, ns)
        if ref in shown:
            correct.append(ref)
        elif rule in shown_versions:
            incorrect[ref] = f"WRONG_VERSION: the context showed v{shown_versions[rule]}"
        elif item is None or not 1 <= int(version) <= len(item.versions):
            incorrect[ref] = "UNKNOWN_RULE: the rulebook has no such rule version"
        else:
            incorrect[ref] = (
                "NOT_IN_CONTEXT: the rule exists but this flow's context did not show it"
            )
    return CitationsChecked(correct=correct, incorrect=incorrect)


def notes_on(
    memory: MemoryState,
    flow: FlowState,
    proposal: ProposalRecord,
    tenant: str = "",
    shown: list[str] | None = None,
) -> list[Payload]:
    """Return the notes to record beside ``proposal``: its citations, its advisories.

    The advisories are of the constraints that bind ``tenant`` (shared ones and its own).
    ``shown`` is what the flow's latest context showed when it is not folded yet (staged
    in the same append as the proposal: a synchronous agent's); None: as committed.
    """
    notes: list[Payload] = []
    book = memory.rulebook
    if shown is None:
        shown = book.shown.get(flow.dfid, [])
    citations = check_citations(proposal.explain, shown, book)
    if citations is not None:
        notes.append(citations)
    if not any(c.priority not in ENFORCED for c in memory.constraints.values()):
        return notes  # no advisory (preferred) constraint to note
    touched = advisories(memory.seen_by(tenant), proposal, flow.agent_id, flow.root_dfid)
    if touched:
        texts = "; ".join(
            f"#{seq} {memory.constraints[seq].text!r}"
            for seq in touched
            if seq in memory.constraints
        )
        notes.append(ConstraintAdvisory(constraints=touched, detail=f"preferred: {texts}"))
    return notes
