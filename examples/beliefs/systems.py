"""The compared memory systems, behind one interface.

Every system is handed the same scenario and the same tool calls from the
scripted port, and is asked the same questions at the task boundary:

- ``raw_log``: every observation kept as a line of text; a question retrieves the
  lines that name the entity (by its bare name, as text search does) and the
  attribute, keeps the five most recent, and answers the value most of them give
  (a tie goes to the most recent). It abstains only when nothing is retrieved.
- ``key_value``: one slot per (bare name, attribute); every claim, change or test
  result overwrites it (last write wins). It abstains only on an empty slot.
- :class:`Ledger` is the governance policy folded in the study's own code around the
  kernel's public pure scoring model (:func:`kernel.beliefs.assess`). It runs the
  two ablations, whose difference the kernel has no hook for:
  ``no_independence`` (every source its own independence group) and
  ``direct_writes`` (the model's attempted canonical writes are applied, pinning the
  proposition accepted until a rival is pinned). With neither, it is the governed
  policy without the kernel (``governed_fold``), the reference the kernel's own
  governed run is checked against.

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
from examples.beliefs.scenarios import ABSTAIN, EPOCH_S, Question, Scenario
from kernel.beliefs import SCALE, Assessment, BeliefState, Evidence, Volatility, assess

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


class RawLog:
    """Raw text log retrieval: the five most recent matching lines vote."""

    name = "raw_log"
    TOP_K = 5

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    async def run_scenario(self, sc: Scenario, calls: list[ToolCall], res: Resolution) -> Outcome:
        lines = []
        for c in calls:
            if c.kind == "record_observation":
                line = {"n": c.n, "text": c.params["raw_payload"], **c.params["parsed_payload"]}
                lines.append(line)
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
        for c in calls:
            if c.kind != "record_observation":
                continue
            parsed = c.params["parsed_payload"]
            if parsed["kind"] == "alias":
                continue
            key = (bare(parsed["mention"]), parsed["attribute"])
            if key in slots and slots[key] != parsed["value"]:
                self.writes.append(
                    {
                        "scenario": sc.id,
                        "at_s": c.at_s,
                        "key": f"{key[0]}/{key[1]}",
                        "from": slots[key],
                        "to": parsed["value"],
                        "evidence": parsed.get("observation", c.params["observation"]),
                    }
                )
            slots[key] = parsed["value"]
            seen.setdefault(key, set()).add(parsed["value"])
        answers = {
            q.id: slots.get((bare(q.mention), q.attribute), ABSTAIN) for q in sc.questions
        }
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


class _Prop:
    """One proposition as the ledger folds it."""

    def __init__(self, ref: str, volatility: Volatility, created_ns: int, key: str) -> None:
        self.ref, self.volatility, self.created_ns, self.key = ref, volatility, created_ns, key
        self.support: list[Evidence] = []
        self.contradiction: list[Evidence] = []
        self.failed_test = False
        self.held = False
        self.pinned = False
        self.state = BeliefState.TENTATIVE
        self.last: Assessment | None = None


CARRY_OVER_CAP = 20


class Ledger:
    """The governance policy folded around the public pure scoring model, with ablations.

    Args:
        name: the system's name in tables and artifacts.
        independence: ``groups`` (the source's independence group) or ``per_source``
            (every source its own group: no independence handling).
        direct_writes: apply the model's attempted canonical writes instead of refusing
            them with DIRECT_CANONICAL_WRITE_FORBIDDEN.
    """

    def __init__(
        self, name: str, *, independence: str = "groups", direct_writes: bool = False
    ) -> None:
        if independence not in ("groups", "per_source"):
            raise ValueError(f"independence must be groups or per_source, not {independence!r}")
        self.name = name
        self.independence = independence
        self.direct_writes = direct_writes
        self._transitions: list[dict[str, Any]] = []
        self._consolidations: list[dict[str, Any]] = []

    async def run_scenario(self, sc: Scenario, calls: list[ToolCall], res: Resolution) -> Outcome:
        obs: dict[str, Evidence] = {}
        props: dict[str, _Prop] = {}
        tests: dict[str, list[str]] = {}
        refused: Counter[str] = Counter()

        def evidence(ref: str, n: int, now: int) -> Evidence:
            e = obs[ref]
            return Evidence(group=e.group, reliability=e.reliability, at_ns=now, seq=n)

        def reassess(p: _Prop, now: int, cause: str, cause_ref: str) -> None:
            a = assess(
                p.support,
                p.contradiction,
                volatility=p.volatility,
                created_ns=p.created_ns,
                now_ns=now,
                failed_test=p.failed_test,
                held=p.held,
            )
            state = BeliefState.ACCEPTED if p.pinned else a.state
            if p.last is None or state != p.state:
                self._transitions.append(
                    {
                        "scenario": sc.id,
                        "at_s": now // SECOND_NS - EPOCH_S,
                        "proposition": p.ref,
                        "from_state": "" if p.last is None else str(p.state),
                        "to_state": str(state),
                        "cause": cause,
                        "evidence": cause_ref,
                        "confidence": a.confidence,
                        "support": a.support,
                        "contradiction": a.contradiction,
                        "support_groups": a.support_groups,
                        "contradiction_groups": a.contradiction_groups,
                        "freshness": a.freshness,
                    }
                )
            p.state, p.last = state, a
            p.held = p.held or state in (BeliefState.ACCEPTED, BeliefState.PROVISIONAL)

        def create(c: ToolCall, now: int) -> _Prop:
            ref = c.params["proposition"]
            key = ref.rsplit("=", 1)[0]
            attribute = key.rsplit("/", 1)[1]
            vol = Volatility(c.params.get("volatility") or sc.volatility.get(attribute, "medium"))
            p = _Prop(ref, vol, now, key)
            for o in c.params.get("derived_from", []):
                p.support.append(evidence(o, c.n, now))
            props[ref] = p
            return p

        for c in calls:
            now = at_ns(c.at_s)
            k, params = c.kind, c.params
            if k == "record_observation":
                group = params["independence_group"]
                if self.independence == "per_source":
                    group = params["source"]
                obs[params["observation"]] = Evidence(
                    group=group, reliability=params["reliability"], at_ns=now, seq=c.n
                )
            elif k == "propose_proposition" and c.direct:
                if not self.direct_writes:
                    refused["DIRECT_CANONICAL_WRITE_FORBIDDEN"] += 1
                    continue
                p = props.get(params["proposition"]) or create(c, now)
                for rival in props.values():
                    if rival.key == p.key and rival is not p and rival.pinned:
                        rival.pinned = False
                        reassess(rival, now, "direct_write", params["derived_from"][0])
                p.pinned = True
                reassess(p, now, "direct_write", params["derived_from"][0])
            elif k == "propose_proposition":
                if params["proposition"] in props:  # a duplicate becomes support
                    p = props[params["proposition"]]
                    p.support.extend(evidence(o, c.n, now) for o in params["derived_from"])
                    reassess(p, now, "supports", params["derived_from"][0])
                else:
                    reassess(create(c, now), now, "proposed", params["derived_from"][0])
            elif k in ("attach_support", "attach_contradiction"):
                p = props[params["proposition"]]
                e = evidence(params["observation"], c.n, now)
                if k == "attach_support":
                    p.support.append(e)
                    reassess(p, now, "supports", params["observation"])
                else:
                    p.contradiction.append(e)
                    reassess(p, now, "contradicts", params["observation"])
            elif k == "propose_test":
                tests[params["test"]] = list(params["propositions"])
            elif k == "execute_test_result_ingest":
                p = props[params["proposition"]]
                if params["outcome"] == "failed":
                    p.failed_test = True
                else:
                    p.support.append(evidence(params["observation"], c.n, now))
                reassess(p, now, "test", params["test"])
            elif k == "request_consolidation":
                self._consolidate(sc, props, now, c, reassess)
        answers = {q.id: self._answer(q, res, props) for q in sc.questions}
        beliefs = []
        for t in sc.truths:
            p = props.get(proposition_ref(res, t.mention, t.attribute, t.value))
            if p is None or p.last is None:
                beliefs.append(Belief(state=ABSENT))
            else:
                beliefs.append(Belief(state=str(p.state), confidence=p.last.confidence))
        return Outcome(
            scenario=sc.id,
            answers=answers,
            beliefs=beliefs,
            entities=dict(res.entities),
            rejected_calls=dict(sorted(refused.items())),
        )

    def _consolidate(
        self, sc: Scenario, props: dict[str, _Prop], now: int, c: ToolCall, reassess: Any
    ) -> None:
        promoted, carried, archived, discarded = [], [], [], []
        for p in props.values():
            reassess(p, now, "consolidation", f"consolidation:{c.n}")
            assert p.last is not None
            fresh_enough = p.last.freshness >= 350_000
            if p.state is BeliefState.ACCEPTED and (p.pinned or fresh_enough):
                promoted.append(p.ref)
            elif p.state in (BeliefState.REJECTED, BeliefState.DEPRECATED):
                discarded.append(p.ref)
            elif len(carried) < CARRY_OVER_CAP:
                carried.append(p.ref)
            else:
                archived.append({"proposition": p.ref, "reason": "CARRY_OVER_CAP"})
        self._consolidations.append(
            {
                "scenario": sc.id,
                "at_s": c.at_s,
                "trigger": "task_boundary",
                "promoted": promoted,
                "carried_over": carried,
                "archived": archived,
                "discarded": discarded,
            }
        )

    @staticmethod
    def _answer(q: Question, res: Resolution, props: dict[str, _Prop]) -> str:
        key = proposition_ref(res, q.mention, q.attribute, "").rstrip("=")
        held = [
            p
            for p in props.values()
            if p.key == key and p.state is BeliefState.ACCEPTED and p.last is not None
        ]
        if not held:
            return ABSTAIN
        best = max(held, key=lambda p: (p.pinned, p.last.confidence if p.last else 0))
        return best.ref.rsplit("=", 1)[1]

    def transitions(self) -> list[dict[str, Any]]:
        return list(self._transitions)

    def consolidations(self) -> list[dict[str, Any]]:
        return list(self._consolidations)

    async def aclose(self) -> None:
        return None
