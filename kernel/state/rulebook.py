"""The rulebook: versioned rules with provenance, gated by a deterministic promoter.

A rule is an instruction item (id, version, title, content, labels) with the
place its text comes from (repository, ref, path, blob). Rules change only by
proposal: an agent proposes ``memory.propose_rule`` (judged by the DIM like any
other kind, then executed by the memory executor), or an operator proposes
through :meth:`kernel.Kernel.propose_rule`. Every proposal is recorded as
:class:`~kernel.core.events.RuleProposed`, and every decision on it as
:class:`~kernel.core.events.RuleDecided`, an audit record naming who decided
(``promoter`` or the operator), why, and the prior version.

The promoter decides at once, in the same append as the proposal, by these
rules in order (a pure function of the rulebook and the proposal):

1. ``skip`` SAME_CONTENT: the proposal equals the current version;
2. ``defer`` NO_PROVENANCE: it names no repository, path and blob;
3. ``defer`` STALE_BASE: it was written against another version than the current;
4. ``defer`` OPERATOR_PINNED: an operator's override set the current version and
   the proposer is not an operator;
5. ``promote`` NEW_RULE or NEW_VERSION otherwise: the next version.

Before them, ``skip`` DUPLICATE_INPUT: a proposal naming an ``input_event`` (a webhook
delivery, a seeded item) that an earlier proposal of the same namespace named.

Every rule lives in a **namespace** (``ns``, default ``default``): a tenant, a team.
Proposals, decisions, retractions, searches and contexts name one, and never see
another's rules; the same rule id in two namespaces is two rules. A context shows the
rules of its agent's namespace (the manifest's ``context.memory.ns``). A rule of another
namespace than ``default`` is cited ``[rule:ns/id@vN]``.

A deferred proposal waits for an operator, who may ``override`` it (it becomes
the next version) or ``skip`` it (:func:`operator_decision`). The DIM actor owns
the rulebook: it stages every rule event (kernel.dim), one message at a time, so
every decision reads the version the previous one left. The projection
(:class:`Rulebook`) lives in the memory projection, so snapshots, time travel
and ``dirk why`` see it; its domain, :class:`kernel.state.memory.Rules`, folds
it. Agents receive the rules relevant to their flow in the memory layer of their
context (:func:`select`), through the :class:`RuleSearch` port: lexical (BM25
over title, content and labels) by default.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import msgspec

from kernel.core.events import (
    Event,
    RuleDecided,
    RuleProposed,
    RuleRetracted,
    RuleSource,
    digest,
)

PROMOTER = "promoter"
"""The actor named in the audit records of the promoter's own decisions."""
DECISIONS = ("promote", "defer", "skip", "override")
OPERATOR_DECISIONS = ("override", "skip")
"""What an operator may decide on a deferred proposal."""
RETRACT = "retract"
"""The decision a retraction (RuleRetracted) is kept as in a rule's history."""
DEFAULT_RULES = 5
"""Rules a context shows unless the manifest's ``context.memory.max_rules`` says otherwise."""
DEFAULT_NS = "default"
"""The namespace of a rule, proposal or query that names none (and of every older journal's)."""
_SEEN = "\x1f"
"""Joins a namespace and an input event id in :attr:`Rulebook.seen` (no id holds a control)."""


def qualified(ns: str, rule: str) -> str:
    """Return how a rule is named outside its namespace: ``rule``, or ``ns/rule``."""
    return rule if ns == DEFAULT_NS else f"{ns}/{rule}"


