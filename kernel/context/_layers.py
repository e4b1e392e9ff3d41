"""The four layers of a WorkingContext, their limits and the token budget.

A pure function of the projections at one journal position, the flow, the
agent's manifest and the recorded compile time, so compiling twice from the
same position gives byte-identical layers (tested):

- session: the flow itself (topic, attempt, lineage, the last proposal);
- state: the facts the agent is entitled to see (need-to-know from its
  subscriptions), newest first within the manifest's limits;
- memory: the document ``compile_memory`` makes (kernel.state.memory): its
  namespace and when it was compiled, the active constraints (all of them: the
  agent is judged by them), the newest facts of governed memory, and the
  rulebook's rules of the agent's namespace relevant to the flow (its topic, the
  agent's kinds and the state keys it sees; see :func:`kernel.state.rulebook.select`),
  most relevant first, each with how to cite it; its hash is recorded;
- artifacts: state values that name a stored artifact (``sha256:<hex>``,
  :mod:`kernel.state.artifacts`), and state values larger than
  :data:`ARTIFACT_BYTES`, by reference, never inlined, with their size, media type
  and summary beside (``artifact_info``): the agent fetches what it needs
  (``ctx.fetch_artifact``), and only these;
- knowledge: canonical beliefs reactivated for the task (governance 13.5,
  :mod:`kernel.state.beliefs.recall`): the entities its topic and state name, the
  canonical propositions about them with state, confidence, freshness (at the
  recorded compile time) and provenance, and their episodes' summaries, within the
  fixed budget recall sets (never dropped for tokens: its own budget bounds it);
  what it brought back is recorded (``ContextCompiled.reactivated``).

Limits come from the manifest's ``limits``: ``context.state.max_items``,
``context.state.window_s`` (facts recorded within that many seconds of the
compile), ``context.memory.max_facts``, ``context.memory.max_rules`` (default
:data:`~kernel.state.rulebook.DEFAULT_RULES`), ``context.memory.ns`` (the rulebook
namespace, default ``default``) and ``context.tokens`` (the budget, default
:data:`DEFAULT_TOKENS`). Tokens are estimated as a quarter of the
canonical JSON bytes. Over budget, items are dropped in this order until the
context fits: artifact references, then memory facts (oldest first) and then
rules (least relevant first), then state facts (oldest first). The session,
the constraints and the schemas are never dropped. What was dropped is
recorded in ContextCompiled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from kernel.core.events import Manifest, canonical, digest
from kernel.core.flow import FlowState
from kernel.state.artifacts import JSON, inline_ref, stored_ref
from kernel.state.beliefs.recall import reactivate
from kernel.state.memory import iso_time, memory_document
from kernel.state.projections import Projections, visible
from kernel.state.rulebook import DEFAULT_NS, DEFAULT_RULES, RuleSearch, select, shown_item

ARTIFACT_BYTES = 2048
"""State values larger than this (canonical JSON) go by reference."""
DEFAULT_TOKENS = 8000
DROP_ORDER = ("artifact", "memory", "state")
"""Which items go first when a context is over its token budget (oldest first within each)."""


class Layers(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A compiled context's layers, its token estimate and what the budget dropped."""

    session: dict[str, Any]
    state: dict[str, Any]
    memory: dict[str, Any]
    artifacts: dict[str, str]
    schemas: dict[str, Any]
    tokens: int
    dropped: list[str] = []
    rules: list[str] = []
    """The rules shown, as ``id@vN``."""
    artifact_info: dict[str, dict[str, Any]] = {}
    """Size, media type and summary of each artifact referenced, by reference."""
    memory_hash: str = ""
    """The hash of the memory layer (what ContextCompiled records)."""
    knowledge: dict[str, Any] = {}
    """Canonical beliefs reactivated for the task (kernel.state.beliefs.recall)."""
    reactivated: list[str] = []
    """What the knowledge layer brought back, as ids (what ContextCompiled records)."""


def estimate(obj: Any) -> int:
    """Return the deterministic token estimate of ``obj``: a quarter of its canonical bytes."""
    return (len(canonical(obj)) + 3) // 4


def _item_tokens(key: str, body: bytes) -> int:
    # Exactly estimate({key: value}) given the value's canonical body, without encoding twice.
    return (len(canonical(key)) + len(body) + 3 + 3) // 4


_schema_tokens: dict[tuple[str, ...], tuple[tuple[Any, ...], int]] = {}


