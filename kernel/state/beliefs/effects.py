"""What an accepted belief proposal records: a pure function of the graph, the proposal and "now".

:func:`effects` returns the events the beliefs executor hands the execution engine
for one accepted intent (the engine records them with its ExecutionSucceeded).
It folds its own primary events into a copy of the graph, then re-assesses the
propositions they touch and every other proposition of the task's workspace at
``now_ns`` (a recorded time: the events carry it as ``at_ns``), and appends one
PropositionTransitioned per state that changed, naming the evidence that caused
it (decay is caused by ``time``: the recorded event that brought the later "now").
A consolidation, at the task boundary or every 25 observations, comes last.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernel.core.events import (
    Archived,
    ConsolidationRecorded,
    EntityCandidateRecorded,
    EpisodeArchived,
    Event,
    EvidenceAttached,
    ObservationRecorded,
    Payload,
    PropositionProposed,
    PropositionTransitioned,
    SourceRegistered,
    TestResultIngested,
)
from kernel.state.beliefs.graph import BeliefGraph
from kernel.state.beliefs.scoring import (
    CARRY_OVER_CAP,
    CONSOLIDATE_EVERY,
    SCALE,
    BeliefState,
    micro,
    promotable,
)

PREFIX = "governance."
RECORD_OBSERVATION = PREFIX + "record_observation"
LINK_ENTITY = PREFIX + "create_or_link_entity_candidate"
PROPOSE_PROPOSITION = PREFIX + "propose_proposition"
ATTACH_SUPPORT = PREFIX + "attach_support"
ATTACH_CONTRADICTION = PREFIX + "attach_contradiction"
PROPOSE_TEST = PREFIX + "propose_test"
INGEST_TEST_RESULT = PREFIX + "execute_test_result_ingest"
REQUEST_CONSOLIDATION = PREFIX + "request_consolidation"
ARCHIVE_EPISODE = PREFIX + "archive_episode"
KINDS = (
    RECORD_OBSERVATION,
    LINK_ENTITY,
    PROPOSE_PROPOSITION,
    ATTACH_SUPPORT,
    ATTACH_CONTRADICTION,
    PROPOSE_TEST,
    INGEST_TEST_RESULT,
    REQUEST_CONSOLIDATION,
    ARCHIVE_EPISODE,
)
"""The nine tools of the seed's LLM boundary, as policy kinds of the ``governance`` pack."""

_UNRESOLVED_ORDER = {
    BeliefState.CONTESTED: 0,
    BeliefState.PROVISIONAL: 1,
    BeliefState.TENTATIVE: 2,
}


class _Scratch:
    """The graph as it will be once the events staged so far are recorded."""

    def __init__(self, graph: BeliefGraph, now_ns: int) -> None:
        self.graph = graph.copy()
        self.now_ns = now_ns
        self.events: list[Payload] = []
        self._seq = -1  # seqs are unknown until recorded; ids link evidence meanwhile

    def add(self, payload: Payload) -> None:
        self.events.append(payload)
        self.graph.apply(Event(seq=self._seq, ts=self.now_ns, payload=payload))  # type: ignore[arg-type]

    def reassess(
        self,
        task: str,
        key: str,
        touched: Mapping[str, tuple[str, str]],
        default: tuple[str, str],
    ) -> None:
        """Record a transition for every proposition whose state now differs.

        ``touched`` maps the propositions the evidence was about to (cause, evidence
        id); the rest of the task's workspace changes only with time: ``default``
        names ("time", the id of the recorded event that brought this "now").
        """
        names = list(dict.fromkeys([*touched, *self.graph.workspace(task)]))
        for name in names:
            p = self.graph.propositions.get(name)
            if p is None:
                continue
            a = self.graph.assess(name, self.now_ns)
            if a.state == p.state and p.transitions:
                continue
            cause, evidence = touched.get(name, default)
            self.add(
                PropositionTransitioned(
                    proposition=name,
                    from_state=p.state if p.transitions else "",
                    to_state=a.state,
                    cause=cause,
                    evidence=evidence,
                    confidence=a.confidence,
                    support=a.support,
                    contradiction=a.contradiction,
                    support_groups=a.support_groups,
                    contradiction_groups=a.contradiction_groups,
                    freshness=a.freshness,
                    task=task,
                    at_ns=self.now_ns,
                    key=key,
                )
            )

    def consolidate(self, task: str, key: str, trigger: str) -> None:
        """Promote, carry over, archive and discard the task's workspace (section 13.4)."""
        graph = self.graph
        space = graph.workspaces.get(task)
        number = space.consolidations + 1 if space is not None else 1
        cid = f"consolidation:{task}:{number}"
        names = graph.workspace(task)
        promoted, archived, discarded, unresolved = [], [], [], []
        for name in names:
            # Re-assessed at consolidation time: the state and the freshness of now.
            p = graph.propositions[name]
            a = graph.assess(name, self.now_ns)
            if promotable(a):
                promoted.append(name)
            elif a.state in (BeliefState.REJECTED, BeliefState.DEPRECATED):
                archived.append(Archived(proposition=name, reason=a.state.upper()))
            elif a.state == BeliefState.ACCEPTED:
                # Accepted, yet too stale to promote (freshness < 0.35): keep it open.
                unresolved.append((_UNRESOLVED_ORDER[BeliefState.PROVISIONAL], -a.confidence, name))
            elif not p.support and not p.contradiction:
                discarded.append(name)  # transient clutter: never any evidence
            else:
                unresolved.append((_UNRESOLVED_ORDER.get(a.state, 3), -a.confidence, name))
        unresolved.sort()
        carried = [name for _, _, name in unresolved[:CARRY_OVER_CAP]]
        archived += [
            Archived(proposition=name, reason="CARRY_OVER_CAP")
            for _, _, name in unresolved[CARRY_OVER_CAP:]
        ]
        self.add(
            ConsolidationRecorded(
                consolidation=cid,
                trigger=trigger,
                promoted=promoted,
                carried_over=carried,
                archived=archived,
                discarded=discarded,
                observations=space.observations if space is not None else 0,
                task=task,
                at_ns=self.now_ns,
                key=key,
            )
        )
        cause = ("consolidation", cid)
        self.reassess(task, key, dict.fromkeys(names, cause), cause)


