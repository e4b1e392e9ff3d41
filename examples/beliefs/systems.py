"""The compared memory systems, behind one interface.

Every system is handed the same scenario and the same tool calls from the
scripted port, and is asked the same questions at the task boundary:

- ``raw_log``: every observation kept as a line of text; a question retrieves the
  lines that name the entity (by its bare name, as text search does) and the
  attribute, keeps the five most recent, and answers the value most of them give
  (a tie goes to the most recent). It abstains only when nothing is retrieved.
- ``key_value``: one slot per (bare name, attribute); every claim, change or test
  result overwrites it (last write wins). It abstains only on an empty slot.
- :class:`PolicyFold` is the governance pack's policy folded without the kernel, on
  the public :class:`kernel.beliefs.Workbench` (the pack's schema, its gate's
  ``check`` and ``transform``, the executor's ``effects``, the ``BeliefGraph``). It runs
  the two ablations, for which the kernel has no hook: ``no_independence`` (every
  source its own independence group) and ``direct_writes`` (the model's attempted
  canonical writes bypass the gate and pin the proposition accepted until a rival is
  pinned). With neither, it is ``governed_fold``: what the governed kernel must
  reproduce (a test holds them equal), and what runs when no kernel can.

The governed system proper, a real dirk kernel with the governance pack, is
:class:`examples.beliefs.governed.GovernedKernel`.

A system answers a question with a value or ``unknown`` (it abstains), and reports
each ground-truth proposition's state and confidence (micro-units) as it holds it.
Baselines have no belief states, so the value a baseline would answer is held
``accepted``, the other values it saw ``tentative`` (raw log) or ``rejected``
(overwritten in the key-value store), and a value never seen ``absent``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

import msgspec

from examples.beliefs.port import Resolution, ToolCall, bare, proposition_ref
from examples.beliefs.scenarios import ABSTAIN, EPOCH_S, Scenario
from kernel.beliefs import (
    SCALE,
    BeliefGraph,
    ConsolidationRecorded,
    PropositionTransitioned,
    Workbench,
)

ABSENT = "absent"
SECOND_NS = 1_000_000_000


def at_ns(at_s: int, offset_s: int = 0) -> int:
    """A scenario time as recorded nanoseconds (the scenario clock, never the wall)."""
    return (EPOCH_S + offset_s + at_s) * SECOND_NS


class Belief(msgspec.Struct, frozen=True, kw_only=True):
    """How a system holds one proposition at the task boundary."""

    state: str
    confidence: int = 0


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """What a system says at a scenario's end: answers, beliefs, entity resolution."""

    scenario: str
    answers: dict[str, str]
    """Question id -> the value answered, or ``unknown``."""
    beliefs: list[Belief]
    """One per ground-truth proposition, in the scenario's order."""
    entities: dict[str, str]
    """Every mention -> the system's entity for it."""
    rejected_calls: dict[str, int] = {}
    """Tool calls refused, by reason code (governed systems only)."""


class System(Protocol):
    """One compared memory system."""

    name: str

    async def run_scenario(self, sc: Scenario, calls: list[ToolCall], res: Resolution) -> Outcome:
        """Observe every tool call of ``sc`` in order, then answer its questions."""
        ...

    def transitions(self) -> list[dict[str, Any]]:
        """Every belief transition so far, each naming the evidence that caused it."""
        ...

    def consolidations(self) -> list[dict[str, Any]]:
        """Every consolidation so far: promoted, carried over, archived, discarded."""
        ...

    async def aclose(self) -> None:
        """Release what the system holds (a kernel, files)."""
        ...


def observations_in(calls: list[ToolCall]) -> list[tuple[int, str, dict[str, Any]]]:
    """What a memory without a gate sees: (call, text, parsed) of every observation.

    Recorded observations, and each test result the agent brought back (once per
    lookup, however many tests it answered).
    """
    seen: set[str] = set()
    found = []
    for c in calls:
        if c.kind == "record_observation":
            found.append((c.n, str(c.params["raw_payload"]), dict(c.params["parsed_payload"])))
        elif c.kind == "execute_test_result_ingest" and c.context.get("observation") not in seen:
            seen.add(str(c.context["observation"]))
            found.append((c.n, str(c.context["raw_payload"]), dict(c.context["parsed_payload"])))
    return found