def _schemas_estimate(mine: dict[str, Any]) -> int:
    # A pack loaded at runtime builds new schema objects; an estimate is reused while the
    # very same objects are in force (the entry holds them, so no other object takes their place).
    key = tuple(mine)
    values = tuple(mine.values())
    hit = _schema_tokens.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], values, strict=True)):
        return hit[1]
    tokens = estimate(mine)
    _schema_tokens[key] = (values, tokens)
    return tokens


def _limit(limits: Mapping[str, Any], name: str) -> int | None:
    value = limits.get(name)
    return int(value) if isinstance(value, int | float) and value >= 0 else None


def namespace(manifest: Manifest) -> str:
    """Return the rulebook namespace the manifest's context shows (``context.memory.ns``)."""
    ns = manifest.limits.get("context.memory.ns")
    return ns if isinstance(ns, str) and ns else DEFAULT_NS


def window_ns(manifest: Manifest) -> int | None:
    """Return the manifest's state time window in nanoseconds, if it sets one."""
    seconds = manifest.limits.get("context.state.window_s")
    return int(seconds * 1e9) if isinstance(seconds, int | float) else None


class LayerBody:
    """What a compile shows that depends on the agent and the flow's topic, not the flow.

    Every flow of one agent and topic compiled in one batch shows the same state,
    memory, rules, artifacts and schemas: the compiler computes them once per batch
    (see :func:`layer_body`); only the session, and what a tight budget drops
    because of it, differ per flow.
    """

    __slots__ = (
        "budget",
        "constraints",
        "dropped",
        "infos",
        "items",
        "knowledge",
        "manifest",
        "memory",
        "mine",
        "ns",
        "reactivated",
        "shown",
        "tokens",
    )

    def __init__(
        self,
        manifest: Manifest,
        items: dict[str, list[tuple[str, str, Any, int]]],
        constraints: list[dict[str, Any]],
        mine: dict[str, Any],
        dropped: list[str],
        tokens: int,
        budget: int,
        infos: dict[str, dict[str, Any]] | None = None,
        ns: str = DEFAULT_NS,
        knowledge: tuple[dict[str, Any], list[str]] = ({}, []),
    ) -> None:
        self.manifest = manifest
        self.knowledge, self.reactivated = knowledge
        self.items = items
        self.constraints = constraints
        self.mine = mine
        self.dropped = dropped
        self.tokens = tokens
        """The estimate of everything but the session."""
        self.budget = budget
        self.infos = infos or {}
        """What the context shows beside each artifact reference."""
        self.ns = ns
        self.memory: tuple[int, dict[str, Any], str] | None = None
        """The memory document of its own items, at a compile time, and its hash."""
        self.shown: dict[str, list[tuple[str, Any]]] = {}
        """Its own items of a layer as (key, value), sorted by key (see :meth:`sorted_items`)."""

    def sorted_items(self, layer: str) -> list[tuple[str, Any]]:
        """Return this body's own items of ``layer`` as (key, value), sorted by key, once."""
        found = self.shown.get(layer)
        if found is None:
            found = self.shown[layer] = sorted((k, v) for _, k, v, _ in self.items[layer])
        return found

    def memory_layer(self, as_of_ns: int) -> tuple[dict[str, Any], str]:
        """Return the memory document of this body's items (a fresh copy) and its hash.

        Built and hashed once per body and compile time: every flow the budget leaves
        whole shows the same document (an empty memory's costs a copy of four keys).
        """
        if self.memory is None or self.memory[0] != as_of_ns:
            document = memory_of(self.ns, as_of_ns, self.constraints, self.items["memory"])
            self.memory = (as_of_ns, document, digest(document))
        _, document, hashed = self.memory
        return fresh(document), hashed


def memory_of(
    ns: str,
    as_of_ns: int,
    constraints: list[dict[str, Any]],
    items: list[tuple[str, str, Any, int]],
) -> dict[str, Any]:
    """Return the memory document that shows ``items`` (facts, and rules least relevant first)."""
    return memory_document(
        ns,
        as_of_ns,
        [dict(c) for c in constraints],
        dict(sorted((k, v) for tag, k, v, _ in items if tag == "memory")),
        [dict(item) for tag, _, item, _ in items if tag == "rule"][::-1],
    )


