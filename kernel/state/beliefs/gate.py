"""The beliefs layer of the DIM: a pure judgement of a belief proposal against the graph.

:func:`check` refuses, with a fixed reason code (docs/beliefs.md maps the seed's
five codes onto them); :func:`transform` says in which form an admissible
proposal is applied when that differs from the submitted one (a duplicate
proposition becomes support for the one already there). Both are functions of
the graph as committed before the proposal, the proposal and the recorded
judgement time, so ``dirk verify --verdicts`` re-judges them identically.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernel.core.events import Applied, Feedback
from kernel.core.reasons import ReasonCode
from kernel.state.beliefs.effects import ATTACH_SUPPORT, PREFIX, PROPOSE_PROPOSITION
from kernel.state.beliefs.graph import ARCHIVED, DISCARDED, BeliefGraph, fold_name
from kernel.state.beliefs.scoring import (
    BeliefState,
    Impact,
    micro,
    suppressed,
    triggers,
)

LAYER = "beliefs"
MAX_SPAWNED = 3
"""Propositions one observation may spawn (the workspace spawns "a limited number")."""

ASSERTED = ("status", "state", "belief_state", "confidence", "canonical")
"""Parameters through which a proposal would assert a belief or write canonical memory."""


def _refuse(code: ReasonCode, detail: str, field: str = "") -> Feedback:
    return Feedback(reason_code=code, detail=detail, layer=LAYER, field=field)


def _text(params: Mapping[str, Any], name: str) -> str:
    value = params.get(name, "")
    return value if isinstance(value, str) else ""


def _list(params: Mapping[str, Any], name: str) -> list[str]:
    value = params.get(name, [])
    return [str(v) for v in value] if isinstance(value, list) else []


def _unrecorded(graph: BeliefGraph, observations: list[str], field: str) -> Feedback | None:
    if not observations:
        return _refuse(
            ReasonCode.MISSING_PROVENANCE, "names no recorded observation", f"params.{field}"
        )
    for observation in observations:
        if observation not in graph.observations:
            return _refuse(
                ReasonCode.MISSING_PROVENANCE,
                f"observation {observation!r} was never recorded",
                f"params.{field}",
            )
    return None


def check(
    graph: BeliefGraph,
    kind: str,
    params: Mapping[str, Any],
    correlation_id: str,
    now_ns: int,
) -> Feedback | None:
    """Return the refusal of a belief proposal, or None if the graph admits it.

    Args:
        graph: the belief graph as committed before the proposal.
        kind: the proposal's kind (only ``governance.*`` kinds are judged here).
        params: its parameters (the schema layer already checked their types).
        correlation_id: the root DFID of its flow (the default task).
        now_ns: the recorded time to score at (the DIM passes the graph's ``latest_ns``).
    """
    if not kind.startswith(PREFIX):
        return None
    for name in ASSERTED:
        if params.get(name) not in (None, "", False):
            return _refuse(
                ReasonCode.DIRECT_CANONICAL_WRITE_FORBIDDEN,
                f"belief state is derived from evidence: {name!r} may not be asserted",
                f"params.{name}",
            )
    match kind:
        case "governance.record_observation":
            return _observation(graph, params)
        case "governance.create_or_link_entity_candidate":
            return _unrecorded(graph, [_text(params, "observation")], "observation")
        case "governance.propose_proposition":
            return _proposition(graph, params)
        case "governance.attach_support" | "governance.attach_contradiction":
            return _attach(graph, params)
        case "governance.propose_test":
            return _test(graph, params, now_ns)
        case "governance.execute_test_result_ingest":
            return _ingest(graph, params)
    return None


def _observation(graph: BeliefGraph, params: Mapping[str, Any]) -> Feedback | None:
    observation, source = _text(params, "observation"), _text(params, "source")
    if not source:
        return _refuse(
            ReasonCode.MISSING_PROVENANCE, "an observation names its source", "params.source"
        )
    if not observation:
        return _refuse(ReasonCode.SCHEMA_INVALID, "an observation has an id", "params.observation")
    if observation in graph.observations or observation.startswith("test:"):
        return _refuse(
            ReasonCode.CONSTRAINT_VIOLATION,
            f"observation {observation!r} exists: observations are immutable, record a new one",
            "params.observation",
        )
    reliability = _text(params, "reliability")
    if reliability:
        try:
            micro(reliability)
        except ValueError as e:
            return _refuse(ReasonCode.SCHEMA_INVALID, str(e), "params.reliability")
    known = graph.sources.get(source)
    group = _text(params, "independence_group")
    if known is not None and group and group != known.group:
        return _refuse(
            ReasonCode.CONSTRAINT_VIOLATION,
            f"source {source!r} belongs to independence group {known.group!r}, not {group!r}",
            "params.independence_group",
        )
    return None


def _proposition(graph: BeliefGraph, params: Mapping[str, Any]) -> Feedback | None:
    derived = _list(params, "derived_from")
    refused = _unrecorded(graph, derived, "derived_from") or _ill_formed(graph, params)
    if refused is not None:
        return refused
    if duplicate_of(graph, params) is not None:
        if transform(graph, PROPOSE_PROPOSITION, params) is None:
            return _refuse(
                ReasonCode.CONSTRAINT_VIOLATION,
                "the same proposition exists with this evidence already",
                "params.text",
            )
        return None
    return _fresh(graph, _text(params, "proposition"), derived)


def _ill_formed(graph: BeliefGraph, params: Mapping[str, Any]) -> Feedback | None:
    """Refuse a proposition without an id or a text, or about what the graph does not hold."""
    if not _text(params, "proposition") or not _text(params, "text").strip():
        return _refuse(
            ReasonCode.SCHEMA_INVALID, "a proposition has an id and a text", "params.proposition"
        )
    for entity in _list(params, "about"):
        if entity not in graph.entities:
            return _refuse(ReasonCode.SCHEMA_INVALID, f"no entity {entity!r}", "params.about")
    superseded = _text(params, "supersedes")
    if superseded and superseded not in graph.propositions:
        return _refuse(
            ReasonCode.SCHEMA_INVALID, f"no proposition {superseded!r}", "params.supersedes"
        )
    return None


def _fresh(graph: BeliefGraph, name: str, derived: list[str]) -> Feedback | None:
    """Refuse a new proposition whose id is taken or whose observations spawned enough."""
    if name in graph.propositions:
        return _refuse(
            ReasonCode.CONSTRAINT_VIOLATION, f"proposition {name!r} exists", "params.proposition"
        )
    for observation in derived:
        if graph.observations[observation].spawned >= MAX_SPAWNED:
            return _refuse(
                ReasonCode.CONSTRAINT_VIOLATION,
                f"observation {observation!r} already spawned {MAX_SPAWNED} propositions",
                "params.derived_from",
            )
    return None


def _attach(graph: BeliefGraph, params: Mapping[str, Any]) -> Feedback | None:
    name = _text(params, "proposition")
    observation = _text(params, "observation")
    if name not in graph.propositions:
        return _refuse(ReasonCode.SCHEMA_INVALID, f"no proposition {name!r}", "params.proposition")
    missing = _unrecorded(graph, [observation], "observation")
    if missing is not None:
        return missing
    if observation in graph.propositions[name].observations:
        return _refuse(
            ReasonCode.CONSTRAINT_VIOLATION,
            f"observation {observation!r} is already evidence of {name!r}: evidence counts once",
            "params.observation",
        )
    return None


def _test(graph: BeliefGraph, params: Mapping[str, Any], now_ns: int) -> Feedback | None:
    test, name = _text(params, "test"), _text(params, "proposition")
    names = [name, *_list(params, "competing")]
    refused = _test_named(graph, test, names)
    if refused is not None:
        return refused
    try:
        cost = micro(_text(params, "cost") or "0")
        impact = Impact(_text(params, "action_impact") or "high")
    except ValueError as e:
        return _refuse(ReasonCode.SCHEMA_INVALID, str(e), "params")
    return _test_worth(graph, names, impact, cost, now_ns)


def _test_named(graph: BeliefGraph, test: str, names: list[str]) -> Feedback | None:
    """Refuse a test without a fresh id, or naming propositions the graph does not hold."""
    if not test:
        return _refuse(ReasonCode.SCHEMA_INVALID, "a test has an id", "params.test")
    if test in graph.tests:
        return _refuse(ReasonCode.CONSTRAINT_VIOLATION, f"test {test!r} exists", "params.test")
    for each in names:
        if each not in graph.propositions:
            return _refuse(ReasonCode.SCHEMA_INVALID, f"no proposition {each!r}", "params")
    return None


def _test_worth(
    graph: BeliefGraph, names: list[str], impact: Impact, cost: int, now_ns: int
) -> Feedback | None:
    """Refuse a test of a settled proposition, or one whose uncertainty does not matter."""
    name = names[0]
    target = graph.propositions[name]
    if target.state == BeliefState.REJECTED or target.layer in (ARCHIVED, DISCARDED):
        return _refuse(
            ReasonCode.CONSTRAINT_VIOLATION, f"{name!r} is {target.state}", "params.proposition"
        )
    assessment = graph.assess(name, now_ns)
    fired = triggers(
        impact=impact,
        confidences=[graph.assess(n, now_ns).confidence for n in names],
        target=assessment,
        contested_updates=target.contested_updates,
        unresolved_contradictions=target.unresolved,
    )
    if not fired:
        return _refuse(
            ReasonCode.CONSTRAINT_VIOLATION,
            "no test trigger holds: tests run only when uncertainty matters",
            "params.proposition",
        )
    if suppressed(impact, cost, assessment.confidence):
        return _refuse(
            ReasonCode.CONSTRAINT_VIOLATION,
            "low impact and the test costs more than its bounded benefit",
            "params.cost",
        )
    return None


def _ingest(graph: BeliefGraph, params: Mapping[str, Any]) -> Feedback | None:
    test = graph.tests.get(_text(params, "test"))
    if test is None or not test.outcome:
        return _refuse(
            ReasonCode.MISSING_PROVENANCE,
            f"no executed test {_text(params, 'test')!r}: its result must be recorded first",
            "params.test",
        )
    if test.ingested:
        return _refuse(
            ReasonCode.CONSTRAINT_VIOLATION, f"test {test.test!r} was ingested", "params.test"
        )
    claimed = _text(params, "outcome")
    if claimed and claimed != test.outcome:
        return _refuse(
            ReasonCode.CONSTRAINT_VIOLATION,
            f"the recorded outcome of test {test.test!r} is {test.outcome!r}, not {claimed!r}",
            "params.outcome",
        )
    return None


def duplicate_of(graph: BeliefGraph, params: Mapping[str, Any]) -> str | None:
    """The live proposition with the same text and subjects as a proposed one, if any."""
    text = fold_name(_text(params, "text"))
    about = sorted(_list(params, "about"))
    for p in graph.propositions.values():
        if (
            fold_name(p.text) == text
            and sorted(p.about) == about
            and p.layer not in (ARCHIVED, DISCARDED)
            and p.state != BeliefState.REJECTED
        ):
            return p.proposition
    return None


def transform(graph: BeliefGraph, kind: str, params: Mapping[str, Any]) -> Applied | None:
    """Return the form an admissible proposal is applied in, None to apply it as submitted.

    A propose_proposition whose text and subjects match a live proposition becomes
    an attach_support of that proposition by the first of its observations not yet
    evidence of it (None if there is none: :func:`check` refuses it then).
    """
    if kind != PROPOSE_PROPOSITION:
        return None
    existing = duplicate_of(graph, params)
    if existing is None:
        return None
    seen = graph.propositions[existing].observations
    fresh = [o for o in _list(params, "derived_from") if o not in seen]
    if not fresh:
        return None
    applied: dict[str, Any] = {"proposition": existing, "observation": fresh[0]}
    if _text(params, "task"):
        applied["task"] = _text(params, "task")
    return Applied(
        kind=ATTACH_SUPPORT,
        params=applied,
        reason=f"duplicate of proposition {existing!r}: applied as its support",
    )