class RawLog:
    """Raw text log retrieval: the five most recent matching lines vote."""

    name = "raw_log"
    TOP_K = 5

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    async def run_scenario(self, sc: Scenario, calls: list[ToolCall], res: Resolution) -> Outcome:
        lines = [{"n": n, "text": text, **parsed} for n, text, parsed in observations_in(calls)]
        self.lines.extend(lines)

        def votes(mention: str, attribute: str) -> tuple[str, Counter[str]]:
            name = bare(mention)
            hits = [
                x
                for x in lines
                if name in x["text"] and x["attribute"] == attribute and x["kind"] != "alias"
            ][-self.TOP_K :]
            count = Counter(x["value"] for x in hits)
            if not count:
                return ABSTAIN, count
            top = max(count.values())
            latest = [x["value"] for x in hits if count[x["value"]] == top][-1]
            return latest, count

        answers = {q.id: votes(q.mention, q.attribute)[0] for q in sc.questions}
        beliefs = []
        for t in sc.truths:
            said, count = votes(t.mention, t.attribute)
            total = sum(count.values())
            share = count[t.value] * SCALE // total if total else 0
            state = "accepted" if said == t.value else ("tentative" if share else ABSENT)
            beliefs.append(Belief(state=state, confidence=share))
        entities = {m: f"{sc.id}:{bare(m)}" for m in sc.entities}
        return Outcome(scenario=sc.id, answers=answers, beliefs=beliefs, entities=entities)

    def transitions(self) -> list[dict[str, Any]]:
        return []

    def consolidations(self) -> list[dict[str, Any]]:
        return []

    async def aclose(self) -> None:
        return None


class KeyValue:
    """Simple key-value memory: (bare name, attribute) -> the last value written."""

    name = "key_value"

    def __init__(self) -> None:
        self.writes: list[dict[str, Any]] = []

    async def run_scenario(self, sc: Scenario, calls: list[ToolCall], res: Resolution) -> Outcome:
        slots: dict[tuple[str, str], str] = {}
        seen: dict[tuple[str, str], set[str]] = {}
        for n, _, parsed in observations_in(calls):
            if parsed["kind"] == "alias":
                continue
            key = (bare(parsed["mention"]), parsed["attribute"])
            if key in slots and slots[key] != parsed["value"]:
                self.writes.append(
                    {
                        "scenario": sc.id,
                        "call": n,
                        "key": f"{key[0]}/{key[1]}",
                        "from": slots[key],
                        "to": parsed["value"],
                    }
                )
            slots[key] = parsed["value"]
            seen.setdefault(key, set()).add(parsed["value"])
        answers = {q.id: slots.get((bare(q.mention), q.attribute), ABSTAIN) for q in sc.questions}
        beliefs = []
        for t in sc.truths:
            key = (bare(t.mention), t.attribute)
            if slots.get(key) == t.value:
                beliefs.append(Belief(state="accepted", confidence=SCALE))
            elif t.value in seen.get(key, set()):
                beliefs.append(Belief(state="rejected", confidence=0))
            else:
                beliefs.append(Belief(state=ABSENT))
        entities = {m: f"{sc.id}:{bare(m)}" for m in sc.entities}
        return Outcome(scenario=sc.id, answers=answers, beliefs=beliefs, entities=entities)

    def transitions(self) -> list[dict[str, Any]]:
        return list(self.writes)

    def consolidations(self) -> list[dict[str, Any]]:
        return []

    async def aclose(self) -> None:
        return None


