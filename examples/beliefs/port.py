"""The scripted LLM port: a scenario's inputs translated into the governance tool calls.

An agent reading the stream one observation at a time makes the calls of the
seed document's tool boundary (section 14), the same calls for every compared
system: record the observation, create an entity candidate for a new name (or
link an alias the input states), propose a proposition for a new claim or
attach the observation as support of an existing one, attach it as a
contradiction of the competing propositions it conflicts with, propose a test
when a conflict can be settled by a lookup, ingest the test's result,
request consolidation at the task boundary and archive the task as an episode.

Like a model, it also oversteps: an observation worded as settled ("confirmed")
makes it try to write the proposition straight into canonical memory as
accepted (``state: accepted``), which the governed system refuses
(DIRECT_CANONICAL_WRITE_FORBIDDEN) and the direct-writes ablation applies.

Entity resolution is the agent's, deterministic and conservative: a name seen
before is the same entity; an alias the input states is linked; a new name that
shares a bare name with a known one ("Ada Moreau (Lisbon)", "Ada Moreau
(Berlin)") is a new candidate marked ``possible_same_as``, never merged.
"""

from __future__ import annotations

from typing import Any

import msgspec

from examples.beliefs.scenarios import Scenario

MODEL_ID = "scripted-governance-port/0.1"
"""The model id of every run on this port (the manifest's ``model_id``)."""

KINDS = (
    "record_observation",
    "create_or_link_entity_candidate",
    "propose_proposition",
    "attach_support",
    "attach_contradiction",
    "propose_test",
    "execute_test_result_ingest",
    "request_consolidation",
    "archive_episode",
)


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call: its kind, its parameters (local refs), and when it was made.

    Refs are the port's own names: the observation's id, ``e:<scenario>/<n>`` for an
    entity, ``p:<entity>/<attribute>=<value>`` for a proposition, ``t:<scenario>/<n>``
    for a test. Each system maps them onto its own ids.
    """

    n: int
    at_s: int
    kind: str
    params: dict[str, Any]
    direct: bool = False
    """An attempted direct canonical write (the model asserting a belief state)."""
    context: dict[str, Any] = {}
    """What the agent knows beside the call (never sent to the kernel): a test's answer as
    the lookup worded it, the twins a new name might be."""


def bare(name: str) -> str:
    """The name without its qualifier: "Ada Moreau (Lisbon)" -> "Ada Moreau"."""
    return name.split(" (", 1)[0].strip()


class Resolution(msgspec.Struct, kw_only=True):
    """The agent's entity resolution at the end of a scenario: mention -> entity ref."""

    entities: dict[str, str] = {}


def reliability(micro_units: int) -> str:
    """A reliability in micro-units as the decimal string the pack takes: 900_000 -> "0.9"."""
    whole, frac = divmod(micro_units, 1_000_000)
    return f"{whole}.{frac:06d}".rstrip("0").rstrip(".") if frac else str(whole)