def fresh(document: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of a memory document whose containers an agent may edit as its own."""
    copy = {
        **document,
        "constraints": [dict(c) for c in document["constraints"]],
        "facts": dict(document["facts"]),
    }
    if "rules" in document:
        copy["rules"] = [dict(rule) for rule in document["rules"]]
    return copy


_Item = tuple[str, str, Any, int]
"""(layer, key, value, tokens) of one item of a context layer."""


def layer_body(
    projections: Projections,
    manifest: Manifest,
    schemas: Mapping[str, Any],
    topic: str,
    *,
    staged: Mapping[str, Any] | None = None,
    as_of_ns: int = 0,
    search: RuleSearch | None = None,
    tenant: str = "",
) -> LayerBody:
    """Compile what every flow of ``topic`` for this agent shows (see :func:`compile_layers`).

    Memory and canonical beliefs show what is shared and what is ``tenant``'s own
    (kernel.state.memory, BeliefGraph.seen_by).
    """
    limits = manifest.limits
    facts, dropped = _entitled_facts(projections, manifest, staged, as_of_ns)
    state, artifacts, infos = _state_items(projections, facts)
    memory_facts = _memory_facts(projections, limits, dropped, tenant)
    ns = namespace(manifest)
    rules = _rules(projections, manifest, topic, facts, search, ns)

    constraints = projections.memory.view(0, tenant)["constraints"]
    mine = {k: schemas[k] for k in sorted(manifest.capabilities) if k in schemas}
    # Within memory: facts oldest first, then rules least relevant first.
    items = {"artifact": artifacts, "memory": memory_facts + rules[::-1], "state": state}
    tokens = estimate(constraints) + _schemas_estimate(mine)
    tokens += estimate({"ns": ns, "generated_at": iso_time(as_of_ns)})
    tokens += sum(item[3] for group in items.values() for item in group)
    budget = _limit(limits, "context.tokens") or DEFAULT_TOKENS
    task = "\n".join(
        [topic, *(f[1] for f in facts), *(f[2] for f in facts if isinstance(f[2], str))]
    )
    # Canonical beliefs as memory's facts: what is shared and what is the tenant's own.
    knowledge = reactivate(projections.beliefs.seen_by(tenant), task, as_of_ns)
    if knowledge[0]:
        tokens += estimate(knowledge[0])
    return LayerBody(
        manifest, items, constraints, mine, dropped, tokens, budget, infos, ns, knowledge
    )


def _entitled_facts(
    projections: Projections,
    manifest: Manifest,
    staged: Mapping[str, Any] | None,
    as_of_ns: int,
) -> tuple[list[tuple[int, str, Any]], list[str]]:
    """(seq, key, value) of every entitled fact, oldest first, and what the item cap dropped.

    Staged facts are the newest.
    """
    subs = tuple(manifest.subscriptions)
    newest = projections.last_seq + 1
    window = window_ns(manifest)
    facts = [
        (fact.seq, key, fact.value)
        for key, fact in projections.state.items()
        if visible(subs, key) and (window is None or fact.ts >= as_of_ns - window)
    ]
    if staged:
        facts = [f for f in facts if f[1] not in staged]
        facts += [(newest, key, value) for key, value in staged.items() if visible(subs, key)]
    facts.sort(key=lambda f: (f[0], f[1]))
    state_items = _limit(manifest.limits, "context.state.max_items")
    dropped: list[str] = []
    if state_items is not None and len(facts) > state_items:
        cut = len(facts) - state_items
        dropped = [f"state:{key}" for _, key, _ in facts[:cut]]
        facts = facts[cut:]
    return facts, dropped


def _state_items(
    projections: Projections, facts: list[tuple[int, str, Any]]
) -> tuple[list[_Item], list[_Item], dict[str, dict[str, Any]]]:
    """The state layer's items, the artifact references standing for large values, their infos."""
    state: list[_Item] = []
    artifacts: list[_Item] = []
    infos: dict[str, dict[str, Any]] = {}
    stored = projections.artifacts
    for _, key, value in facts:
        ref = stored_ref(stored, value) if stored.stored else None
        body = b"" if ref is not None else canonical(value)
        if ref is None and len(body) > ARTIFACT_BYTES:
            ref = inline_ref(body)
            infos[ref] = {"size": len(body), "media_type": JSON}
        if ref is None:
            state.append(("state", key, value, _item_tokens(key, body)))
            continue
        info = infos.setdefault(ref, stored.info(ref) if ref in stored.stored else {})
        cost = _item_tokens(key, canonical(ref)) + estimate({ref: info})
        artifacts.append(("artifact", key, ref, cost))
    return state, artifacts, infos


def _memory_facts(
    projections: Projections, limits: Any, dropped: list[str], tenant: str
) -> list[_Item]:
    """Memory's facts ``tenant`` sees, oldest first, past the cap dropped (named in ``dropped``)."""
    seen = projections.memory.facts_of(tenant)
    memory_facts = [
        ("memory", name, fact.value, _item_tokens(name, canonical(fact.value)))
        for name, fact in sorted(seen.items(), key=lambda i: i[1].seq)
    ]
    max_facts = _limit(limits, "context.memory.max_facts")
    if max_facts is not None and len(memory_facts) > max_facts:
        cut = len(memory_facts) - max_facts
        dropped += [f"memory:{name}" for _, name, _, _ in memory_facts[:cut]]
        memory_facts = memory_facts[cut:]
    return memory_facts


def _rules(
    projections: Projections,
    manifest: Manifest,
    topic: str,
    facts: list[tuple[int, str, Any]],
    search: RuleSearch | None,
    ns: str,
) -> list[_Item]:
    """The rules of the agent's namespace most relevant to the flow, most relevant first."""
    rules: list[_Item] = []
    if projections.memory.rulebook.space(ns):
        max_rules = _limit(manifest.limits, "context.memory.max_rules")
        query = " ".join([topic, *sorted(manifest.capabilities), *(f[1] for f in facts)])
        k = DEFAULT_RULES if max_rules is None else max_rules
        for version in select(projections.memory.rulebook, query, k, search, ns):
            item = shown_item(version)
            key = f"rule:{version.ref}"
            rules.append(("rule", key, item, _item_tokens(key, canonical(item))))
    return rules


def _fit(
    items: Mapping[str, list[_Item]], tokens: int, budget: int, dropped: list[str]
) -> tuple[dict[str, list[_Item]], int]:
    """Drop items in DROP_ORDER, oldest first, until the context fits ``budget``."""
    # The body is shared by the flows of its batch: drop from copies.
    kept = {layer: list(group) for layer, group in items.items()}
    for layer in DROP_ORDER:
        group = kept[layer]
        while tokens > budget and group:
            _, key, _, cost = group.pop(0)
            tokens -= cost
            dropped.append(f"{layer}:{key}")
    return kept, tokens


def compile_layers(
    projections: Projections,
    flow: FlowState,
    manifest: Manifest,
    schemas: Mapping[str, Any],
    *,
    staged: Mapping[str, Any] | None = None,
    as_of_ns: int = 0,
    search: RuleSearch | None = None,
    body: LayerBody | None = None,
    tenant: str = "",
) -> Layers:
    """Compile the layers of one attempt's context.

    Args:
        projections: the state at the compile's journal position.
        flow: the flow being compiled for.
        manifest: the agent's manifest (subscriptions and limits).
        schemas: the JSON schema of every policy kind by name.
        staged: facts of triggers recorded in the same batch, not folded yet (newest).
        as_of_ns: the recorded compile time, for the state time window.
        search: the rule relevance port (lexical by default).
        body: :func:`layer_body` of the same arguments and the flow's topic, if the
            caller already has it (the layers are the same either way).
        tenant: the tenant the flow acts for (its memory is what is shared and its own).
    """
    if body is None:
        body = layer_body(
            projections,
            manifest,
            schemas,
            flow.topic,
            staged=staged,
            as_of_ns=as_of_ns,
            search=search,
            tenant=tenant,
        )
    session: dict[str, Any] = {
        "topic": flow.topic,
        "attempt": flow.compiled + 1,
        "root_dfid": flow.root_dfid,
        "parent_dfid": flow.parent_dfid,
        "rejections": flow.rejections,
    }
    if flow.proposal is not None:
        session["last_proposal"] = {"kind": flow.proposal.kind, "params": flow.proposal.params}

    tokens = estimate(session) + body.tokens
    dropped = list(body.dropped)
    items = body.items
    if tokens > body.budget:
        items, tokens = _fit(items, tokens, body.budget, dropped)
    # Fresh containers per flow: an agent that edits its context edits only its own.
    if items is body.items:
        memory, memory_hash = body.memory_layer(as_of_ns)
        state, artifacts = dict(body.sorted_items("state")), dict(body.sorted_items("artifact"))
    else:
        memory = memory_of(body.ns, as_of_ns, body.constraints, items["memory"])
        memory_hash = digest(memory)
        state = dict(sorted((k, v) for _, k, v, _ in items["state"]))
        artifacts = dict(sorted((k, v) for _, k, v, _ in items["artifact"]))
    return Layers(
        session=session,
        state=state,
        memory=memory,
        artifacts=artifacts,
        schemas=dict(body.mine),
        tokens=tokens,
        dropped=dropped,
        rules=[item["cite"][len("[rule:") : -1] for item in memory.get("rules", ())],
        artifact_info={ref: dict(body.infos[ref]) for ref in sorted(set(artifacts.values()))},
        memory_hash=memory_hash,
        knowledge=msgspec.json.decode(msgspec.json.encode(body.knowledge))
        if body.knowledge
        else {},
        reactivated=list(body.reactivated),
    )