class PolicyFold:
    """The governance pack's policy without the kernel, on :class:`kernel.beliefs.Workbench`.

    Each tool call is judged by the pack's schema and beliefs layer (a refusal is
    counted by its reason code), put in its applied form and executed into an
    in-memory :class:`kernel.beliefs.BeliefGraph`, as the kernel's DIM and beliefs
    executor do; a test's result comes from :class:`LookupTests`. One graph holds a
    seed's whole bundle, each scenario its own task, on its own stretch of the clock
    (:func:`offset_s`), as in the kernel.

    Args:
        name: the system's name in tables and artifacts.
        independence: ``groups`` (each source's independence group, as given) or
            ``per_source`` (no independence handling: every source its own group).
        direct_writes: apply the model's attempted canonical writes (they bypass the
            gate and pin the proposition accepted in canonical memory until a rival is
            pinned) instead of refusing them with DIRECT_CANONICAL_WRITE_FORBIDDEN.
    """

    def __init__(
        self, name: str, *, independence: str = "groups", direct_writes: bool = False
    ) -> None:
        if independence not in ("groups", "per_source"):
            raise ValueError(f"independence must be groups or per_source, not {independence!r}")
        self.name = name
        self.independence = independence
        self.direct_writes = direct_writes
        self.bench = Workbench()
        self.graph = self.bench.graph
        self.pinned: dict[str, str] = {}
        """(entity, attribute) key -> the proposition a direct write pinned accepted."""
        self._index = 0
        self._transitions: list[dict[str, Any]] = []
        self._consolidations: list[dict[str, Any]] = []

    async def run_scenario(self, sc: Scenario, calls: list[ToolCall], res: Resolution) -> Outcome:
        offset = offset_s(self._index)
        self._index += 1
        tests = LookupTests(calls)
        refused: Counter[str] = Counter()
        for c in calls:
            now = at_ns(c.at_s, offset)
            kind, params = PREFIX + c.kind, ablate(c, self.independence)
            if c.direct and self.direct_writes:
                self._pin(sc, c, now, offset)
                continue
            call = self.bench.propose(kind, params, task=sc.id, now_ns=now)
            if call.feedback is not None:
                refused[str(call.feedback.reason_code)] += 1
                continue
            if c.kind == "propose_test":
                # The test adapter runs it at once; its result is recorded like a receipt.
                self.bench.record_test(str(params["test"]), tests.outcome(params))
            for event in call.events:
                self._record(sc, event.payload, offset)
        end = at_ns(sc.end_s, offset)
        return read_outcome(sc, res, self.graph, end, self.pinned, dict(sorted(refused.items())))

    def _pin(self, sc: Scenario, c: ToolCall, now: int, offset: int) -> None:
        prop = str(c.params["proposition"])
        if prop not in self.graph.propositions:
            return
        slot = prop.rsplit("=", 1)[0]
        before = self.pinned.get(slot)
        self.pinned[slot] = prop
        p = self.graph.propositions[prop]
        self._transitions.append(
            {
                "scenario": sc.id,
                "at_s": now // SECOND_NS - EPOCH_S - offset,
                "proposition": prop,
                "from_state": str(p.state),
                "to_state": "accepted",
                "cause": "direct_write",
                "evidence": str(c.params["derived_from"][0]),
                "unpinned": before or "",
            }
        )

    def _record(self, sc: Scenario, payload: Any, offset: int) -> None:
        if isinstance(payload, PropositionTransitioned):
            self._transitions.append(transition_row(sc.id, payload, offset))
        elif isinstance(payload, ConsolidationRecorded):
            self._consolidations.append(consolidation_row(sc.id, payload, offset))

    def transitions(self) -> list[dict[str, Any]]:
        return list(self._transitions)

    def consolidations(self) -> list[dict[str, Any]]:
        return list(self._consolidations)

    async def aclose(self) -> None:
        return None


PREFIX = "governance."
SCENARIO_SPAN_S = 1_000 * 3_600
"""Each scenario of a bundle runs on its own 1000-hour stretch of the clock."""


def offset_s(index: int) -> int:
    """Where the ``index``-th scenario of a bundle starts on the shared clock."""
    return index * SCENARIO_SPAN_S


def ablate(c: ToolCall, independence: str) -> dict[str, Any]:
    """The parameters as sent: with no independence handling, each source is its own group."""
    params = dict(c.params)
    if independence == "per_source" and c.kind == "record_observation":
        params["independence_group"] = params["source"]
    return params