def translate(sc: Scenario) -> tuple[list[ToolCall], Resolution]:
    """Translate ``sc`` into the tool calls an agent makes, and its entity resolution."""
    calls: list[ToolCall] = []
    res = Resolution(entities={})
    sources = {s.id: s for s in sc.sources}
    props: dict[tuple[str, str], list[str]] = {}  # (entity, attribute) -> values, in order
    current: dict[tuple[str, str], str] = {}  # the value a change supersedes
    tests: dict[tuple[str, str], list[str]] = {}  # (entity, attribute) -> tests proposed
    groups: dict[tuple[str, str, str], set[str]] = {}  # (entity, attribute, value) -> groups
    lookups = {
        (o.mention, o.attribute): o.value for o in sc.observations if o.kind == "test_result"
    }
    n_tests = 0

    def call(
        at_s: int,
        kind: str,
        direct: bool = False,
        context: dict[str, Any] | None = None,
        **params: Any,
    ) -> None:
        params["task"] = sc.id
        calls.append(
            ToolCall(
                n=len(calls) + 1,
                at_s=at_s,
                kind=kind,
                params=params,
                direct=direct,
                context=context or {},
            )
        )

    def entity(at_s: int, mention: str, obs: str) -> str:
        if mention in res.entities:
            return res.entities[mention]
        ref = f"e:{sc.id}/{len({*res.entities.values()}) + 1}"
        twins = sorted({e for m, e in res.entities.items() if bare(m) == bare(mention)})
        res.entities[mention] = ref
        call(
            at_s,
            "create_or_link_entity_candidate",
            context={"possible_same_as": twins},
            entity=ref,
            name=mention,
            observation=obs,
        )
        return ref

    for o in sc.observations:
        src = sources[o.source]
        parsed = {"kind": o.kind, "mention": o.mention, "attribute": o.attribute, "value": o.value}
        ent = res.entities.get(o.mention, "")
        key = (ent, o.attribute)
        if o.kind == "test_result" and tests.get(key):
            # The lookup the agent asked for answers: each test's recorded result comes back.
            for test in tests[key]:
                call(
                    o.at_s,
                    "execute_test_result_ingest",
                    context={
                        "observation": o.id,
                        "raw_payload": o.text,
                        "parsed_payload": parsed,
                        "source": src.id,
                    },
                    test=test,
                )
            continue
        call(
            o.at_s,
            "record_observation",
            observation=o.id,
            source=src.id,
            source_type=src.source_type,
            independence_group=src.group,
            reliability=reliability(src.reliability),
            raw_payload=o.text,
            parsed_payload=parsed,
        )
        ent = entity(o.at_s, o.mention, o.id)
        if o.kind == "alias":
            if o.value not in res.entities:
                res.entities[o.value] = ent
                call(
                    o.at_s,
                    "create_or_link_entity_candidate",
                    name=o.value,
                    alias_of=ent,
                    observation=o.id,
                )
            continue
        key = (ent, o.attribute)
        prop = f"p:{ent}/{o.attribute}={o.value}"
        text = f"{o.mention}'s {o.attribute} is {o.value}"
        values = props.setdefault(key, [])
        rivals = [f"p:{ent}/{o.attribute}={v}" for v in values if v != o.value]
        if o.value not in values:
            values.append(o.value)
            superseded = current.get(key, "") if o.kind == "change" else ""
            call(
                o.at_s,
                "propose_proposition",
                proposition=prop,
                text=text,
                about=[ent],
                derived_from=[o.id],
                volatility=sc.volatility.get(o.attribute, "medium"),
                supersedes=f"p:{ent}/{o.attribute}={superseded}" if superseded else "",
            )
        else:
            call(o.at_s, "attach_support", proposition=prop, observation=o.id)
        if o.kind == "claim":
            for rival in rivals:
                call(o.at_s, "attach_contradiction", proposition=rival, observation=o.id)
        current[key] = o.value
        if o.assertive:
            # The model takes "confirmed" at its word and tries to settle the belief itself.
            call(
                o.at_s,
                "propose_proposition",
                direct=True,
                proposition=prop,
                text=text,
                about=[ent],
                derived_from=[o.id],
                state="accepted",
                canonical=True,
            )
        groups.setdefault((ent, o.attribute, o.value), set()).add(src.group)
        serious = all(len(groups.get((ent, o.attribute, v), ())) >= 2 for v in values)
        if len(values) >= 2 and serious and (o.mention, o.attribute) in lookups:
            if key not in tests:
                # A serious dispute (two independent groups on each side) a lookup can
                # settle: the agent asks for a test of each side, once.
                sides = [f"p:{ent}/{o.attribute}={v}" for v in values]
                for target in sides:
                    n_tests += 1
                    test = f"t:{sc.id}/{n_tests}"
                    tests.setdefault(key, []).append(test)
                    call(
                        o.at_s,
                        "propose_test",
                        # The lookup's answer is the world's; only the test adapter reads it.
                        context={"answer": lookups[(o.mention, o.attribute)]},
                        test=test,
                        proposition=target,
                        competing=[p for p in sides if p != target],
                        action_impact="high",
                        cost="0",
                        method="lookup",
                    )
    call(sc.end_s, "request_consolidation", reason="task boundary: the questions are asked")
    call(
        sc.end_s,
        "archive_episode",
        episode=f"episode:{sc.id}",
        summary=f"{sc.family}: {len(sc.observations)} observations",
    )
    # Questions name entities too: the agent resolves them the same way.
    for q in sc.questions:
        if q.mention not in res.entities:
            res.entities[q.mention] = f"e:{sc.id}/unseen:{q.mention}"
    return calls, res


def proposition_ref(res: Resolution, mention: str, attribute: str, value: str) -> str:
    """The proposition ref the agent would use for (mention, attribute, value)."""
    return f"p:{res.entities.get(mention, mention)}/{attribute}={value}"
