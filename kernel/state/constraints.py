"""The DIM's memory layer: constraint texts, what they forbid or require, and their conflicts.

Constraint texts are parsed, not interpreted by a model:

- prohibitions: ``never X``, ``do not X``, ``don't X``, ``avoid X``. A proposal whose
  explanation or parameters contain X is refused with CONSTRAINT_VIOLATION. A leading
  ``use``/``using``/``call`` is not part of X, so "never use eval()" forbids ``eval()``.
- procedures: ``verify X before Y``. A proposal that mentions Y (in its kind,
  explanation or parameters) is refused with VERIFICATION_REQUIRED unless its agent,
  or its flow's tree, queried memory about X before.
- requirements: ``always X``, ``must X``. Shown to agents and weighed against the other
  constraints (a requirement and a prohibition of one thing conflict); no single
  proposal can show that it did not do X, so the gate never refuses on one.

How a constraint's phrases are matched is recorded with it (``ConstraintAdded.matcher``):

- ``meaning/1`` (every constraint this kernel adds): by meaning, deterministically
  (:mod:`kernel.state.meaning`): normalised and stemmed words, the synonyms of the packs
  in force when it was added, its scope (``kinds``: only proposals of these kinds are
  governed, and a procedure's action is any proposal of them; ``params``: only these
  parameters are read), and, when the kernel has an embedding matcher, the recorded
  score of the proposal's text (``MeaningScored``).
- empty (constraints recorded before meaning): X and Y as whole words, case-insensitive,
  exactly as those kernels matched, so an older journal's verdicts re-judge the same.

Constraint management (adding or retiring a constraint) is exempt from both: its text
talks about behaviour rather than performing it. Queries are exempt from procedures (a
query is the verification). Priorities ``required`` and ``learned`` are enforced;
``preferred`` is advisory (:func:`advisories`).

**Conflicts.** A new constraint is judged against the active ones (:func:`conflict`):
one requiring (``always X``, or verifying X) what another prohibits, in overlapping
scopes, or the same constraint at another priority, is refused with
CONSTRAINT_CONFLICT naming both; a pack may send that refusal to a human instead
(``PolicyPack.escalate_refusals``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any, Protocol

import msgspec

from kernel.core.events import Feedback, ProposalRecord
from kernel.core.reasons import ReasonCode
from kernel.state.meaning import (
    MATCHER,
    MICRO,
    kind_words,
    overlapping,
    phrase_in,
    text_hash,
    words,
)

ENFORCED = frozenset({"required", "learned"})
PRIORITIES = ("required", "learned", "preferred")
QUERY_KIND = "memory.query"
ADD_CONSTRAINT = "memory.add_constraint"
CONSTRAINT_KINDS = frozenset({ADD_CONSTRAINT, "memory.deactivate_constraint"})
"""Kinds that talk about behaviour rather than perform it: constraints do not apply to them
(else "never use eval()" could not be restated as learned, nor any constraint be retired)."""

_PROHIBITION = re.compile(
    r"^\s*(?:never|do\s+not|don't|avoid)\s+(?:(?:use|using|call)\s+)?(.+?)\s*\.?\s*$", re.I
)
_PROCEDURE = re.compile(r"^\s*verify\s+(.+?)\s+before\s+(.+?)\s*\.?\s*$", re.I)
_REQUIREMENT = re.compile(r"^\s*(?:always|must)\s+(.+?)\s*\.?\s*$", re.I)
FORMS = "'never/do not/avoid X', 'verify X before Y' or 'always/must X'"


@lru_cache(maxsize=4096)
def parse(text: str) -> tuple[str, str, str] | None:
    """Return ("never", X, ""), ("verify", X, Y) or ("always", X, "") for a text, else None."""
    if match := _PROCEDURE.match(text):
        return "verify", match[1].strip(), match[2].strip()
    if match := _PROHIBITION.match(text):
        return "never", match[1].strip(), ""
    if match := _REQUIREMENT.match(text):
        return "always", match[1].strip(), ""
    return None


@lru_cache(maxsize=4096)
def _word(term: str) -> re.Pattern[str]:
    # \b would not match after "eval()": a word boundary needs a word character on one
    # side. "Not preceded or followed by a word character" works for any term.
    return re.compile(r"(?<!\w)" + re.escape(term) + r"(?!\w)", re.I)


def mentions(text: str, term: str) -> bool:
    """Whether ``term`` occurs in ``text`` as a whole word ("cat" is not in "concatenate")."""
    return bool(term) and _word(term).search(text) is not None


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)
    elif value is not None:
        yield str(value)


def text_of(proposal: ProposalRecord) -> str:
    """Return what prohibitions are matched against: the explanation and every parameter."""
    return "\n".join((proposal.explain, *_strings(proposal.params)))


def about_of(proposal: ProposalRecord) -> str:
    """Return what a procedure's action is matched against: the kind, then :func:`text_of`."""
    return f"{proposal.kind}\n{text_of(proposal)}"


