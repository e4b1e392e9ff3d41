"""Reactivation: canonical memory brought back into a new task's context (governance 13.5).

Given a new task, the context compiler asks :func:`reactivate` for the relevant part
of canonical memory, and shows it as the context's ``knowledge`` layer:

1. **Entities**: canonical entities whose name or an alias occurs in the task's text
   (its topic, and the keys and text values of the state the agent sees), matched by
   meaning as constraints are (:mod:`kernel.state.meaning`: stems, not spelling).
2. **Propositions**: canonical propositions about those entities, each with its belief
   state, confidence and freshness *at the context's recorded compile time* (scored
   from the recorded evidence, :meth:`BeliefGraph.assess`), and its provenance: the
   task it was learned in, the consolidation that promoted it, the observations and
   sources behind its support and contradiction.
3. **Episodes**: the summaries of the archived episodes those propositions came from.

The budget is fixed, as the governance document fixes the carryover of a task
(section 13.4: 20 propositions): at most :data:`MAX_PROPOSITIONS` propositions (held
ones first, then newest), :data:`MAX_ENTITIES` entities, :data:`MAX_EPISODES` episodes.
Nothing else is loaded: a canonical proposition about no entity of the task stays out.

A pure function of the graph, the text and the recorded time: the compiler records
what it brought back (``ContextCompiled.reactivated``), and compiling again from the
same journal position gives the same layer (tested).
"""

from __future__ import annotations

from typing import Any

from kernel.state.beliefs.graph import (
    CANONICAL,
    BeliefGraph,
    EpisodeRecord,
    PropositionRecord,
)
from kernel.state.meaning import phrase_in, words

MAX_PROPOSITIONS = 20
"""The governance document's fixed carryover per task (13.4 item 5), reused as the budget."""
MAX_ENTITIES = 20
MAX_EPISODES = 3
HELD = ("accepted", "provisional")


def _entities(graph: BeliefGraph, text: str) -> list[str]:
    """The canonical entities named in ``text`` (by name or alias), oldest first."""
    found = []
    for entity in sorted(graph.entities.values(), key=lambda e: e.seq):
        if entity.layer != CANONICAL:
            continue
        names = [entity.name, *entity.aliases]
        if any(words(name) and phrase_in(name, text) for name in names):
            found.append(entity.entity)
    return found[:MAX_ENTITIES]


def _provenance(graph: BeliefGraph, p: PropositionRecord) -> dict[str, Any]:
    promoted = [x for x in graph.promotions if x.proposition == p.proposition]
    evidence = [*p.support, *p.contradiction]
    observations = sorted({e.observation for e in evidence if e.observation})
    sources = sorted(
        {graph.observations[o].source for o in observations if o in graph.observations}
    )
    return {
        "task": p.task,
        "proposed_seq": p.seq,
        "consolidation": promoted[-1].consolidation if promoted else "",
        "promoted_seq": promoted[-1].seq if promoted else 0,
        "observations": observations,
        "sources": sources,
    }


def _shown(graph: BeliefGraph, p: PropositionRecord, now_ns: int) -> dict[str, Any]:
    scored = graph.assess(p.proposition, now_ns)
    return {
        "id": p.proposition,
        "text": p.text,
        "class": p.proposition_class,
        "about": list(p.about),
        "state": str(p.state),
        "confidence": scored.confidence,
        "freshness": scored.freshness,
        "provenance": _provenance(graph, p),
    }


def reactivate(graph: BeliefGraph, text: str, now_ns: int) -> tuple[dict[str, Any], list[str]]:
    """Return the knowledge layer for a task described by ``text``, and what it brought back.

    Args:
        graph: the belief graph at the compile's journal position.
        text: the task's text (topic, state keys and values the agent sees).
        now_ns: the context's recorded compile time (freshness is scored at it).

    Returns:
        ``({"entities": ..., "propositions": ..., "episodes": ...}, ids)``, both empty
        when canonical memory holds nothing relevant; ids are ``entity:<id>``,
        ``proposition:<id>``, ``episode:<id>`` in the order shown.
    """
    if not graph.promotions:
        return {}, []
    entities = _entities(graph, text)
    if not entities:
        return {}, []
    chosen = _propositions(graph, set(entities))
    episodes = _episodes(graph, {p.proposition for p in chosen})
    layer: dict[str, Any] = {
        "entities": [_entity(graph, e) for e in entities],
        "propositions": [_shown(graph, p, now_ns) for p in chosen],
        "episodes": [
            {"id": e.episode, "task": e.task, "summary": e.summary, "seq": e.seq} for e in episodes
        ],
    }
    reactivated = [f"entity:{e}" for e in entities]
    reactivated += [f"proposition:{p.proposition}" for p in chosen]
    reactivated += [f"episode:{e.episode}" for e in episodes]
    return layer, reactivated


def _propositions(graph: BeliefGraph, entities: set[str]) -> list[PropositionRecord]:
    """The canonical propositions about ``entities``: held first, then newest; the budget."""
    about = [
        p
        for p in graph.propositions.values()
        if p.layer == CANONICAL and entities.intersection(p.about)
    ]
    about.sort(key=lambda p: (p.state not in HELD, -p.seq))
    return about[:MAX_PROPOSITIONS]


def _episodes(graph: BeliefGraph, propositions: set[str]) -> list[EpisodeRecord]:
    """The newest archived episodes that hold any of ``propositions``."""
    newest = sorted(graph.episodes.values(), key=lambda e: -e.seq)
    return [e for e in newest if propositions.intersection(e.propositions)][:MAX_EPISODES]


def _entity(graph: BeliefGraph, entity: str) -> dict[str, Any]:
    record = graph.entities[entity]
    return {
        "id": entity,
        "name": record.name,
        "type": record.entity_type,
        "aliases": list(record.aliases),
    }