class RuleVersion(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """One version of a rule, with its provenance and the decision that created it."""

    rule: str
    version: int
    title: str
    content: str
    labels: list[str]
    source: RuleSource
    hash: str
    proposal: int
    decided: int
    actor: str
    ns: str = DEFAULT_NS

    @property
    def cite(self) -> str:
        """How an explanation cites this version: ``[rule:id@vN]`` (``[rule:ns/id@vN]``)."""
        return f"[rule:{self.ref}]"

    @property
    def ref(self) -> str:
        """``id@vN`` (``ns/id@vN`` outside the default namespace), as ContextCompiled records."""
        return f"{qualified(self.ns, self.rule)}@v{self.version}"


class RuleDecision(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """One audit record: who decided what on which proposal, why, and the versions."""

    seq: int
    proposal: int
    decision: str
    actor: str
    reason: str
    detail: str
    prior_version: int
    version: int


class RuleItem(msgspec.Struct, kw_only=True):
    """A rule's whole history: every version and every decision about it."""

    versions: list[RuleVersion] = []
    decisions: list[RuleDecision] = []

    @property
    def current(self) -> RuleVersion | None:
        """The version agents see now (None while none was promoted, or once retracted)."""
        return self.versions[-1] if self.versions and not self.retracted else None

    @property
    def latest(self) -> int:
        """The last version number given (retracted or not): the next proposal's base."""
        return self.versions[-1].version if self.versions else 0

    @property
    def retracted(self) -> bool:
        """Whether an operator retracted the rule after its last version was put in force."""
        since = self.versions[-1].decided if self.versions else 0
        return any(d.decision == RETRACT and d.seq > since for d in self.decisions)

    @property
    def pinned(self) -> bool:
        """Whether an operator's override set the current version."""
        return any(
            d.decision == "override" and d.version == len(self.versions) for d in self.decisions
        )


class Rulebook(msgspec.Struct, kw_only=True):
    """The rulebook projection: plain data, stored as is in snapshots.

    ``items`` holds the rules of the default namespace, ``spaces`` those of every other
    (namespace -> rule id -> item); ``pending`` holds deferred proposals by seq;
    ``shown`` the rules each open flow's latest context showed (``id@vN``), what
    citations are checked against; ``seen`` the input events proposals named, per
    namespace (the promoter's deduplication). ``spaces`` and ``seen`` are left out of
    the digest while empty (kernel.state.memory), as journals before them hashed it.
    """

    items: dict[str, RuleItem] = {}
    pending: dict[int, RuleProposed] = {}
    shown: dict[str, list[str]] = {}
    spaces: dict[str, dict[str, RuleItem]] = {}
    seen: dict[str, int] = {}

    def copy(self) -> Rulebook:
        """Return a copy that later folds do not change."""
        return Rulebook(
            items=_copied(self.items),
            pending=dict(self.pending),
            shown={dfid: list(refs) for dfid, refs in self.shown.items()},
            spaces={ns: _copied(items) for ns, items in self.spaces.items()},
            seen=dict(self.seen),
        )

    def space(self, ns: str = DEFAULT_NS) -> dict[str, RuleItem]:
        """The rules of namespace ``ns`` by id (an empty mapping for an unknown namespace)."""
        return self.items if ns == DEFAULT_NS else self.spaces.get(ns, {})

    def item(self, rule: str, ns: str = DEFAULT_NS) -> RuleItem | None:
        """Rule ``rule`` of namespace ``ns``, or None."""
        return self.space(ns).get(rule)

    def namespaces(self) -> list[str]:
        """Every namespace that holds a rule, sorted (``default`` among them if it does)."""
        names = set(self.spaces)
        if self.items:
            names.add(DEFAULT_NS)
        return sorted(names)

    def resolve(self, name: str) -> tuple[str, str]:
        """Return (namespace, rule id) of a rule named as :func:`qualified` names it."""
        ns, sep, rule = name.partition("/")
        if sep and ns in self.spaces:
            return ns, rule
        return DEFAULT_NS, name

    def _writable(self, ns: str) -> dict[str, RuleItem]:
        return self.items if ns == DEFAULT_NS else self.spaces.setdefault(ns, {})

    def current(self, ns: str = DEFAULT_NS) -> list[RuleVersion]:
        """Every rule's current version in namespace ``ns``, by id."""
        return [v for _, i in sorted(self.space(ns).items()) if (v := i.current) is not None]

    def apply(self, event: Event) -> None:
        """Fold a RuleProposed, RuleDecided or RuleRetracted."""
        match event.payload:
            case RuleRetracted() as retracted:
                item = self._writable(retracted.ns).setdefault(retracted.rule, RuleItem())
                item.decisions.append(
                    RuleDecision(
                        seq=event.seq,
                        proposal=0,
                        decision=RETRACT,
                        actor=retracted.operator,
                        reason=retracted.reason,
                        detail="",
                        prior_version=retracted.version,
                        version=0,
                    )
                )
            case RuleProposed() as proposal:
                # Held until decided; the promoter decides in the same append.
                self.pending[event.seq] = proposal
                if proposal.input_event:
                    self.seen.setdefault(seen_key(proposal.ns, proposal.input_event), event.seq)
            case RuleDecided() as decided:
                self._decided(event.seq, event.caused_by or 0, decided)

    def _decided(self, seq: int, proposal_seq: int, decided: RuleDecided) -> None:
        item = self._writable(decided.ns).setdefault(decided.rule, RuleItem())
        item.decisions.append(
            RuleDecision(
                seq=seq,
                proposal=proposal_seq,
                decision=decided.decision,
                actor=decided.actor,
                reason=decided.reason,
                detail=decided.detail,
                prior_version=decided.prior_version,
                version=decided.version,
            )
        )
        proposal = self.pending.get(proposal_seq)
        if decided.decision != "defer":
            self.pending.pop(proposal_seq, None)
        if decided.decision in ("promote", "override") and proposal is not None:
            item.versions.append(
                RuleVersion(
                    rule=decided.rule,
                    version=decided.version,
                    title=proposal.title,
                    content=proposal.content,
                    labels=list(proposal.labels),
                    source=proposal.source,
                    hash=content_hash(proposal),
                    proposal=proposal_seq,
                    decided=seq,
                    actor=decided.actor,
                    ns=decided.ns,
                )
            )

    def context_shown(self, dfid: str, refs: Sequence[str]) -> None:
        """Note the rules a flow's latest context showed."""
        if refs:
            self.shown[dfid] = list(refs)
        else:
            self.shown.pop(dfid, None)


def _copied(items: dict[str, RuleItem]) -> dict[str, RuleItem]:
    return {
        rule: RuleItem(versions=list(i.versions), decisions=list(i.decisions))
        for rule, i in items.items()
    }


def seen_key(ns: str, input_event: str) -> str:
    """The key of an input event in :attr:`Rulebook.seen`."""
    return f"{ns}{_SEEN}{input_event}"


def content_hash(proposal: RuleProposed) -> str:
    """Return the hash of what a version says and where it comes from."""
    return digest(
        {
            "title": proposal.title,
            "content": proposal.content,
            "labels": sorted(proposal.labels),
            "source": proposal.source,
        }
    )


def promote(book: Rulebook, proposal: RuleProposed) -> RuleDecided:
    """Return the promoter's decision on ``proposal`` (a pure function; see the module doc)."""
    item = book.item(proposal.rule, proposal.ns)
    # After a retraction versions go on from the last one given: they never repeat.
    prior = item.latest if item is not None else 0
    decision, reason, detail = _promoter(book, item, prior, proposal)
    return RuleDecided(
        rule=proposal.rule,
        decision=decision,
        actor=PROMOTER,
        reason=reason,
        detail=detail,
        prior_version=prior,
        version=prior + 1 if decision == "promote" else 0,
        ns=proposal.ns,
    )


def _promoter(
    book: Rulebook, item: RuleItem | None, prior: int, proposal: RuleProposed
) -> tuple[str, str, str]:
    """Return the decision, the reason and the detail of the first promoter rule that applies."""
    duplicate = _duplicate(book, proposal)
    if duplicate is not None:
        return "skip", "DUPLICATE_INPUT", duplicate
    if _same(item, proposal):
        return "skip", "SAME_CONTENT", f"v{prior} already says this"
    if not _sourced(proposal.source):
        detail = "a rule names its repository, path and blob; an operator may override"
        return "defer", "NO_PROVENANCE", detail
    if proposal.base_version != prior:
        detail = f"proposed against v{proposal.base_version}, the rulebook is at v{prior}"
        return "defer", "STALE_BASE", detail
    if item is not None and item.pinned and not proposal.by_operator:
        return "defer", "OPERATOR_PINNED", f"v{prior} was set by an operator's override"
    return "promote", "NEW_VERSION" if prior else "NEW_RULE", ""


def _same(item: RuleItem | None, proposal: RuleProposed) -> bool:
    """Whether ``proposal`` says what the rule's current version says."""
    current = item.current if item is not None else None
    return current is not None and current.hash == content_hash(proposal)


def _duplicate(book: Rulebook, proposal: RuleProposed) -> str | None:
    """Why ``proposal`` repeats an input event its namespace saw, or None if it does not."""
    if not proposal.input_event:
        return None
    first = book.seen.get(seen_key(proposal.ns, proposal.input_event))
    if first is None:
        return None
    return f"input {proposal.input_event!r} was proposed before (#{first})"


def _sourced(source: RuleSource) -> bool:
    return bool(source.repo and source.path and source.blob)


# --- relevance ------------------------------------------------------------------

_TOKEN = re.compile(r"[a-z0-9]+")


def tokens(text: str) -> list[str]:
    """Lower-case alphanumeric tokens ("trading.place_order" -> trading, place, order)."""
    return _TOKEN.findall(text.lower())


class RuleSearch(Protocol):
    """The port relevance goes through: lexical by default, vector search if plugged in."""

    def search(self, rules: Sequence[RuleVersion], query: str, k: int) -> list[str]:
        """Return the ids of at most ``k`` rules relevant to ``query``, best first.

        Must be deterministic: the same rules and query give the same answer.
        """
        ...


class LexicalSearch:
    """BM25 over title, content and labels; ties broken by rule id; no match, no rule."""

    def __init__(self, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1 = k1
        self.b = b

    def search(self, rules: Sequence[RuleVersion], query: str, k: int) -> list[str]:
        """Return the ids of the ``k`` best-scoring rules (score above zero), best first."""
        terms = set(tokens(query))
        if not rules or not terms or k <= 0:
            return []
        docs = [(r.rule, Counter(tokens(" ".join([r.title, r.content, *r.labels])))) for r in rules]
        return [rule for _, rule in sorted(self._scored(docs, terms))[:k]]

    def _scored(
        self, docs: list[tuple[str, Counter[str]]], terms: set[str]
    ) -> list[tuple[float, str]]:
        """Return (minus the score, rule id) of each document that scores above zero."""
        average = sum(sum(d.values()) for _, d in docs) / len(docs) or 1.0
        frequency = Counter(t for _, d in docs for t in d if t in terms)
        scored: list[tuple[float, str]] = []
        for rule, doc in docs:
            score = self._score(doc, terms, frequency, len(docs), average)
            if score > 0:
                scored.append((-score, rule))
        return scored

    def _score(
        self,
        doc: Counter[str],
        terms: set[str],
        frequency: Counter[str],
        count: int,
        average: float,
    ) -> float:
        """Return the BM25 score of one document for ``terms`` among ``count`` documents."""
        length = sum(doc.values())
        score = 0.0
        for term in terms & doc.keys():
            idf = math.log(1 + (count - frequency[term] + 0.5) / (frequency[term] + 0.5))
            tf = doc[term]
            score += (
                idf * tf * (self.k1 + 1) / (tf + self.k1 * (1 - self.b + self.b * length / average))
            )
        return score


def select(
    book: Rulebook,
    query: str,
    k: int = DEFAULT_RULES,
    search: RuleSearch | None = None,
    ns: str = DEFAULT_NS,
) -> list[RuleVersion]:
    """Return the current versions of namespace ``ns``'s rules relevant to ``query``, best first."""
    current = book.current(ns)
    if not current:
        return []
    by_id = {r.rule: r for r in current}
    ids = (search or LexicalSearch()).search(current, query, k)
    return [by_id[i] for i in ids if i in by_id][:k]


def shown_item(version: RuleVersion) -> dict[str, Any]:
    """A rule as the memory layer of a context shows it (``ns`` outside the default one)."""
    item: dict[str, Any] = {
        "id": version.rule,
        "version": version.version,
        "cite": version.cite,
        "title": version.title,
        "content": version.content,
        "labels": version.labels,
    }
    if version.ns != DEFAULT_NS:
        item["ns"] = version.ns
    return item


# --- deciding ---------------------------------------------------------------------
# Pure functions of the rulebook: its owner (the DIM actor, kernel.dim) stages what they
# return, one message at a time, so no two decisions ever read the same prior version.


class RuleNotInForce(Exception):
    """A retraction of a rule that is not in force (never promoted, or retracted already)."""

    code = "UNKNOWN_RULE"


class RuleNotPending(Exception):
    """An operator decision on a proposal that is not waiting for one."""

    code = "RULE_NOT_PENDING"


def override(
    book: Rulebook,
    proposal: RuleProposed,
    *,
    operator: str,
    reason: str,
    inbox_id: int | None = None,
) -> RuleDecided:
    """Return an operator's override putting ``proposal`` in force at once (audited).

    Raises:
        ValueError: no operator or no reason.
    """
    if not operator or not reason:
        raise ValueError("an operator's override names the operator and a reason")
    return _by_operator(book, proposal, "override", operator, reason, inbox_id)


def retraction(
    book: Rulebook,
    rule: str,
    *,
    operator: str,
    reason: str,
    inbox_id: int | None = None,
    ns: str = DEFAULT_NS,
) -> RuleRetracted:
    """Return an operator's retraction of rule ``rule`` of namespace ``ns`` (history kept).

    Raises:
        RuleNotInForce: no version of the rule is in force in that namespace.
        ValueError: no operator or no reason.
    """
    if not operator or not reason:
        raise ValueError("a retraction names the operator and a reason")
    item = book.item(rule, ns)
    current = item.current if item is not None else None
    if current is None:
        where = "" if ns == DEFAULT_NS else f" in namespace {ns!r}"
        raise RuleNotInForce(f"no rule {rule!r} in force{where}")
    return RuleRetracted(
        rule=rule,
        operator=operator,
        reason=reason,
        version=current.version,
        inbox_id=inbox_id,
        ns=ns,
    )


def operator_decision(
    book: Rulebook,
    proposal_seq: int,
    decision: str,
    *,
    operator: str,
    reason: str,
    inbox_id: int | None = None,
) -> RuleDecided:
    """Return an operator's override or skip of the deferred proposal ``proposal_seq``.

    Raises:
        RuleNotPending: the proposal is not deferred (decided, or no such proposal).
        ValueError: the decision is not override or skip, or no operator or reason is given.
    """
    if decision not in OPERATOR_DECISIONS:
        raise ValueError(f"an operator decides {' or '.join(OPERATOR_DECISIONS)}")
    if not operator or not reason:
        raise ValueError("an operator's decision names the operator and a reason")
    proposal = book.pending.get(proposal_seq)
    if proposal is None:
        raise RuleNotPending(f"no deferred rule proposal #{proposal_seq}")
    return _by_operator(book, proposal, decision, operator, reason, inbox_id)


def _by_operator(
    book: Rulebook,
    proposal: RuleProposed,
    decision: str,
    operator: str,
    reason: str,
    inbox_id: int | None = None,
) -> RuleDecided:
    item = book.item(proposal.rule, proposal.ns)
    # After a retraction versions go on from the last one given: they never repeat.
    prior = item.latest if item is not None else 0
    return RuleDecided(
        rule=proposal.rule,
        decision=decision,
        actor=operator,
        reason=reason,
        prior_version=prior,
        version=prior + 1 if decision == "override" else 0,
        inbox_id=inbox_id,
        ns=proposal.ns,
    )


def history(events: Iterable[Event]) -> Rulebook:
    """Fold a rulebook from rule events alone (what ``dirk why`` reads)."""
    book = Rulebook()
    for event in events:
        book.apply(event)
    return book