def _text(params: Mapping[str, Any], name: str, default: str = "") -> str:
    value = params.get(name, default)
    return value if isinstance(value, str) else default


def _list(params: Mapping[str, Any], name: str) -> list[str]:
    value = params.get(name, [])
    return [str(v) for v in value] if isinstance(value, list) else []


def task_of(params: Mapping[str, Any], correlation_id: str) -> str:
    """The task a belief proposal belongs to: its ``task`` parameter, else its flow's root."""
    return _text(params, "task") or correlation_id


def new_entity_id(graph: BeliefGraph, name: str) -> str:
    """A fresh entity id for ``name``: ``entity:<name>``, numbered if taken."""
    base = "entity:" + "-".join(name.casefold().split())
    found, n = base, 1
    while found in graph.entities:
        n += 1
        found = f"{base}#{n}"
    return found


def effects(
    graph: BeliefGraph,
    kind: str,
    params: Mapping[str, Any],
    *,
    task: str,
    key: str,
    now_ns: int,
) -> list[Payload]:
    """Return the events an accepted belief proposal records, in order.

    The proposal passed the gate (:func:`kernel.state.beliefs.gate.check`) against
    this graph; ``now_ns`` is the recorded time every score is computed at.
    """
    s = _Scratch(graph, now_ns)
    touched: dict[str, tuple[str, str]] = {}
    now = key  # the id of what this call records: what brought its "now" (decay's cause)
    g = s.graph
    match kind:
        case "governance.record_observation":
            source = _text(params, "source")
            group = _text(params, "independence_group")
            if source not in g.sources:
                reliability = _text(params, "reliability")
                s.add(
                    SourceRegistered(
                        source=source,
                        source_type=_text(params, "source_type"),
                        independence_group=group or source,
                        reliability=micro(reliability) if reliability else SCALE,
                        domain_tags=_list(params, "domain_tags"),
                        task=task,
                        at_ns=now_ns,
                        key=key,
                    )
                )
            registered = g.sources[source]
            now = _text(params, "observation")
            parsed = params.get("parsed_payload", {})
            s.add(
                ObservationRecorded(
                    observation=_text(params, "observation"),
                    source=source,
                    source_type=registered.source_type,
                    independence_group=registered.group,
                    session=_text(params, "session"),
                    raw_payload=_text(params, "raw_payload"),
                    parsed_payload=dict(parsed) if isinstance(parsed, dict) else {},
                    task=task,
                    at_ns=now_ns,
                    key=key,
                )
            )
        case "governance.create_or_link_entity_candidate":
            _entity(s, params, task, key)
        case "governance.propose_proposition":
            name = _text(params, "proposition")
            s.add(
                PropositionProposed(
                    proposition=name,
                    text=_text(params, "text"),
                    proposition_class=_text(params, "proposition_class", "descriptive"),
                    volatility=_text(params, "volatility", "medium"),
                    about=_list(params, "about"),
                    predicts=_list(params, "predicts"),
                    supersedes=_text(params, "supersedes"),
                    derived_from=_list(params, "derived_from"),
                    task=task,
                    at_ns=now_ns,
                    key=key,
                )
            )
            touched[name] = ("proposed", f"proposed:{name}")
            now = f"proposed:{name}"
            for observation in _list(params, "derived_from"):
                touched[name] = _attach(s, name, observation, "supports", task, key)
        case "governance.attach_support" | "governance.attach_contradiction":
            stance = "supports" if kind.endswith("support") else "contradicts"
            name = _text(params, "proposition")
            touched[name] = _attach(s, name, _text(params, "observation"), stance, task, key)
            now = touched[name][1]
        case "governance.execute_test_result_ingest":
            _ingest(s, _text(params, "test"), task, key, touched)
            now = f"test:{_text(params, 'test')}"
        case "governance.request_consolidation":
            s.consolidate(task, key, "task_boundary")
            return s.events
        case "governance.archive_episode":
            s.consolidate(task, key, "task_boundary")
            episode = _text(params, "episode") or task
            states = {p.proposition: p.state for p in g.propositions.values() if p.task == task}
            s.add(
                EpisodeArchived(
                    episode=episode,
                    summary=_text(params, "summary"),
                    observations=sum(1 for o in g.observations.values() if o.task == task),
                    propositions=states,
                    task=task,
                    at_ns=now_ns,
                    key=key,
                )
            )
            return s.events
    s.reassess(task, key, touched, ("time", now))
    space = g.workspaces.get(task)
    counted = kind in (RECORD_OBSERVATION, INGEST_TEST_RESULT)
    if counted and space is not None and space.observations >= CONSOLIDATE_EVERY:
        s.consolidate(task, key, "cadence")
    return s.events


