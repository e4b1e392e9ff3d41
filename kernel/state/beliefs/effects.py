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

from collections.abc import Callable, Mapping
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
from kernel.state.beliefs.graph import BeliefGraph, PropositionRecord
from kernel.state.beliefs.scoring import (
    CARRY_OVER_CAP,
    CONSOLIDATE_EVERY,
    SCALE,
    Assessment,
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
        promoted: list[str] = []
        archived: list[Archived] = []
        discarded: list[str] = []
        unresolved: list[tuple[int, int, str]] = []
        for name in names:
            # Re-assessed at consolidation time: the state and the freshness of now.
            a = graph.assess(name, self.now_ns)
            match _fate(graph.propositions[name], a):
                case "promoted":
                    promoted.append(name)
                case "archived":
                    archived.append(Archived(proposition=name, reason=a.state.upper()))
                case "discarded":
                    discarded.append(name)  # transient clutter: never any evidence
                case int(rank):
                    unresolved.append((rank, -a.confidence, name))
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


def _fate(p: PropositionRecord, a: Assessment) -> str | int:
    """Return where a consolidation puts a workspace proposition: promoted, archived,
    discarded, or its rank among the unresolved ones it may carry over."""
    if promotable(a):
        return "promoted"
    if a.state in (BeliefState.REJECTED, BeliefState.DEPRECATED):
        return "archived"
    if a.state == BeliefState.ACCEPTED:
        # Accepted, yet too stale to promote (freshness < 0.35): keep it open.
        return _UNRESOLVED_ORDER[BeliefState.PROVISIONAL]
    if not p.support and not p.contradiction:
        return "discarded"
    return _UNRESOLVED_ORDER.get(a.state, 3)


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
    # Each kind's step returns the id of what this call records that brought its "now"
    # (decay's cause), or None when its consolidation already reassessed the workspace.
    now = _STEPS.get(kind, _nothing)(s, params, task, key, touched)
    if now is None:
        return s.events
    s.reassess(task, key, touched, ("time", now))
    space = s.graph.workspaces.get(task)
    counted = kind in (RECORD_OBSERVATION, INGEST_TEST_RESULT)
    if counted and space is not None and space.observations >= CONSOLIDATE_EVERY:
        s.consolidate(task, key, "cadence")
    return s.events


_Step = Callable[[_Scratch, Mapping[str, Any], str, str, dict[str, tuple[str, str]]], str | None]


def _nothing(
    s: _Scratch, params: Mapping[str, Any], task: str, key: str, touched: dict[str, tuple[str, str]]
) -> str:
    return key


def _observe(
    s: _Scratch, params: Mapping[str, Any], task: str, key: str, touched: dict[str, tuple[str, str]]
) -> str:
    source = _text(params, "source")
    if source not in s.graph.sources:
        reliability = _text(params, "reliability")
        group = _text(params, "independence_group")
        s.add(
            SourceRegistered(
                source=source,
                source_type=_text(params, "source_type"),
                independence_group=group or source,
                reliability=micro(reliability) if reliability else SCALE,
                domain_tags=_list(params, "domain_tags"),
                task=task,
                at_ns=s.now_ns,
                key=key,
            )
        )
    registered = s.graph.sources[source]
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
            at_ns=s.now_ns,
            key=key,
        )
    )
    return _text(params, "observation")


def _link(
    s: _Scratch, params: Mapping[str, Any], task: str, key: str, touched: dict[str, tuple[str, str]]
) -> str:
    _entity(s, params, task, key)
    return key


def _propose(
    s: _Scratch, params: Mapping[str, Any], task: str, key: str, touched: dict[str, tuple[str, str]]
) -> str:
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
            at_ns=s.now_ns,
            key=key,
        )
    )
    touched[name] = ("proposed", f"proposed:{name}")
    for observation in _list(params, "derived_from"):
        touched[name] = _attach(s, name, observation, "supports", task, key)
    return f"proposed:{name}"


def _attached(
    stance: str,
) -> _Step:
    def attach(
        s: _Scratch,
        params: Mapping[str, Any],
        task: str,
        key: str,
        touched: dict[str, tuple[str, str]],
    ) -> str:
        name = _text(params, "proposition")
        touched[name] = _attach(s, name, _text(params, "observation"), stance, task, key)
        return touched[name][1]

    return attach


def _ingested(
    s: _Scratch, params: Mapping[str, Any], task: str, key: str, touched: dict[str, tuple[str, str]]
) -> str:
    _ingest(s, _text(params, "test"), task, key, touched)
    return f"test:{_text(params, 'test')}"


def _consolidated(
    s: _Scratch, params: Mapping[str, Any], task: str, key: str, touched: dict[str, tuple[str, str]]
) -> None:
    s.consolidate(task, key, "task_boundary")


def _archived(
    s: _Scratch, params: Mapping[str, Any], task: str, key: str, touched: dict[str, tuple[str, str]]
) -> None:
    s.consolidate(task, key, "task_boundary")
    g = s.graph
    states = {p.proposition: p.state for p in g.propositions.values() if p.task == task}
    s.add(
        EpisodeArchived(
            episode=_text(params, "episode") or task,
            summary=_text(params, "summary"),
            observations=sum(1 for o in g.observations.values() if o.task == task),
            propositions=states,
            task=task,
            at_ns=s.now_ns,
            key=key,
        )
    )


_STEPS: dict[str, _Step] = {
    RECORD_OBSERVATION: _observe,
    LINK_ENTITY: _link,
    PROPOSE_PROPOSITION: _propose,
    ATTACH_SUPPORT: _attached("supports"),
    ATTACH_CONTRADICTION: _attached("contradicts"),
    INGEST_TEST_RESULT: _ingested,
    REQUEST_CONSOLIDATION: _consolidated,
    ARCHIVE_EPISODE: _archived,
}
"""What each kind records (a kind not here records only what time changed)."""


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

    linked = _linked(g, wanted, alias_of, bearers)
    if linked is not None:
        s.add(candidate(linked, linked_to=linked))
        return
    # Ambiguous (several bear the name, or the alias claim conflicts): a new
    # candidate beside them, linked by possible_same_as, never merged.
    entity = wanted if wanted and wanted not in g.entities else new_entity_id(g, name)
    maybe = sorted({*bearers, *([alias_of] if alias_of in g.entities else [])} - {entity})
    s.add(candidate(entity, maybe=maybe))


def _linked(g: BeliefGraph, wanted: str, alias_of: str, bearers: list[str]) -> str | None:
    """Return the entity an unambiguous name is an alias of, or None if it is ambiguous."""
    if alias_of in g.entities and set(bearers) <= {alias_of}:
        return alias_of
    if not alias_of and wanted in g.entities:
        return wanted
    if not alias_of and not wanted and len(bearers) == 1:
        return bearers[0]
    return None


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