class ConstraintRecord(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """An active constraint; its id is the seq of its ConstraintAdded.

    ``matcher``, ``synonyms``, ``kinds`` and ``params`` are how it matches, as recorded
    (this module); left out of the digest while empty, as older kernels had none.
    """

    seq: int
    text: str
    priority: str
    triggered_by: int | None
    agent_id: str
    correlation_id: str
    matcher: str = ""
    synonyms: list[list[str]] = []
    kinds: list[str] = []
    params: list[str] = []
    tenant: str = ""
    """The tenant whose proposals it binds (empty: every tenant's)."""


class ScoreRecord(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """Embedding scores recorded for one text of a flow (``MeaningScored``)."""

    model: str
    version: str
    threshold: int
    scores: dict[str, int]


class MemoryState(Protocol):
    """What the memory layer reads of the memory projection (kernel.state.memory's).

    A protocol, not an import: the projection folds with this module's records and
    judges with its :func:`check`, so importing it back would make the two one module.
    """

    @property
    def constraints(self) -> Mapping[int, ConstraintRecord]:
        """The active constraints by id."""
        ...

    @property
    def queried(self) -> Mapping[str, Mapping[str, int]]:
        """The topics each agent id or root DFID queried (topic -> seq)."""
        ...

    @property
    def scores(self) -> Mapping[str, Mapping[str, ScoreRecord]]:
        """The embedding scores recorded for each open flow, by text hash."""
        ...


def by_priority(c: ConstraintRecord) -> tuple[int, int]:
    """Sort key: enforced before advisory, then oldest first."""
    return PRIORITIES.index(c.priority) if c.priority in PRIORITIES else 3, c.seq


# --- one constraint against one proposal ----------------------------------------------


class Seen:
    """A proposal as the memory layer reads it, and what it may count as verification."""

    def __init__(
        self,
        state: MemoryState,
        proposal: ProposalRecord,
        who: tuple[str, ...],
        dfid: str,
    ) -> None:
        self.proposal = proposal
        self.text = text_of(proposal)
        self.about = f"{proposal.kind}\n{self.text}"
        self.queried = [topic for name in who for topic in state.queried.get(name, {})]
        recorded = state.scores.get(dfid, {}).get(text_hash(self.about))
        self.scores = recorded

    def scoped_text(self, params: Sequence[str]) -> str:
        """The text a scoped constraint reads: only the parameters it names."""
        if not params:
            return self.text
        chosen = {k: v for k, v in self.proposal.params.items() if k in params}
        return "\n".join(_strings(chosen))

    def scored(self, seq: int) -> str | None:
        """How a recorded embedding score matched constraint ``seq``, or None if it did not."""
        record = self.scores
        if record is None:
            return None
        score = record.scores.get(str(seq))
        if score is None or score < record.threshold:
            return None
        return f"{record.model}@{record.version} scored {score / MICRO:.6f}"


def _literal(c: ConstraintRecord, parsed: tuple[str, str, str], seen: Seen) -> ReasonCode | None:
    """How a constraint recorded before meaning judged: whole words, as written."""
    form, subject, action = parsed
    if form == "never":
        return ReasonCode.CONSTRAINT_VIOLATION if mentions(seen.text, subject) else None
    if form != "verify" or seen.proposal.kind == QUERY_KIND:
        return None
    if mentions(seen.about, action) and not any(mentions(q, subject) for q in seen.queried):
        return ReasonCode.VERIFICATION_REQUIRED
    return None


def _matched(
    code: ReasonCode, phrase: str, text: str, c: ConstraintRecord, seen: Seen
) -> tuple[ReasonCode, str] | None:
    """``code`` if ``phrase`` occurs in ``text`` by meaning, or by a recorded score; else None."""
    if phrase_in(phrase, text, c.synonyms):
        return code, ""
    how = seen.scored(c.seq)
    return (code, how) if how else None


def _unverified(c: ConstraintRecord, subject: str, action: str, seen: Seen) -> bool:
    """Whether a procedure's action was not preceded by a query of its subject."""
    if seen.proposal.kind == QUERY_KIND:
        return False
    return not any(phrase_in(subject, topic, c.synonyms) for topic in seen.queried)


def _by_meaning(
    c: ConstraintRecord, parsed: tuple[str, str, str], seen: Seen
) -> tuple[ReasonCode, str] | None:
    """How a ``meaning/1`` constraint judges: its scope, stems, synonyms, recorded scores."""
    form, subject, action = parsed
    kind = seen.proposal.kind
    if c.kinds and kind not in c.kinds:
        return None
    if form == "never":
        text = seen.scoped_text(c.params)
        return _matched(ReasonCode.CONSTRAINT_VIOLATION, subject, text, c, seen)
    if form != "verify" or not _unverified(c, subject, action, seen):
        return None
    if c.kinds:  # a proposal of a governed kind is the action, whatever its words
        return ReasonCode.VERIFICATION_REQUIRED, ""
    about = f"{kind_words(kind)}\n{seen.scoped_text(c.params)}"
    return _matched(ReasonCode.VERIFICATION_REQUIRED, action, about, c, seen)


def broken(c: ConstraintRecord, seen: Seen) -> tuple[ReasonCode, str] | None:
    """Return how ``seen`` breaks constraint ``c`` (the code, and how an embedding matched)."""
    parsed = parse(c.text)
    if parsed is None:
        return None
    if c.matcher == MATCHER:
        return _by_meaning(c, parsed, seen)
    code = _literal(c, parsed, seen)
    return (code, "") if code is not None else None


def violations(
    state: MemoryState,
    proposal: ProposalRecord,
    agent_id: str,
    correlation_id: str,
    dfid: str = "",
) -> Iterator[tuple[ConstraintRecord, ReasonCode, str]]:
    """Yield each active constraint the proposal breaks, by priority then age, with how."""
    if proposal.kind in CONSTRAINT_KINDS or not state.constraints:
        return
    seen = Seen(state, proposal, (agent_id, correlation_id), dfid)
    for constraint in sorted(state.constraints.values(), key=by_priority):
        found = broken(constraint, seen)
        if found is not None:
            yield constraint, found[0], found[1]


# --- conflicts between constraints ----------------------------------------------------


class Wanted:
    """A constraint as conflicts read it: what it prohibits, requires, at which priority."""

    def __init__(self, text: str, priority: str, kinds: Sequence[str]) -> None:
        parsed = parse(text) or ("", "", "")
        self.form, self.subject, self.action = parsed
        self.priority = priority
        self.kinds = frozenset(kinds)

    @property
    def prohibits(self) -> str:
        return self.subject if self.form == "never" else ""

    @property
    def requires(self) -> str:
        return self.subject if self.form in ("always", "verify") else ""

    def overlaps(self, other: Wanted) -> bool:
        """Whether the two govern some kind in common (an unscoped one governs every kind)."""
        return not self.kinds or not other.kinds or bool(self.kinds & other.kinds)


def _equal(a: str, b: str, synonyms: Sequence[Sequence[str]]) -> bool:
    return phrase_in(a, b, synonyms) and phrase_in(b, a, synonyms)


def _same_thing(new: Wanted, old: Wanted, synonyms: Sequence[Sequence[str]]) -> bool:
    """Whether the two say the same (form, phrases) whatever their wording."""
    if new.form != old.form or not _equal(new.subject, old.subject, synonyms):
        return False
    return new.form != "verify" or _equal(new.action, old.action, synonyms)


def _why(new: Wanted, old: Wanted, synonyms: Sequence[Sequence[str]]) -> str | None:
    """Why ``new`` contradicts ``old``, or None if it does not."""
    if not new.overlaps(old):
        return None
    if new.prohibits and old.requires and overlapping(new.prohibits, old.requires, synonyms):
        return f"it prohibits {new.prohibits!r}, which #{{seq}} requires"
    if new.requires and old.prohibits and overlapping(new.requires, old.prohibits, synonyms):
        return f"it requires {new.requires!r}, which #{{seq}} prohibits"
    if new.priority != old.priority and _same_thing(new, old, synonyms):
        return f"#{{seq}} says the same at priority {old.priority}, this at {new.priority}"
    return None


def conflict(state: MemoryState, params: Mapping[str, Any]) -> str | None:
    """Return why a proposed constraint contradicts an active one (naming both), or None."""
    text = str(params.get("text", ""))
    kinds = params.get("kinds") or []
    new = Wanted(text, str(params.get("priority", "required")), kinds)
    for old_record in sorted(state.constraints.values(), key=by_priority):
        old = Wanted(old_record.text, old_record.priority, old_record.kinds)
        why = _why(new, old, old_record.synonyms)
        if why is not None:
            named = f"#{old_record.seq} {old_record.text!r} ({old_record.priority})"
            return f"{text!r} conflicts with {named}: " + why.format(seq=old_record.seq)
    return None


# --- the layer ------------------------------------------------------------------------


def _feedback(code: ReasonCode, detail: str, field: str = "") -> Feedback:
    return Feedback(reason_code=code, detail=detail, layer="memory", field=field)


def _unrecorded_cause(params: Mapping[str, Any], last_seq: int | None) -> Feedback | None:
    """Refuse a ``triggered_by`` that names no event the journal has recorded."""
    cause = params.get("triggered_by")
    if cause is None or last_seq is None:
        return None
    if isinstance(cause, bool) or not isinstance(cause, int) or not 1 <= cause <= last_seq:
        return _feedback(
            ReasonCode.SCHEMA_INVALID,
            f"triggered_by {cause!r} names no recorded event (the journal has 1..{last_seq})",
            "params.triggered_by",
        )
    return None


def _malformed_constraint(
    state: MemoryState, params: Mapping[str, Any], last_seq: int | None = None
) -> Feedback | None:
    text = str(params.get("text", ""))
    parsed = parse(text)
    if parsed is None:
        return _feedback(ReasonCode.SCHEMA_INVALID, f"{text!r} is none of {FORMS}", "params.text")
    if not all(words(phrase) for phrase in parsed if phrase):
        detail = f"{text!r} names nothing with a word to match"
        return _feedback(ReasonCode.SCHEMA_INVALID, detail, "params.text")
    if params.get("priority") == "learned" and not params.get("triggered_by"):
        return _feedback(
            ReasonCode.SCHEMA_INVALID,
            "a learned constraint names the event of the mistake in triggered_by",
            "params.triggered_by",
        )
    unrecorded = _unrecorded_cause(params, last_seq)
    if unrecorded is not None:
        return unrecorded
    clash = conflict(state, params)
    if clash is not None:
        return _feedback(ReasonCode.CONSTRAINT_CONFLICT, clash, "params.text")
    return None


def malformed(
    state: MemoryState, proposal: ProposalRecord, last_seq: int | None = None
) -> Feedback | None:
    """Refuse memory writes the memory could not enforce or link, or that contradict it.

    ``last_seq`` (the journal's last event folded) lets a learned constraint's
    ``triggered_by`` be checked against what was recorded; None leaves it unchecked.
    """
    params = proposal.params
    if proposal.kind == ADD_CONSTRAINT:
        return _malformed_constraint(state, params, last_seq)
    if proposal.kind == "memory.deactivate_constraint":
        if params.get("constraint") not in state.constraints:
            return _feedback(
                ReasonCode.SCHEMA_INVALID,
                f"no active constraint {params.get('constraint')!r}",
                "params.constraint",
            )
    return None


def check(
    state: MemoryState,
    proposal: ProposalRecord,
    agent_id: str,
    correlation_id: str,
    dfid: str = "",
    last_seq: int | None = None,
) -> Feedback | None:
    """Return the memory layer's refusal of ``proposal``, or None if no enforced constraint objects.

    Args:
        state: the memory projection at the time of the verdict.
        proposal: the proposal being judged.
        agent_id: who proposes (its queries count as verification).
        correlation_id: the root DFID of the proposal's flow (its tree's queries count too).
        dfid: the proposal's flow (the embedding scores recorded for it count).
        last_seq: the journal's last event folded (a ``triggered_by`` must name one).
    """
    refused = malformed(state, proposal, last_seq)
    if refused is not None:
        return refused
    for constraint, code, how in violations(state, proposal, agent_id, correlation_id, dfid):
        if constraint.priority in ENFORCED:
            what = "violates" if code is ReasonCode.CONSTRAINT_VIOLATION else "needs"
            detail = (
                f"{what} {constraint.priority} constraint #{constraint.seq}: {constraint.text!r}"
            )
            if how:
                detail += f" (matched by meaning: {how})"
            return _feedback(code, detail)
    return None


def advisories(
    state: MemoryState,
    proposal: ProposalRecord,
    agent_id: str,
    correlation_id: str,
    dfid: str = "",
) -> list[int]:
    """Return the ids of the preferred (advisory) constraints ``proposal`` breaks."""
    return [
        c.seq
        for c, _, _ in violations(state, proposal, agent_id, correlation_id, dfid)
        if c.priority not in ENFORCED
    ]


def _governs(c: ConstraintRecord, kind: str) -> bool:
    """Whether an enforced ``meaning/1`` constraint governs proposals of ``kind``."""
    enforced = c.matcher == MATCHER and c.priority in ENFORCED
    return enforced and (not c.kinds or kind in c.kinds)


def _to_score(c: ConstraintRecord, seen: Seen) -> str | None:
    """The phrase of ``c`` an embedding should score ``seen`` against, or None."""
    parsed = parse(c.text)
    if parsed is None or not _governs(c, seen.proposal.kind):
        return None
    form, subject, action = parsed
    if form == "never" and not phrase_in(subject, seen.scoped_text(c.params), c.synonyms):
        return subject
    about = f"{kind_words(seen.proposal.kind)}\n{seen.text}"
    if form == "verify" and not c.kinds and not phrase_in(action, about, c.synonyms):
        return action
    return None


def scorable(state: MemoryState, proposal: ProposalRecord) -> dict[int, str]:
    """Return the phrase to score per enforced ``meaning/1`` constraint the words did not match.

    What :class:`kernel.state.meaning.EmbeddingMatcher` scores before the verdict (kernel.api):
    a prohibition's X, a procedure's action Y (the proposal's kind and text against it).
    """
    if proposal.kind in CONSTRAINT_KINDS or not state.constraints:
        return {}
    seen = Seen(state, proposal, (), "")
    wanted = {c.seq: _to_score(c, seen) for c in state.constraints.values()}
    return {seq: phrase for seq, phrase in wanted.items() if phrase is not None}