def _attach(
    s: _Scratch, proposition: str, observation: str, stance: str, task: str, key: str
) -> tuple[str, str]:
    g = s.graph
    found = g.observations[observation]
    source = g.sources.get(found.source)
    evidence = f"{observation}>{proposition}"
    s.add(
        EvidenceAttached(
            evidence=evidence,
            proposition=proposition,
            observation=observation,
            stance=stance,
            source=found.source,
            independence_group=found.group,
            reliability=source.reliability if source is not None else SCALE,
            task=task,
            at_ns=s.now_ns,
            key=key,
        )
    )
    return stance, evidence


def _entity(s: _Scratch, params: Mapping[str, Any], task: str, key: str) -> None:
    """Link an unambiguous name to its entity as an alias; otherwise create a candidate.

    Creation is cheap and merging expensive: a name several entities bear, or a
    new id asked for a name already borne, makes a new candidate with
    ``possible_same_as`` edges, never a merge.
    """
    g = s.graph
    name = _text(params, "name")
    wanted = _text(params, "entity")
    alias_of = _text(params, "alias_of")
    bearers = g.named(name)
    observation = _text(params, "observation")

    def candidate(
        entity: str, linked_to: str = "", maybe: list[str] | None = None
    ) -> EntityCandidateRecorded:
        return EntityCandidateRecorded(
            entity=entity,
            name=name,
            entity_type=_text(params, "entity_type"),
            linked_to=linked_to,
            possible_same_as=maybe or [],
            observation=observation,
            task=task,
            at_ns=s.now_ns,
            key=key,
        )

    if alias_of in g.entities and set(bearers) <= {alias_of}:
        s.add(candidate(alias_of, linked_to=alias_of))
    elif not alias_of and wanted in g.entities:
        s.add(candidate(wanted, linked_to=wanted))
    elif not alias_of and not wanted and len(bearers) == 1:
        s.add(candidate(bearers[0], linked_to=bearers[0]))
    else:
        # Ambiguous (several bear the name, or the alias claim conflicts): a new
        # candidate beside them, linked by possible_same_as, never merged.
        entity = wanted if wanted and wanted not in g.entities else new_entity_id(g, name)
        maybe = sorted({*bearers, *([alias_of] if alias_of in g.entities else [])} - {entity})
        s.add(candidate(entity, maybe=maybe))


def _ingest(
    s: _Scratch, test: str, task: str, key: str, touched: dict[str, tuple[str, str]]
) -> None:
    g = s.graph
    record = g.tests[test]
    observation = f"test:{test}"
    source = f"test:{test}"
    s.add(
        SourceRegistered(
            source=source,
            source_type="test",
            independence_group=source,
            reliability=SCALE,
            task=task,
            at_ns=s.now_ns,
            key=key,
        )
    )
    s.add(
        ObservationRecorded(
            observation=observation,
            source=source,
            source_type="test",
            independence_group=source,
            raw_payload=f"test {test} of {record.proposition}: {record.outcome}",
            parsed_payload={"outcome": record.outcome, "method": record.method},
            test=test,
            task=task,
            at_ns=s.now_ns,
            key=key,
        )
    )
    s.add(
        TestResultIngested(
            test=test,
            proposition=record.proposition,
            outcome=record.outcome,
            observation=observation,
            task=task,
            at_ns=s.now_ns,
            key=key,
        )
    )
    touched[record.proposition] = ("test", f"test:{test}")
    if record.outcome == "failed":
        # A failed discriminating test refutes its proposition against the competing
        # ones: their transitions (contradiction from it no longer counts) name it.
        for rival in record.competing:
            if rival in g.propositions and rival != record.proposition:
                touched.setdefault(rival, ("test", f"test:{test}"))
    if record.outcome in ("passed", "failed"):
        stance = "supports" if record.outcome == "passed" else "contradicts"
        _attach(s, record.proposition, observation, stance, task, key)