class LookupTests:
    """The outside world's answer to a test: the lookup's value, from the scenario.

    A test of a proposition passes when the lookup gives its value, and fails otherwise.
    """

    def __init__(self, calls: list[ToolCall]) -> None:
        self.answers: dict[str, str] = {}
        for c in calls:
            if c.kind == "propose_test":
                self.answers[str(c.params["test"])] = str(c.context.get("answer", ""))

    def outcome(self, params: dict[str, Any]) -> str:
        answer = self.answers.get(str(params.get("test", "")), "")
        if not answer:
            return "inconclusive"
        value = str(params.get("proposition", "")).rsplit("=", 1)[-1]
        return "passed" if value == answer else "failed"


def transition_row(scenario: str, t: PropositionTransitioned, offset: int) -> dict[str, Any]:
    """A PropositionTransitioned as a transitions.jsonl row (times on the scenario clock)."""
    return {
        "scenario": scenario,
        "at_s": t.at_ns // SECOND_NS - EPOCH_S - offset,
        "proposition": t.proposition,
        "from_state": t.from_state,
        "to_state": t.to_state,
        "cause": t.cause,
        "evidence": t.evidence,
        "confidence": t.confidence,
        "support": t.support,
        "contradiction": t.contradiction,
        "support_groups": t.support_groups,
        "contradiction_groups": t.contradiction_groups,
        "freshness": t.freshness,
    }


def consolidation_row(scenario: str, c: ConsolidationRecorded, offset: int) -> dict[str, Any]:
    """A ConsolidationRecorded as a consolidation_events.jsonl row."""
    return {
        "scenario": scenario,
        "at_s": c.at_ns // SECOND_NS - EPOCH_S - offset,
        "consolidation": c.consolidation,
        "trigger": c.trigger,
        "promoted": list(c.promoted),
        "carried_over": list(c.carried_over),
        "archived": [{"proposition": a.proposition, "reason": a.reason} for a in c.archived],
        "discarded": list(c.discarded),
        "observations": c.observations,
    }


def read_outcome(
    sc: Scenario,
    res: Resolution,
    graph: BeliefGraph,
    end_ns: int,
    pinned: dict[str, str],
    refused: dict[str, int],
) -> Outcome:
    """Answers, beliefs and entities of ``sc`` as the belief graph holds them at its end.

    A question is answered by the accepted proposition of its (entity, attribute), the
    most confident if several, and abstains when none is accepted. A proposition a
    direct write pinned counts as accepted (the direct-writes ablation only).
    """

    def state(ref: str) -> str:
        p = graph.propositions[ref]
        return "accepted" if pinned.get(ref.rsplit("=", 1)[0]) == ref else str(p.state)

    answers = {}
    for q in sc.questions:
        slot = proposition_ref(res, q.mention, q.attribute, "").rstrip("=")
        held = [
            (ref == pinned.get(slot), graph.assess(ref, end_ns).confidence, ref)
            for ref, p in graph.propositions.items()
            if p.task == sc.id and ref.rsplit("=", 1)[0] == slot and state(ref) == "accepted"
        ]
        answers[q.id] = max(held)[2].rsplit("=", 1)[1] if held else ABSTAIN
    beliefs = []
    for t in sc.truths:
        ref = proposition_ref(res, t.mention, t.attribute, t.value)
        if ref not in graph.propositions:
            beliefs.append(Belief(state=ABSENT))
        else:
            conf = graph.assess(ref, end_ns).confidence
            beliefs.append(Belief(state=state(ref), confidence=conf))
    entities = {}
    for mention in sc.entities:
        bearers = [e for e in graph.named(mention) if graph.entities[e].task == sc.id]
        entities[mention] = bearers[0] if len(bearers) == 1 else res.entities.get(mention, mention)
    return Outcome(
        scenario=sc.id,
        answers=answers,
        beliefs=beliefs,
        entities=entities,
        rejected_calls=refused,
    )
